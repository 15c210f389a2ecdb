"""A Hugging Face ``config.json`` (what every checkpoint ships with) as the fields of trnopt's model.

Keys are those of the ``transformers`` configuration classes of each family
(``LlamaConfig``, ``Qwen2Config``, ``Qwen3Config``, ``Qwen2MoeConfig``, ``Qwen3MoeConfig``,
``MixtralConfig``, ``DeepseekV3Config``), selected by ``model_type``:

- every family: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
  ``num_key_value_heads`` (default: the heads), ``head_dim`` (default hidden / heads),
  ``intermediate_size`` (the dense FFN), ``vocab_size``, ``tie_word_embeddings``
  (default false);
- Mixtral: ``num_local_experts`` and ``num_experts_per_tok``; every layer is MoE and its experts
  are ``intermediate_size`` wide;
- Qwen MoE: ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
  ``shared_expert_intermediate_size`` (Qwen2-MoE: one shared expert that wide, counted as that
  many routed-expert widths), ``decoder_sparse_step`` (1: every layer MoE) and
  ``mlp_only_layers`` (empty);
- DeepSeek-V3 (and V2): ``n_routed_experts``, ``n_shared_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``first_k_dense_replace`` (the first dense layers),
  ``moe_layer_freq`` (1), ``topk_group`` (the expert groups a token may reach, with ``n_group`` >
  1: DeepSeek-V3's node-limited routing, its 8 groups the 8 nodes of its EP 64, report section
  2.1.2) as route_nodes, and MLA's ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``.

Other keys (RoPE, norms' epsilon, dtype, token ids, routing constants) do not change the
parameter count or the layout and are not read. Not counted, as trnopt's presets do not count
them: attention biases (Qwen2), per-head q/k norms (Qwen3), the shared-expert gate (Qwen2-MoE),
the multi-token-prediction module (DeepSeek-V3's ``num_nextn_predict_layers``). Every broken rule
is ``InputError(file, HF key, rule)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trnopt.optimizer.errors import InputError

FAMILIES = {  # model_type -> how its MoE is written
    "llama": None, "qwen2": None, "qwen3": None, "mistral": None,
    "mixtral": "mixtral", "qwen2_moe": "qwen_moe", "qwen3_moe": "qwen_moe",
    "deepseek_v3": "deepseek", "deepseek_v2": "deepseek",
}


class HfKeys:
    """A config.json's keys, each look-up failing with the file and the HF key."""

    def __init__(self, data: dict[str, Any], path: str):
        self.data, self.path = data, path

    def fail(self, key: str, rule: str) -> InputError:
        return InputError(self.path, key, rule)

    def int(self, key: str, default: Any = None, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise self.fail(key, "missing; a Hugging Face config of this family gives it")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {value!r}"[:120])
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}"[:120])
        return value


def model_name(path: str) -> str:
    """The checkpoint's folder name for a file called config.json (Meta-Llama-3.1-8B/config.json),
    else the file's stem."""
    p = Path(path)
    return p.parent.name if p.name == "config.json" and p.parent.name not in ("", ".") else p.stem


def _moe(k: HfKeys, style: str, layers: int) -> dict[str, int]:
    if style == "mixtral":
        return {"experts": k.int("num_local_experts"), "top_k": k.int("num_experts_per_tok"),
                "expert_ffn": k.int("intermediate_size"), "shared_experts": 0, "dense_layers": 0}
    if style == "qwen_moe":
        if k.int("decoder_sparse_step", 1) != 1:
            raise k.fail("decoder_sparse_step", "only 1 (every layer MoE) is modelled")
        if k.data.get("mlp_only_layers") not in (None, []):
            raise k.fail("mlp_only_layers", "dense layers between MoE layers are not modelled; give []")
        width = k.int("moe_intermediate_size")
        shared = k.int("shared_expert_intermediate_size", 0, minimum=0)
        if shared % width:
            raise k.fail("shared_expert_intermediate_size", f"{shared} is not a multiple of "
                         f"moe_intermediate_size={width}; trnopt counts shared experts in expert widths")
        return {"experts": k.int("num_experts"), "top_k": k.int("num_experts_per_tok"), "expert_ffn": width,
                "shared_experts": shared // width, "dense_layers": 0}
    if k.int("moe_layer_freq", 1) != 1:
        raise k.fail("moe_layer_freq", "only 1 (every layer after the first dense ones MoE) is modelled")
    dense = k.int("first_k_dense_replace", 0, minimum=0)
    if dense >= layers:
        raise k.fail("first_k_dense_replace", f"{dense} leaves no MoE layer of num_hidden_layers={layers}")
    return {"experts": k.int("n_routed_experts"), "top_k": k.int("num_experts_per_tok"),
            "expert_ffn": k.int("moe_intermediate_size"), "shared_experts": k.int("n_shared_experts", 0, minimum=0),
            "dense_layers": dense,
            "route_nodes": k.int("topk_group", 0, minimum=0) if k.int("n_group", 1, minimum=1) > 1 else 0}


def model_fields(data: Any, path: str) -> dict[str, Any]:
    """The fields of trnopt's model file (what ``workload.parse_model`` reads) from a parsed config.json."""
    if not isinstance(data, dict):
        raise InputError(path, "-", "must be a JSON object (a Hugging Face config.json)")
    kind = data.get("model_type")
    if kind not in FAMILIES:
        raise InputError(path, "model_type", f"{kind!r} is not a family trnopt reads; it reads "
                         f"{', '.join(sorted(FAMILIES))}"[:300])
    k = HfKeys(data, path)
    layers, hidden, heads = k.int("num_hidden_layers"), k.int("hidden_size"), k.int("num_attention_heads")
    kv_heads = k.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise k.fail("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    head_dim = data.get("head_dim")
    if head_dim is None and hidden % heads:
        raise k.fail("num_attention_heads", f"{heads} does not divide hidden_size={hidden}; give head_dim")
    fields: dict[str, Any] = {
        "name": model_name(path), "source": f"Hugging Face config.json ({kind}): {path}"[:1000],
        "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
        "head_dim": k.int("head_dim") if head_dim is not None else hidden // heads,
        "vocab": k.int("vocab_size"), "tied_embeddings": k.bool("tie_word_embeddings", False),
    }
    style = FAMILIES[kind]
    if style is not None:
        fields["moe"] = _moe(k, style, layers)
    if style != "mixtral" and (style is None or fields["moe"]["dense_layers"] > 0):
        fields["ffn"] = k.int("intermediate_size")
    if style == "deepseek":
        fields["mla"] = {name: k.int(name) for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                        "qk_rope_head_dim", "v_head_dim")}
    return fields


def hf_key(key: str, data: dict[str, Any]) -> str:
    """The config.json key a field of trnopt's model (dotted: ``moe.experts``) came from."""
    style = FAMILIES.get(data.get("model_type"))
    moe = {"mixtral": {"experts": "num_local_experts", "expert_ffn": "intermediate_size"},
           "qwen_moe": {"experts": "num_experts", "expert_ffn": "moe_intermediate_size",
                        "shared_experts": "shared_expert_intermediate_size"},
           "deepseek": {"experts": "n_routed_experts", "expert_ffn": "moe_intermediate_size",
                        "shared_experts": "n_shared_experts", "dense_layers": "first_k_dense_replace"}}.get(style, {})
    moe["top_k"] = "num_experts_per_tok"
    top = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
           "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn": "intermediate_size",
           "vocab": "vocab_size", "tied_embeddings": "tie_word_embeddings"}
    section, _, name = key.partition(".")
    if section == "moe":
        return moe.get(name, key)
    if section == "mla":
        return name
    return top.get(key, key)


def is_hf_config(data: Any) -> bool:
    """A Hugging Face config names its family (``model_type``); trnopt's model JSON never does."""
    return isinstance(data, dict) and "model_type" in data
