"""Workloads: a model architecture (a shipped preset or a user's TOML file) and a training run.

Parameter counts are derived from the architecture, never typed in; each preset states
the published total so that tests can hold the derivation to it (within 1%).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trnopt.optimizer import defaults
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model import bounds as B
from trnopt.optimizer.model import hfconfig
from trnopt.optimizer.model.inputfile import parse_json, read_text
from trnopt.optimizer.model.tomlcheck import Table, read_named

PRESETS = ("llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "mixtral-8x7b", "mixtral-8x22b",
           "deepseek-v3", "megatron-22b", "megatron-175b", "megatron-530b", "megatron-1t")


@dataclass(frozen=True)
class Moe:
    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int
    dense_layers: int  # the first layers use the dense FFN (DeepSeek-V3: 3)
    route_nodes: int = 0
    """Node-limited routing: each token goes to experts on at most this many nodes, crossing the
    scale-out network once per node and reaching its experts there over the scale-up links
    (DeepSeek-V3 report, section 2.1.2, M = 4, and section 3.2.2); 0: no limit."""
    routing_imbalance: float = defaults.MOE_ROUTING_IMBALANCE
    """Tokens the busiest expert receives over the mean (top_k x tokens / experts): the capacity
    factor of a token-dropping router (Fedus et al., "Switch Transformers", 2022, section 2.1:
    capacity = tokens / experts x capacity factor, 1.0-1.25 in its runs), or the measured
    max/mean load of a dropless one. The step waits for the busiest expert's GEMMs and the
    busiest receiver's all-to-all. Default 1.0: DeepSeek-V3's auxiliary-loss-free balancing
    keeps the expert load balanced and drops no token (DeepSeek-V3 report, sections 2.1.2
    and 3.2.2); a model file sets ``routing_imbalance`` under [moe]."""


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Model:
    name: str
    source: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    gated_mlp: bool
    tied_embeddings: bool
    learned_positions: int
    moe: Moe | None
    mla: Mla | None
    published_params: float  # the source's total, for tests and reports; 0 when not published
    published_active_params: float

    # -- parameter counts -------------------------------------------------------------
    def attention_params(self) -> int:
        """Per layer. Standard GQA: h*(a*d) + 2*h*(kv*d) + (a*d)*h. MLA (DeepSeek-V3 paper,
        section 2.1): q down/up, kv down/up (with the shared RoPE key), output, and the two
        latent norms."""
        h = self.hidden
        if self.mla is None:
            return 2 * h * self.heads * self.head_dim + 2 * h * self.kv_heads * self.head_dim
        m, a = self.mla, self.heads
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        return (h * m.q_lora_rank + m.q_lora_rank * a * qk
                + h * (m.kv_lora_rank + m.qk_rope_head_dim)
                + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
                + a * m.v_head_dim * h + m.q_lora_rank + m.kv_lora_rank)

    def mlp_params(self, ffn: int) -> int:
        """One FFN: 3*h*f with a gated unit (SwiGLU), 2*h*f without."""
        return (3 if self.gated_mlp else 2) * self.hidden * ffn

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else self.layers - self.moe.dense_layers

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def expert_params(self) -> int:
        """All routed experts of the model (the part expert parallelism shards)."""
        if self.moe is None:
            return 0
        return self.moe_layers * self.moe.experts * self.mlp_params(self.moe.expert_ffn)

    def embedding_params(self) -> int:
        """Input embedding, output head (unless tied), learned positions, final norm."""
        h = self.hidden
        return self.vocab * h * (1 if self.tied_embeddings else 2) + self.learned_positions * h + h

    def _layer_params(self, experts_counted: int) -> int:
        h, total = self.hidden, 0
        total += self.layers * (self.attention_params() + 2 * h)
        total += self.dense_layers * self.mlp_params(self.ffn)
        if self.moe is not None:
            per_expert = self.mlp_params(self.moe.expert_ffn)
            total += self.moe_layers * ((experts_counted + self.moe.shared_experts) * per_expert
                                        + h * self.moe.experts)
        return total

    def param_breakdown(self, active: bool = False) -> dict[str, int]:
        """Parameters by part; the values sum to ``total_params()`` (or ``active_params()``).

        attention: every layer's attention projections (MLA: with its latent norms);
        norms: two per layer (pre-attention, pre-FFN); dense_ffn: the dense FFNs;
        routed_experts: all routed experts (only the top-k with ``active``);
        shared_experts, routers: the MoE layers' shared experts and gating matrices;
        embeddings: input embedding, output head unless tied, learned positions, final norm.
        """
        h, moe = self.hidden, self.moe
        routed = shared = routers = 0
        if moe is not None:
            per_expert = self.mlp_params(moe.expert_ffn)
            routed = self.moe_layers * (moe.top_k if active else moe.experts) * per_expert
            shared = self.moe_layers * moe.shared_experts * per_expert
            routers = self.moe_layers * h * moe.experts
        return {
            "attention": self.layers * self.attention_params(),
            "norms": self.layers * 2 * h,
            "dense_ffn": self.dense_layers * self.mlp_params(self.ffn),
            "routed_experts": routed,
            "shared_experts": shared,
            "routers": routers,
            "embeddings": self.embedding_params(),
        }

    def total_params(self) -> int:
        """Every weight: layers (attention, norms, dense FFNs, all experts, routers) + embeddings."""
        return self._layer_params(self.moe.experts if self.moe else 0) + self.embedding_params()

    def active_params(self) -> int:
        """Weights a token passes through: the top-k routed experts instead of all of them."""
        return self._layer_params(self.moe.top_k if self.moe else 0) + self.embedding_params()

    def attention_flops_per_token(self, seq: int) -> float:
        """Forward FLOPs of scores and weighted values per token per layer: 2*s*a*d_qk + 2*s*a*d_v.

        Counted without the causal mask's saving, as Narayanan et al. (2021) and Korthikanti
        et al. (2022) count them, so MFU figures compare with theirs.
        """
        if self.mla is None:
            d_qk = d_v = self.head_dim
        else:
            d_qk = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
            d_v = self.mla.v_head_dim
        return 2.0 * seq * self.heads * (d_qk + d_v)

    @property
    def ffn_width_per_token(self) -> int:
        """FFN width a token's activations pass through: the dense FFN, or top-k + shared experts."""
        if self.moe is None:
            return self.ffn
        return (self.moe.top_k + self.moe.shared_experts) * self.moe.expert_ffn


@dataclass(frozen=True)
class Training:
    """One training run: sequence length, global batch in sequences, and bytes per parameter.

    Defaults: mixed precision (Micikevicius et al. 2018), BF16 weights and gradients with an FP32 master
    copy and Adam's two FP32 moments, 2 + 2 + 4 + 8 = 16 bytes per parameter.
    """

    seq: int = 8192
    global_batch: int = 1024
    weight_bytes: int = 2
    grad_bytes: int = 2
    master_bytes: int = 4
    optimizer_bytes: int = 8
    activation_bytes: int = 2
    flash_attention: bool = True
    """Attention scores stay on chip (FlashAttention; the NKI and TorchNeuron default)."""
    sequence_parallel: bool = True
    """TP with sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2; NxD's and torchtitan's
    default): norms, dropouts and residuals run on s/tp tokens per rank and their activations are
    sharded. Off, every TP rank runs them on all s tokens and keeps them whole; the TP collectives
    become all-reduces of the same bytes."""
    fp8_gemms: bool = False
    """The linear layers' GEMMs (forward, input and weight gradients) run in FP8 at the chip's
    achievable FP8 rate (DeepSeek-V3 report sec. 3.3); attention and the LM head stay BF16."""

    def __post_init__(self):
        for name, top in (("seq", B.MAX_SEQ), ("global_batch", B.MAX_GLOBAL_BATCH)):
            value = getattr(self, name)
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(flag, name, f"must be an integer, got {value!r}")
            if value < 1:
                raise InputError(flag, name, f"must be >= 1, got {value}")
            if value > top:
                raise InputError(flag, name, f"must be <= {top:,}, got {value:,}")

    PRECISIONS = {"bf16": (2, 2, 4, 8), "bf16-sr": (2, 2, 0, 4)}
    """Bytes per parameter of (weights, gradients, master copy, Adam moments): BF16 with an FP32
    master and moments (mixed precision, Micikevicius et al. 2018), or everything in BF16 with
    stochastic rounding (the NeuronX "bf16-sr" runs: XLA_USE_BF16=1, no master copy)."""

    def with_precision(self, precision: str) -> "Training":
        w, g, m, o = self.PRECISIONS[precision]
        return replace(self, weight_bytes=w, grad_bytes=g, master_bytes=m, optimizer_bytes=o)

    @property
    def state_bytes_per_param(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.master_bytes + self.optimizer_bytes

    @property
    def tokens(self) -> int:
        return self.seq * self.global_batch


@dataclass(frozen=True)
class Workload:
    model: Model
    training: Training

    def with_training(self, **changes) -> "Workload":
        return replace(self, training=replace(self.training, **changes))


def load_model(name_or_path: str) -> Model:
    """A shipped preset by name, a user's TOML file, a Hugging Face config.json (or the checkpoint
    folder holding it), or the JSON ``trnopt models show NAME --json`` writes."""
    path = name_or_path
    if isinstance(path, str) and path not in PRESETS and Path(path).is_dir() and (Path(path) / "config.json").exists():
        path = str(Path(path) / "config.json")
    if isinstance(path, str) and path not in PRESETS and Path(path).suffix == ".json":
        data = parse_json(path, read_text(path, "--model", kind="JSON file"))
        if hfconfig.is_hf_config(data):
            try:
                return parse_model(hfconfig.model_fields(data, path), path)
            except InputError as exc:  # a rule of trnopt's model, named by the HF key it came from
                if exc.source != path or exc.key == "-" or exc.key in data:
                    raise
                raise InputError(path, hfconfig.hf_key(exc.key, data), exc.rule) from None
        return parse_model(_without_derived(data, path), path)
    return parse_model(*read_named(name_or_path, PRESETS, "models", "--model", "model preset", "presets are"))


DERIVED = ("total_params", "active_params", "params_by_part", "active_params_by_part")
"""Keys ``models show --json`` adds to the model's fields: counted from them, so checked on load."""


def _without_derived(data: Any, path: str) -> Any:
    """A model JSON without its derived counts (each must equal the count of the fields) and
    without null ``moe`` / ``mla`` (JSON's way of saying the model has none)."""
    if not isinstance(data, dict):
        return data
    fields = {k: v for k, v in data.items() if k not in DERIVED and not (k in ("moe", "mla") and v is None)}
    model = parse_model(fields, path)
    counted = {"total_params": model.total_params(), "active_params": model.active_params(),
               "params_by_part": model.param_breakdown(), "active_params_by_part": model.param_breakdown(active=True)}
    for key in DERIVED:
        if key in data and data[key] != counted[key]:
            raise InputError(path, key, f"{data[key]!r} is not what the fields give ({counted[key]!r}); "
                             "remove it or fix the fields"[:300])
    return fields


def model_fields(model: Model) -> dict[str, Any]:
    """The model as the keys of a model file (what ``parse_model`` reads back into an equal Model)."""
    m = model
    out: dict[str, Any] = {
        "name": m.name, "source": m.source, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
        "kv_heads": m.kv_heads, "head_dim": m.head_dim, "ffn": m.ffn, "vocab": m.vocab, "gated_mlp": m.gated_mlp,
        "tied_embeddings": m.tied_embeddings, "learned_positions": m.learned_positions,
        "published_params_b": m.published_params / 1e9, "published_active_params_b": m.published_active_params / 1e9,
    }
    if m.moe is not None:
        out["moe"] = {"experts": m.moe.experts, "top_k": m.moe.top_k, "expert_ffn": m.moe.expert_ffn,
                      "shared_experts": m.moe.shared_experts, "dense_layers": m.moe.dense_layers,
                      "route_nodes": m.moe.route_nodes, "routing_imbalance": m.moe.routing_imbalance}
    if m.mla is not None:
        out["mla"] = {"q_lora_rank": m.mla.q_lora_rank, "kv_lora_rank": m.mla.kv_lora_rank,
                      "qk_nope_head_dim": m.mla.qk_nope_head_dim, "qk_rope_head_dim": m.mla.qk_rope_head_dim,
                      "v_head_dim": m.mla.v_head_dim}
    return out


def parse_model(data: dict, source: str) -> Model:
    """Validate a parsed model file; every broken rule names the file and the key.

    Required: name, layers, hidden, heads, vocab, and ffn unless every layer is MoE.
    ``source`` (the citation) and ``published_params_b`` (the published total, in
    billions; 0 = not published) are optional for a user's file; every preset states both.
    Unknown keys are errors; every count is held to its range in bounds.py.
    """
    t = Table(data, source)
    width = {"maximum": B.MAX_WIDTH}
    hidden, heads = t.int("hidden", **width), t.int("heads", maximum=B.MAX_HEADS)
    kv_heads = t.int("kv_heads", heads, maximum=B.MAX_HEADS)
    if heads % kv_heads:
        raise t.fail("kv_heads", f"{kv_heads} does not divide heads={heads}")
    if "head_dim" not in data and hidden % heads:
        raise t.fail("heads", f"{heads} does not divide hidden={hidden}; give head_dim")
    layers = t.int("layers", maximum=B.MAX_LAYERS)
    moe = mla = None
    if t.has("moe"):
        m = t.table("moe")
        moe = Moe(m.int("experts", maximum=B.MAX_EXPERTS), m.int("top_k", maximum=B.MAX_EXPERTS),
                  m.int("expert_ffn", **width), m.int("shared_experts", 0, minimum=0, maximum=B.MAX_EXPERTS),
                  m.int("dense_layers", 0, minimum=0, maximum=B.MAX_LAYERS),
                  m.int("route_nodes", 0, minimum=0, maximum=B.MAX_EXPERTS),
                  m.number("routing_imbalance", defaults.MOE_ROUTING_IMBALANCE, bounds=(1.0, 64.0)))
        if moe.top_k > moe.experts:
            raise m.fail("top_k", f"{moe.top_k} exceeds experts={moe.experts}")
        if moe.dense_layers >= layers:
            raise m.fail("dense_layers", f"{moe.dense_layers} leaves no MoE layer of {layers}")
    if t.has("mla"):
        m = t.table("mla")
        mla = Mla(*(m.int(k, **width) for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                "qk_rope_head_dim", "v_head_dim")))
    needs_dense = moe is None or moe.dense_layers > 0
    published = t.number("published_params_b", 0, positive=False, bounds=(0.0, 1e9))
    model = Model(
        name=t.str("name", nonempty=True),
        source=t.str("source", "not stated"),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=t.int("head_dim", hidden // heads, **width),
        ffn=t.int("ffn", **width) if needs_dense else t.int("ffn", 0, minimum=0, **width),
        vocab=t.int("vocab", maximum=B.MAX_VOCAB),
        gated_mlp=t.bool("gated_mlp", True),
        tied_embeddings=t.bool("tied_embeddings", False),
        learned_positions=t.int("learned_positions", 0, minimum=0, maximum=B.MAX_SEQ),
        moe=moe,
        mla=mla,
        published_params=published * 1e9,
        published_active_params=t.number("published_active_params_b", published, positive=False,
                                         bounds=(0.0, 1e9)) * 1e9,
    )
    if 0 < model.published_params < model.published_active_params:
        raise t.fail("published_active_params_b", f"{model.published_active_params / 1e9:g} exceeds "
                     f"published_params_b={published:g}")
    t.check_unknown()
    return model
