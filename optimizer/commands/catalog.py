"""What the built-in targets and model presets are, as text tables and JSON-ready dicts.

Pure functions returning strings or plain dicts, and the command that prints them: ``trnopt targets``,
``trnopt targets show NAME``, ``trnopt models`` and ``trnopt models show NAME`` print them.
Every figure comes from the target or preset file (whose comments give its source) or is
derived from it by the loaders in target.py and workload.py.
Units: text output uses the units of the files (GiB, GB/s, Gbps, TFLOPS, us, h); the dicts
use SI (bytes, bytes/s, FLOP/s, seconds), the units of the dataclasses.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.target import BUILTIN_TARGETS, GB, GIB, Target, load_target
from trnopt.optimizer.model.workload import PRESETS, Model, load_model, model_fields


def _num(x: float) -> str:
    """A figure as written in the files: thousands separators, at most two decimals, no trailing zeros."""
    text = f"{x:,.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], right: set[int]) -> str:
    """Columns padded to their widest cell; the columns in ``right`` aligned right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def _target(target: Target | str) -> Target:
    return load_target(target) if isinstance(target, str) else target


def _model(model: Model | str) -> Model:
    return load_model(model) if isinstance(model, str) else model


# -- targets -------------------------------------------------------------------------------

def _links(target: Target) -> str:
    return ", ".join(f"{a.name} {_num(a.bandwidth / GB)}" for a in target.domain_axes)


def targets_table() -> str:
    """One line per built-in target: chips per domain, topology, HBM, BF16 peak, links, scale-out.

    Link and scale-out bandwidths are GB/s per chip (per GPU on a100/h100).
    """
    header = ("target", "chips/domain", "topology", "HBM GiB/chip", "BF16 TFLOPS/chip",
              "links GB/s/chip", "scale-out GB/s/chip")
    rows = []
    for name in BUILTIN_TARGETS:
        t = load_target(name)
        rows.append((t.name, str(t.chips_per_domain), t.topology, _num(t.chip.hbm_bytes / GIB),
                     _num(t.chip.bf16_flops / 1e12), _links(t), _num(t.scale_out.bandwidth / GB)))
    return _table(header, rows, right={1, 3, 4, 6})


def target_details(target: Target | str) -> str:
    """Everything a target file holds, with units, plus what the loader derives from it."""
    t = _target(target)
    c, r, e = t.chip, t.reliability, t.efficiency
    ranks = ", ".join(f"{c.logical_cores(n)} at LNC={n}" for n in c.lnc_allowed)
    net_gbps = t.scale_out.bandwidth * 8 * t.chips_per_instance / GB
    lines = [
        f"{t.name}: {t.description}",
        f"  file                 {t.source}",
        f"  instance             {t.instance}: {t.chips_per_instance} chips; "
        f"{t.instances_per_domain} per scale-up domain",
        f"  scale-up domain      {t.chips_per_domain} chips: {t.topology}",
        f"  runtime reserve      {_num(t.runtime_reserve_bytes / GIB)} GiB per chip",
        f"chip: {c.name}",
        f"  physical cores       {c.physical_cores}",
        f"  LNC                  default {c.lnc_default}; allowed {', '.join(map(str, c.lnc_allowed))} "
        f"(ranks per chip: {ranks})",
        f"  HBM                  {_num(c.hbm_bytes / GIB)} GiB, {_num(c.hbm_bandwidth / GB)} GB/s",
        f"  dense peak           {_num(c.bf16_flops / 1e12)} TFLOPS BF16, {_num(c.fp8_flops / 1e12)} TFLOPS FP8",
        f"  SBUF                 {_num(c.sbuf_bytes_per_partition / 1024)} KiB per partition",
        f"  on-chip bandwidth    {_num(c.on_chip_bandwidth / GB)} GB/s between the cores of one chip",
        "axes of the domain (fastest first; bandwidth per chip, latency per hop)",
    ]
    for a in t.domain_axes:
        lines.append(f"  {a.name:<10} size {a.size:<4} {a.kind:<7} {_num(a.bandwidth / GB):>9} GB/s  "
                     f"{_num(a.latency * 1e6)} us")
    lines += [
        "scale-out between domains",
        f"  {t.scale_out.name:<10} {_num(net_gbps)} Gbps per instance = {_num(t.scale_out.bandwidth / GB)} GB/s "
        f"per chip, {_num(t.scale_out.latency * 1e6)} us per hop",
        "reliability",
        f"  instance MTBF        {_num(r.instance_mtbf_s / 3600)} h",
        f"  checkpoint write     {_num(r.checkpoint_bandwidth_per_instance / GB)} GB/s per instance",
        f"  restart              {_num(r.restart_s / 60)} min",
        f"engines per core: TensorE {_num(t.engines.tensor_hz / 1e9)} GHz, VectorE {_num(t.engines.vector_hz / 1e9)} GHz "
        f"x {t.engines.vector_lanes}, ScalarE {_num(t.engines.scalar_hz / 1e9)} GHz x {t.engines.scalar_lanes}",
        f"efficiency (fitted on {e.fitted_on or 'nothing stated'})",
        f"  matmul               {_num(e.matmul)}",
        f"  elementwise          {_num(e.elementwise)}",
        f"  per micro-batch      {_num(e.microbatch_overhead_s * 1e6)} us",
    ]
    return "\n".join(lines)


def target_dict(target: Target | str) -> dict[str, Any]:
    """The target as a JSON-ready dict: the dataclass fields in SI units, plus derived sizes."""
    t = _target(target)
    out = asdict(t)
    out["chip"]["lnc_allowed"] = list(t.chip.lnc_allowed)
    out["domain_axes"] = [asdict(a) for a in t.domain_axes]
    out.update(chips_per_domain=t.chips_per_domain, instances_per_domain=t.instances_per_domain,
               topology=t.topology)
    return out


# -- models --------------------------------------------------------------------------------

def _ffn_text(m: Model) -> str:
    if m.moe is None:
        return str(m.ffn)
    text = f"{m.moe.experts}x{m.moe.expert_ffn} top-{m.moe.top_k}"
    if m.moe.shared_experts:
        text += f" +{m.moe.shared_experts} shared"
    if m.moe.dense_layers:
        text += f" ({m.moe.dense_layers} dense: {m.ffn})"
    return text


def models_table() -> str:
    """One line per preset: layers, hidden, heads/kv, FFN or experts, vocab, total and active params (B)."""
    header = ("model", "layers", "hidden", "heads/kv", "FFN or experts", "vocab", "total B", "active B")
    rows = []
    for name in PRESETS:
        m = load_model(name)
        heads = f"{m.heads}/{m.kv_heads}" if m.mla is None else f"{m.heads} (MLA)"
        rows.append((m.name, str(m.layers), str(m.hidden), heads, _ffn_text(m), str(m.vocab),
                     f"{m.total_params() / 1e9:.1f}", f"{m.active_params() / 1e9:.1f}"))
    return _table(header, rows, right={1, 2, 5, 6, 7})


def _vs_published(count: int, published: float) -> str:
    if published <= 0:
        return "not published"
    return f"published {_num(published / 1e9)} B, {100 * (count / published - 1):+.2f}%"


def model_details(model: Model | str) -> str:
    """Architecture and parameter counts, broken down into attention, FFN, experts, embeddings."""
    m = _model(model)
    mlp = "SwiGLU, 3 matrices" if m.gated_mlp else "2 matrices"
    lines = [
        f"{m.name}: {m.source}",
        f"  layers               {m.layers}",
        f"  hidden               {m.hidden}",
    ]
    if m.mla is None:
        lines.append(f"  attention            {m.heads} heads, {m.kv_heads} KV heads, head dim {m.head_dim}")
    else:
        a = m.mla
        lines.append(f"  attention            MLA, {m.heads} heads: q_lora {a.q_lora_rank}, kv_lora {a.kv_lora_rank}, "
                     f"qk {a.qk_nope_head_dim} + rope {a.qk_rope_head_dim}, v {a.v_head_dim}")
    if m.dense_layers:
        lines.append(f"  FFN                  {m.ffn} ({mlp}) in {m.dense_layers} dense layers")
    if m.moe is not None:
        x = m.moe
        lines.append(f"  experts              {x.experts} routed of FFN {x.expert_ffn}, top-{x.top_k}, "
                     f"{x.shared_experts} shared, in {m.moe_layers} MoE layers ({mlp})")
    lines.append(f"  vocab                {m.vocab}, embeddings {'tied' if m.tied_embeddings else 'untied'}"
                 + (f", {m.learned_positions} learned positions" if m.learned_positions else ""))
    total, active = m.param_breakdown(), m.param_breakdown(active=True)
    lines.append("parameters (B)                  total    active")
    for part in total:
        if total[part]:
            lines.append(f"  {part.replace('_', ' '):<24} {total[part] / 1e9:>9.3f} {active[part] / 1e9:>9.3f}")
    lines += [
        f"  {'sum':<24} {m.total_params() / 1e9:>9.3f} {m.active_params() / 1e9:>9.3f}",
        f"  total: {_vs_published(m.total_params(), m.published_params)}",
    ]
    if m.moe is not None:
        lines.append(f"  active: {_vs_published(m.active_params(), m.published_active_params)}")
    return "\n".join(lines)


def model_dict(model: Model | str) -> dict[str, Any]:
    """The model as a JSON-ready dict: the keys of a model file (``--model`` loads it back) plus the
    parameter counts derived from them (checked, not read, when it is loaded back)."""
    m = _model(model)
    out: dict[str, Any] = {"moe": None, "mla": None, **model_fields(m)}
    out.update(total_params=m.total_params(), active_params=m.active_params(),
               params_by_part=m.param_breakdown(), active_params_by_part=m.param_breakdown(active=True))
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string (the same escapes)
    return repr(value)  # int, or float written so that it reads back exactly


def model_toml(model: Model | str) -> str:
    """The model as a model file (TOML) that ``--model FILE`` loads back as the same model."""
    m = _model(model)
    lines = [f"# trnopt model: {m.name} ({m.total_params() / 1e9:.2f} B parameters); load with --model FILE"]
    tables = []
    for key, value in model_fields(m).items():
        if isinstance(value, dict):
            tables += ["", f"[{key}]", *(f"{k} = {_toml_value(v)}" for k, v in value.items())]
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines + tables) + "\n"


# -- command ----------------------------------------------------------------------------------
CATALOGS = {  # command -> (loader, details text, JSON dict, listing)
    "targets": (load_target, target_details, target_dict, targets_table),
    "models": (load_model, model_details, model_dict, models_table),
}


def register(sub) -> None:
    for command, what in (("targets", "the built-in targets"), ("models", "the model presets")):
        p = sub.add_parser(command, help=f"list {what}, or show one")
        p.add_argument("action", nargs="?", choices=("list", "show"), default="list")
        p.add_argument("name", nargs="?")
        p.add_argument("--json", dest="as_json", action="store_true", help="JSON instead of text")
        if command == "models":
            p.add_argument("--toml", dest="as_toml", action="store_true",
                           help="with show: the model as a model file that --model FILE loads back")
        p.set_defaults(run=run)


def run(args) -> int:
    """`trnopt targets|models [show NAME] [--json]`."""
    load, details, as_dict, listing = CATALOGS[args.command]
    if args.action == "show":
        if not args.name:
            raise InputError(f"trnopt {args.command} show", "NAME", f"name one (trnopt {args.command} lists them)")
        item = load(args.name)
        if getattr(args, "as_toml", False):
            if args.as_json:
                raise InputError(f"trnopt {args.command} show", "--toml", "give --toml or --json, not both")
            print(model_toml(item), end="")
        else:
            print(json.dumps(as_dict(item), indent=2) if args.as_json else details(item))
    else:
        print(listing())
    return 0
