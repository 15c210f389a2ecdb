"""A solved layout as JSON (what `trnopt solve --json` writes and the other commands read)."""

from __future__ import annotations

import json
from pathlib import Path

from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import DIMS, Layout
from trnopt.optimizer.model.target import Target, load_target
from trnopt.optimizer.model.workload import Training, Workload, load_model


def layout_dict(layout: Layout) -> dict:
    """The decisions of a layout; ``placement`` maps dimension -> axis -> factor (factors > 1)."""
    return {
        "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "cp": layout.cp,
        "zero": layout.zero, "recompute": layout.recompute, "micro_batch": layout.micro_batch,
        "interleave": layout.interleave, "lnc": layout.lnc,
        "placement": {d: {a.name: f for a, f in zip(layout.axes, row) if f > 1}
                      for d, row in zip(DIMS, layout.placement)},
    }


def problem_dict(target_ref: str, model_ref: str, workload: Workload, domains: int) -> dict:
    """Enough to rebuild the problem: the target and model as the user named them (preset or path)."""
    return {"target": target_ref, "model": model_ref, "domains": domains,
            "seq": workload.training.seq, "global_batch": workload.training.global_batch}


def read_layout(path: str) -> tuple[Target, Workload, Layout]:
    """Read a layout file back into the target, the workload and a validated Layout."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, "-", "file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, "-", f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("layout"), dict):
        raise InputError(path, "layout", "missing: expected the JSON that `trnopt solve --json` writes")
    problem, lay = data.get("problem", {}), data["layout"]
    for key in ("target", "model", "domains"):
        if key not in problem:
            raise InputError(path, f"problem.{key}", "missing required key")
    try:
        target = load_target(problem["target"])
        workload = Workload(load_model(problem["model"]),
                            Training(seq=int(problem.get("seq", 8192)), global_batch=int(problem.get("global_batch", 1024))))
        lnc, domains = int(lay["lnc"]), int(problem["domains"])
        axes = target.axes(lnc, domains)
        placement = lay["placement"]
        rows = tuple(tuple(int(placement.get(d, {}).get(a.name, 1)) for a in axes) for d in DIMS)
        layout = Layout(tp=int(lay["tp"]), pp=int(lay["pp"]), dp=int(lay["dp"]), ep=int(lay.get("ep", 1)),
                        cp=int(lay.get("cp", 1)), zero=int(lay["zero"]), recompute=str(lay["recompute"]),
                        micro_batch=int(lay["micro_batch"]), interleave=int(lay.get("interleave", 1)), lnc=lnc,
                        axes=axes, placement=rows)
    except InputError as exc:
        raise InputError(path, f"layout.{exc.key}" if exc.source == "layout" else exc.key, exc.rule) from None
    except KeyError as exc:
        raise InputError(path, f"layout.{exc.args[0]}", "missing required key") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise InputError(path, "layout", f"malformed value ({exc})") from None
    return target, workload, layout
