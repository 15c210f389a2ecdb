"""Conformance: torchtitan's own code runs what trnopt exports for it, with trnopt's rank groups.

For a matrix of layouts (solved by ``trnopt solve``, or scored by ``trnopt evaluate`` with forced
degrees where the solver does not pick the feature: HSDP, CP, an interleaved pipeline), the
exported job config goes through torchtitan 0.2.2 itself:

- the TOML file, and the command-line overrides, through torchtitan's ``ConfigManager``
  (torchtitan/config/manager.py), which refuses unknown keys and ill-typed values;
- torchtitan's ``ParallelDims`` (torchtitan/distributed/parallel_dims.py) builds its device
  meshes on torch's fake process group at the layout's world size, and every group of every
  mesh (pp, batch, loss, dp_replicate, fsdp, cp, tp, ep, efsdp, etp) is compared, rank order
  included, with the groups trnopt's rank map (``Layout.rank_coordinates``) gives;
- torchtitan's train spec builds the model on the meta device and its own functions split the
  pipeline (``pipeline_llm``) and apply TP, activation checkpointing, compile, FSDP/HSDP and
  EP (the model's ``parallelize_fn``) on the first and the last rank; every parameter's mesh
  must hold that rank's trnopt groups, each rank's pipeline stages must be its trnopt stage,
  and a one-layer model under torchtitan's TP plan runs its forward on the meta device (the
  attention's ``view`` to whole heads is where TP above the KV-head count fails).

Nothing is pinned to one layout's degrees: whatever trnopt exports is what is checked. Mixtral
has no torchtitan 0.2.2 preset (the export leaves [model] to the user); it is built as
torchtitan's Qwen3 MoE model with Mixtral's dimensions (GQA attention and top-k routed experts
without shared experts, as in Mixtral; qk-norm off). Skipped when torchtitan is not installed:
``pip install '.[frameworks]'``. Run alone: ``python -m pytest -q tests/optimizer/frameworks -k conformance``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="the conformance tests need pip install '.[frameworks]'")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torchtitan.distributed.parallel_dims as tt_parallel_dims  # noqa: E402
import torchtitan.protocols.train_spec as tt_train_spec  # noqa: E402
from torchtitan.distributed.pipeline_parallel import pipeline_llm as tt_pipeline_llm  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402

from trnopt.optimizer.commands.cli import main  # noqa: E402
from trnopt.optimizer.frameworks import torchtitan as T  # noqa: E402
from trnopt.optimizer.model.layoutfile import read_layout  # noqa: E402

# torchtitan picks "cuda" when no accelerator is found (torchtitan/tools/utils.py); the meshes
# of this test live on the CPU's fake process group.
tt_parallel_dims.device_type = "cpu"

CASES = {  # id -> (trnopt command, layout keys changed in its JSON before the export)
    "llama3-405b-trn2u-x2": (["solve", "--target", "trn2u", "--ultraservers", "2", "--model", "llama3-405b"], {}),
    "llama3-70b-trn2": (["solve", "--target", "trn2", "--model", "llama3-70b"], {}),
    "llama3-8b-trn2": (["solve", "--target", "trn2", "--model", "llama3-8b"], {}),
    "deepseek-v3-trn2u": (["solve", "--target", "trn2u", "--model", "deepseek-v3"], {}),
    "deepseek-v3-trn3-gen2": (["solve", "--target", "trn3-gen2", "--model", "deepseek-v3"], {}),
    "mixtral-8x7b-trn2u": (["solve", "--target", "trn2u", "--model", "mixtral-8x7b"], {}),
    "mixtral-8x22b-trn3-gen2": (["solve", "--target", "trn3-gen2", "--model", "mixtral-8x22b"], {}),
    # HSDP: 2 replicas (one per instance, over EFA) of 16-way FSDP shards (the solver's HSDP is
    # only ever on EFA; `evaluate` has no flag for it, so the layout file says it)
    "hsdp-llama3-8b-trn2-x2": (["evaluate", "--target", "trn2", "--instances", "2", "--model", "llama3-8b",
                                "--tp", "4", "--dp", "32", "--zero", "3", "--recompute", "full",
                                "--placement", "tp=core4;dp=x4,y4,efa2"], {"dp_replicate": 2}),
    "cp-llama3-70b-trn2u": (["evaluate", "--target", "trn2u", "--model", "llama3-70b", "--tp", "8", "--cp", "2",
                             "--dp", "16", "--zero", "3", "--recompute", "full",
                             "--placement", "tp=core4,x2;cp=x2;dp=y4,ring4"], {}),
    "interleaved-llama3-70b-trn2u": (["evaluate", "--target", "trn2u", "--model", "llama3-70b", "--tp", "8",
                                      "--pp", "4", "--dp", "8", "--zero", "1", "--interleave", "2",
                                      "--recompute", "full", "--placement", "tp=core4,x2;dp=x2,y4;pp=ring4"], {}),
}

# Today's exports that torchtitan refuses; each names the cause. Remove a mark once the export
# (or the framework rules of the search) changes: strict, so a case that starts to pass fails.
XFAIL: dict[str, dict[str, str]] = {"mesh": {}, "parallelize": {}, "overrides": {}}


def _cases(test: str):
    return [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=XFAIL[test][c]))
            if c in XFAIL[test] else c for c in CASES]


@functools.cache
def exported(case: str, folder: str):
    """(target, workload, layout, TOML path, overrides) of one case: trnopt writes the layout
    JSON, reads it back as `launch` and `evaluate --layout` do, and exports the torchtitan config."""
    command, changes = CASES[case]
    path = Path(folder) / f"{case}.json"
    assert main([*command, "--json", str(path), "--force"]) == 0
    if changes:
        data = json.loads(path.read_text())
        data["layout"].update(changes)
        path.write_text(json.dumps(data))
    target, workload, layout = read_layout(str(path))
    toml = Path(folder) / f"{case}.toml"
    toml.write_text(T.job_toml(workload, target, layout))
    return target, workload, layout, str(toml), tuple(T.overrides(workload, target, layout))


@pytest.fixture
def case_files(tmp_path_factory):
    folder = str(tmp_path_factory.getbasetemp() / "conformance")
    Path(folder).mkdir(exist_ok=True)
    return lambda case: exported(case, folder)


@pytest.fixture
def fake_world():
    """torch's fake process group (every collective returns at once) at a given rank and world size."""
    def init(rank: int, world: int):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def parallel_dims(cfg, world: int) -> ParallelDims:
    """As torchtitan's Trainer.init_distributed (torchtitan/train.py) builds it."""
    p = cfg.parallelism
    return ParallelDims(dp_shard=p.data_parallel_shard_degree, dp_replicate=p.data_parallel_replicate_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=world)


# -- trnopt's groups ---------------------------------------------------------------------------------
# torchtitan mesh -> trnopt coordinates that vary inside one of its groups, innermost first. dp's
# coordinate is split into the FSDP shard (inner) and the HSDP replica (outer, on the scale-out axis).
VARY = {"tp": ("tp",), "etp": ("tp",), "cp": ("cp",), "ep": ("ep",), "pp": ("pp",), "dp_replicate": ("rep",),
        "fsdp": ("cp", "ep", "shard"), "efsdp": ("cp", "shard"), "batch": ("ep", "shard", "rep"),
        "loss": ("cp", "ep", "shard", "rep")}
ORDER = ("tp", "cp", "ep", "shard", "rep", "pp")


def trnopt_coordinates(layout, rank: int) -> dict[str, int]:
    dims, _ = layout.rank_coordinates(rank)
    shard = (layout.dp // layout.ep) // layout.dp_replicate
    return {"tp": dims["tp"], "cp": dims["cp"], "ep": dims["ep"], "shard": dims["dp"] % shard,
            "rep": dims["dp"] // shard, "pp": dims["pp"]}


@functools.cache
def trnopt_groups(layout, name: str) -> dict[int, tuple[int, ...]]:
    """rank -> its group of the torchtitan mesh ``name``, in trnopt's rank map, ordered."""
    sizes = {"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "rep": layout.dp_replicate, "pp": layout.pp,
             "shard": (layout.dp // layout.ep) // layout.dp_replicate}
    vary = VARY[name]
    by_key: dict[tuple, list[tuple[int, int]]] = {}
    for rank in range(layout.ranks):
        c = trnopt_coordinates(layout, rank)
        key = tuple(c[d] for d in ORDER if d not in vary)
        index, scale = 0, 1
        for d in vary:
            index, scale = index + c[d] * scale, scale * sizes[d]
        by_key.setdefault(key, []).append((index, rank))
    out = {}
    for members in by_key.values():
        group = tuple(r for _, r in sorted(members))
        out.update(dict.fromkeys(group, group))
    return out


# -- torchtitan's groups -------------------------------------------------------------------------------
# torchtitan mesh -> (the global mesh ParallelDims.build_mesh unflattens it from, its dimensions there)
SOURCES = {"pp": ("dataloading", ("pp",)), "batch": ("dataloading", ("batch",)), "cp": ("dataloading", ("cp",)),
           "tp": ("dataloading", ("tp",)), "loss": ("dataloading", ("batch", "cp")),
           "dp_replicate": ("dense", ("dp_replicate",)), "fsdp": ("dense", ("fsdp",)),
           "ep": ("sparse", ("ep",)), "efsdp": ("sparse", ("efsdp",)), "etp": ("sparse", ("etp",))}


def torchtitan_groups(dims: ParallelDims, name: str) -> set[tuple[int, ...]]:
    """Every group of one torchtitan mesh, ordered as its mesh orders the ranks."""
    mesh = dims._global_meshes[SOURCES[name][0]]  # the full rank layout; the 1-D meshes hold one rank's group
    names = list(mesh.mesh_dim_names)
    picked = [names.index(n) for n in SOURCES[name][1]]
    rest = [i for i in range(len(names)) if i not in picked]
    t = mesh.mesh.permute(*rest, *picked)
    return {tuple(row) for row in t.reshape(-1, math.prod(t.shape[len(rest):])).tolist()}


def meshes_in_use(dims: ParallelDims) -> list[str]:
    return [n for n in SOURCES if dims._mesh_exist(n, dims._meshes[n].size())]


@pytest.mark.parametrize("case", _cases("mesh"))
def test_toml_loads_and_torchtitans_mesh_has_trnopts_groups(case, case_files, fake_world):
    _, _, layout, toml, _ = case_files(case)
    cfg = ConfigManager().parse_args(["--job.config_file", toml])
    dims = parallel_dims(cfg, layout.ranks)
    assert (dims.tp, dims.pp, dims.cp, dims.dp_replicate, dims.dp_shard) == (
        layout.tp, layout.pp, layout.cp, layout.dp_replicate, layout.dp_shard)
    assert dims.ep == layout.ep
    fake_world(layout.ranks - 1, layout.ranks)
    dims.build_mesh()
    checked = meshes_in_use(dims)
    assert {"tp", "pp", "fsdp", "cp", "ep", "dp_replicate"} & {n for n in checked} == {
        n for n, d in (("tp", layout.tp), ("pp", layout.pp), ("fsdp", layout.dp_shard * layout.cp),
                       ("cp", layout.cp), ("ep", layout.ep), ("dp_replicate", layout.dp_replicate)) if d > 1}
    for name in checked:
        ours = trnopt_groups(layout, name)
        assert torchtitan_groups(dims, name) == set(ours.values()), name
        # the rank's own 1-D mesh (what torchtitan hands to FSDP, TP, ...) is its trnopt group
        assert tuple(dims._meshes[name].mesh.tolist()) == ours[layout.ranks - 1], name


@pytest.mark.parametrize("case", _cases("overrides"))
def test_overrides_parse_in_torchtitans_cli_and_say_what_the_toml_says(case, case_files):
    _, _, _, toml, overrides = case_files(case)
    from_file = ConfigManager().parse_args(["--job.config_file", toml])
    from_cli = ConfigManager().parse_args(list(overrides))
    for section in ("model", "training", "parallelism", "activation_checkpoint", "compile"):
        # asdict: each ConfigManager builds its own merged dataclass types (the SimpleFSDP experiment's
        # config module is merged in), and dataclass equality also compares the classes
        assert dataclasses.asdict(getattr(from_cli, section)) == dataclasses.asdict(getattr(from_file, section)), section


# -- the model and torchtitan's parallelize functions on the meta device --------------------------------
def model_args(cfg, workload):
    """(train spec, model args): the exported preset, or Mixtral as torchtitan's Qwen3 MoE model."""
    base = cfg.model.name.removeprefix("simple_fsdp.")  # SimpleFSDP's train specs wrap the plain models
    if base in {name for name, _ in T.MODEL_PRESETS.values()} and workload.model.name in T.MODEL_PRESETS:
        spec = tt_train_spec.get_train_spec(cfg.model.name)
        args = dataclasses.replace(spec.model_args[cfg.model.flavor])
    else:
        from torchtitan.models.moe import MoEArgs
        from torchtitan.models.qwen3.model.args import Qwen3ModelArgs
        m = workload.model
        assert m.moe is not None and m.mla is None and m.moe.shared_experts == 0 and m.moe.dense_layers == 0
        spec = tt_train_spec.get_train_spec("qwen3")
        args = Qwen3ModelArgs(dim=m.hidden, n_layers=m.layers, n_heads=m.heads, n_kv_heads=m.kv_heads,
                              head_dim=m.head_dim, vocab_size=m.vocab, hidden_dim=m.moe.expert_ffn, qk_norm=False,
                              moe_enabled=True, moe_inter_dim=m.moe.expert_ffn,
                              moe_args=MoEArgs(num_experts=m.moe.experts, num_shared_experts=0, top_k=m.moe.top_k,
                                               score_func="softmax", route_norm=True))
    args.update_from_config(cfg)
    return spec, args


def _tp_forward(spec, args, cfg, dims) -> None:
    """One layer under torchtitan's own TP plan, forward on the meta device (no FSDP: it needs real weights)."""
    if type(args).__name__ == "Qwen3ModelArgs":  # Mixtral's attention is Llama's (GQA, RoPE, no qk-norm): run it as llama3's
        from torchtitan.models.llama3.model.args import TransformerModelArgs
        spec = tt_train_spec.get_train_spec("llama3")
        small = TransformerModelArgs(dim=args.dim, n_layers=1, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
                                     vocab_size=args.vocab_size, max_seq_len=args.max_seq_len)
    else:
        small = dataclasses.replace(args, n_layers=1)
    if hasattr(small, "n_dense_layers"):  # DeepSeek-V3: the dense layer (MoE dispatch needs real counts)
        small = dataclasses.replace(small, n_dense_layers=1)
    if getattr(small, "attn_type", "sdpa") != "sdpa":  # flex attention needs a block mask built from real data;
        small = dataclasses.replace(small, attn_type="sdpa")  # the heads' view is the same
    with torch.device("meta"):
        model = spec.model_cls(small)
    module = sys.modules[spec.parallelize_fn.__module__]
    apply = getattr(module, "apply_non_moe_tp", None) or module.apply_tp
    given = dict(tp_mesh=dims.get_mesh("tp"), loss_parallel=not cfg.parallelism.disable_loss_parallel,
                 enable_float8_tensorwise_tp=False, enable_async_tp=False, cp_enabled=False)
    apply(model, **{k: v for k, v in given.items() if k in inspect.signature(apply).parameters})
    tokens = torch.zeros((1, cfg.training.seq_len), dtype=torch.long, device="meta")
    out = model(tokens)
    assert out.shape[-1] in (args.vocab_size, args.vocab_size // dims.tp)


@functools.cache
def _stand_in_neuron_backend() -> None:
    """TorchNeuron's torch.compile backend is not on this machine; nothing compiles on the meta
    device, but torch.compile looks the backend up by name when it wraps a block."""
    torch._dynamo.register_backend(name="neuron")(lambda gm, example_inputs: gm)


def _stage_indices(schedule) -> list[int]:
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    return sorted(s.stage_index for s in stages)


@pytest.mark.parametrize("case", _cases("parallelize"))
def test_torchtitans_parallelize_functions_run_it_with_trnopts_groups(case, case_files, fake_world):
    _, workload, layout, toml, _ = case_files(case)
    cfg = ConfigManager().parse_args(["--job.config_file", toml])
    if cfg.compile.enable and cfg.compile.backend == "neuron":
        _stand_in_neuron_backend()
    for rank in sorted({0, layout.ranks - 1}):
        fake_world(rank, layout.ranks)
        dims = parallel_dims(cfg, layout.ranks)
        dims.build_mesh()
        spec, args = model_args(cfg, workload)
        with torch.device("meta"):
            model = spec.model_cls(args)
        if rank == 0:  # the exported flavor is trnopt's model
            params, _ = args.get_nparams_and_flops(model, cfg.training.seq_len)
            assert params == pytest.approx(workload.model.total_params(), rel=0.005)
        if dims.pp_enabled:
            loss = spec.build_loss_fn(cfg, parallel_dims=dims)
            # torchtitan 0.2.2's qwen3 spec (Mixtral's stand-in) names no pipelining function; its
            # decoder has llama3's module names, so the generic pipeline_llm splits it the same way
            pipelining_fn = spec.pipelining_fn or tt_pipeline_llm
            schedule, parts, _, _ = pipelining_fn(model, dims, cfg, torch.device("cpu"), args,
                                                  spec.parallelize_fn, loss)
            stage = trnopt_coordinates(layout, rank)["pp"]
            indices = _stage_indices(schedule)
            assert len(indices) == layout.interleave
            assert all(i % layout.pp == stage or i % (2 * layout.pp) in (stage, 2 * layout.pp - 1 - stage)
                       for i in indices)
            assert schedule._n_microbatches == layout.micro_batches(workload)
        else:
            parts = [spec.parallelize_fn(model, dims, cfg)]
        seen = set()
        for part in parts:
            for name, p in part.named_parameters():
                mesh = getattr(p, "device_mesh", None)
                if mesh is None or id(mesh) in seen:
                    continue
                seen.add(id(mesh))
                for dim in mesh.mesh_dim_names:
                    if dim in VARY:
                        assert tuple(mesh[dim].mesh.tolist()) == trnopt_groups(layout, dim)[rank], (name, dim)
        assert seen or layout.ranks == 1
    if layout.tp > 1:
        _in_fresh_process(toml, case)


def _in_fresh_process(toml: str, case: str) -> None:
    """The one-layer TP forward in its own interpreter: DTensor keeps plans that name the process
    groups of earlier fake worlds (keyed by meshes that compare equal across worlds)."""
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('conformance', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); m.tp_forward(sys.argv[2], sys.argv[3])")
    done = subprocess.run([sys.executable, "-c", code, __file__, toml, case], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def tp_forward(toml: str, case: str) -> None:
    """Rank 0 of the layout's fake world runs one layer under torchtitan's TP plan."""
    _, workload, layout = read_layout(str(Path(toml).with_suffix(".json")))
    cfg = ConfigManager().parse_args(["--job.config_file", toml])
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=layout.ranks)
    dims = parallel_dims(cfg, layout.ranks)
    dims.build_mesh()
    spec, args = model_args(cfg, workload)
    _tp_forward(spec, args, cfg, dims)
