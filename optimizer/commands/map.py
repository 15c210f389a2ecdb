"""`trnopt map`: a picture of the domain with every chip's TP group and pipeline stage.

The picture follows the target's geometry: one panel per instance (a Trn2 UltraServer
is four panels of the 4x4 torus, the panel index being the instance's position on the
ring that joins chips with equal (x, y); a Trn3 Gen1 UltraServer is four servers of 16
chips; a Trn3 Gen2 UltraServer 36 servers of 4). Chip numbers inside an instance are
trnopt's (x + 4y on a torus), so column = x and row = y there. Each chip is split into its
logical cores (4 at LNC=2 on Trainium2); a core is coloured by its rank's TP group and the
chip is labelled with its pipeline stage(s). The text form prints the same grid with
``T<group>`` and ``s<stage>`` per chip.

The PNG needs matplotlib, an optional extra: ``pip install 'trnopt[plot]'``.
"""

from __future__ import annotations

import argparse
import io
import math
from dataclasses import dataclass

from trnopt.optimizer.commands.args import ascii_int, check_int, load_runnable_layout
from trnopt.optimizer.commands.output import check_output
from trnopt.optimizer.errors import InputError
from trnopt.optimizer.model.layout import Layout
from trnopt.optimizer.model.partial import describe, physical
from trnopt.optimizer.model.placement import _ranges, instance_ranks, stage, tp_group, tp_summary
from trnopt.optimizer.model.target import Target

DEFAULT_MAX_DOMAINS = 4
MAX_DRAWN = 64  # domains one picture can hold
MAX_DRAWN_RANKS = 2**20  # and ranks: fewer domains are drawn of a very large domain
PLOT_HINT = "not installed; the PNG needs the plot extra: pip install 'trnopt[plot]'"


@dataclass(frozen=True)
class Core:
    rank: int
    tp_group: int
    stage: int


@dataclass
class DomainPicture:
    """Cores of every chip of one domain: ``chips[(instance, chip)]`` lists its cores by core index."""

    index: int
    chips: dict[tuple[int, int], list[Core]]


def near_square_columns(n: int) -> int:
    """The smallest divisor of n that is at least sqrt(n): 16 -> 4, 36 -> 6, 4 -> 2, 8 -> 4."""
    return next(d for d in range(1, n + 1) if n % d == 0 and d * d >= n)


def chip_columns(target: Target) -> int:
    """Columns of chips inside one instance: the first torus axis where it tiles the instance."""
    first = target.domain_axes[0]
    if first.kind in ("torus", "ring") and target.chips_per_instance % first.size == 0:
        return first.size
    return near_square_columns(target.chips_per_instance)


def axis_corner(target: Target) -> str:
    """The row\\column heading of an instance's grid: ``y\\x`` on a torus, ``chip`` otherwise."""
    a = target.domain_axes
    if len(a) > 1 and a[0].kind == "torus" and a[1].kind == "torus" and chip_columns(target) == a[0].size \
            and a[0].size * a[1].size == target.chips_per_instance:
        return f"{a[1].name}\\{a[0].name}"
    return "row\\col"


def instance_columns(target: Target) -> int:
    n = target.instances_per_domain
    return n if n <= 4 else near_square_columns(n)


def pictures(layout: Layout, target: Target, max_domains: int | None = None) -> list[DomainPicture]:
    """The first ``max_domains`` domains (all when None), computed one instance at a time."""
    out = []
    per_chip = layout.ranks_per_chip
    for d in range(min(layout.domains, max_domains or layout.domains)):
        pic = DomainPicture(d, {})
        for inst in range(target.instances_per_domain):
            ranks = instance_ranks(layout, target, d, inst)  # by chip, then core
            for chip in range(target.chips_per_instance):
                pic.chips[(inst, chip)] = [Core(r, tp_group(r, layout), stage(r, layout))
                                           for r in ranks[chip * per_chip:(chip + 1) * per_chip]]
        out.append(pic)
    return out


def chip_label(cores: list[Core]) -> str:
    tps = sorted({c.tp_group for c in cores})
    stages = sorted({c.stage for c in cores})
    return f"T{_ranges(tps)} s{_ranges(stages)}"


def describe_target(target: Target) -> str:
    ring = any(a.kind == "ring" for a in target.domain_axes)
    where = " (instance = position on the ring)" if ring else ""
    return (f"{target.name}: {target.instances_per_domain} x {target.instance}, "
            f"{target.chips_per_instance} chips each{where}")


def text_map(layout: Layout, target: Target, max_domains: int = DEFAULT_MAX_DOMAINS) -> str:
    cols = chip_columns(target)
    rows = target.chips_per_instance // cols
    pics = pictures(layout, target, max_domains)
    corner = axis_corner(target)
    margin = max(3, len(corner))
    lines = [f"rank map: {layout.describe()} on {layout.domains} x {describe_target(target)}",
             f"placement: {layout.placement_text() or 'all on one rank'}",
             *([describe(target)] if target.remaining else []),
             f"each chip: T<TP groups> s<pipeline stages> of its {layout.ranks_per_chip} logical core(s); "
             "TP group n holds the ranks with equal coordinates in every other dimension; "
             f"chip number = {cols} * row + column"]
    for pic in pics:
        lines.append("")
        lines.append(f"domain {physical(target, pic.index, 0)[0]}")
        labels = {k: chip_label(v) for k, v in pic.chips.items()}
        width = max(len(s) for s in labels.values())
        for inst in range(target.instances_per_domain):
            lines.append(f"  instance {physical(target, pic.index, inst)[1]}:")
            lines.append(f"    {corner:<{margin}s} " + " ".join(f"{c:<{width}d}" for c in range(cols)).rstrip())
            for r in range(rows):
                cells = [labels[(inst, r * cols + c)].ljust(width) for c in range(cols)]
                lines.append(f"    {r:<{margin}d} " + " ".join(cells).rstrip())
    if layout.domains > len(pics):
        lines += ["", f"... {layout.domains - len(pics)} more domain(s) not drawn (--domains to draw more)"]
    lines += ["", tp_summary(layout, target).check_line(layout)]
    return "\n".join(lines)


def png_map(layout: Layout, target: Target, path: str, force: bool = False,
            max_domains: int = DEFAULT_MAX_DOMAINS) -> None:
    """Draw the picture with matplotlib (optional extra) and write it through cli.write_output's rule."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        raise InputError("--png", "matplotlib", PLOT_HINT) from None
    from trnopt.optimizer.commands.output import write_output

    pics = pictures(layout, target, max_domains)
    cols, icols = chip_columns(target), instance_columns(target)
    rows = target.chips_per_instance // cols
    irows = math.ceil(target.instances_per_domain / icols)
    ccols = near_square_columns(layout.ranks_per_chip)
    crows = layout.ranks_per_chip // ccols
    panel_w, panel_h = cols + 1.0, rows + 1.4
    width, height = icols * panel_w, irows * panel_h
    scale = max(0.45, min(1.0, 14 / width))
    fig, axes = plt.subplots(len(pics), 1, figsize=(width * scale + 0.5, (height * scale + 0.6) * len(pics)),
                             squeeze=False)
    cmap = plt.get_cmap("tab20")
    font = max(4.0, 8 * scale)
    for ax, pic in zip(axes[:, 0], pics):
        for inst in range(target.instances_per_domain):
            ox = (inst % icols) * panel_w
            oy = (inst // icols) * panel_h
            ax.text(ox + cols / 2, oy - 0.25, f"instance {physical(target, pic.index, inst)[1]}", ha="center", va="bottom", fontsize=font)
            for chip in range(target.chips_per_instance):
                cx, cy = ox + chip % cols, oy + chip // cols
                cores = pic.chips[(inst, chip)]
                for k, core in enumerate(cores):
                    w, h = 0.9 / ccols, 0.9 / crows
                    ax.add_patch(Rectangle((cx + (k % ccols) * w, cy + (k // ccols) * h), w, h,
                                           facecolor=cmap(core.tp_group % 20), edgecolor="white", linewidth=0.3))
                ax.add_patch(Rectangle((cx, cy), 0.9, 0.9, fill=False, edgecolor="black", linewidth=0.6))
                tps, stages = sorted({c.tp_group for c in cores}), sorted({c.stage for c in cores})
                ax.text(cx + 0.45, cy + 0.45, f"T{_ranges(tps)}\ns{_ranges(stages)}", ha="center", va="center",
                        fontsize=font * 0.8)
        ax.set_xlim(-0.2, width)
        ax.set_ylim(height, -0.8)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"domain {physical(target, pic.index, 0)[0]}: {target.name}, colour = TP group, label = pipeline stage",
                     fontsize=font + 1)
    fig.suptitle(f"{layout.describe()}", fontsize=font + 1)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_output(path, buffer.getvalue(), force, flag="--png")


# -- command ----------------------------------------------------------------------------------
def register(sub) -> None:
    p = sub.add_parser("map", help="picture of the domain: chips by TP group and pipeline stage",
                       description="Draw where every rank of a solved layout runs (text, or PNG with --png).")
    p.add_argument("--layout", required=True, help="the JSON that `trnopt solve --json` writes")
    p.add_argument("--png", metavar="FILE", help="write a PNG picture (needs matplotlib: pip install 'trnopt[plot]')")
    p.add_argument("--domains", type=ascii_int, default=DEFAULT_MAX_DOMAINS,
                   help=f"draw at most this many domains (default {DEFAULT_MAX_DOMAINS}, at most {MAX_DRAWN})")
    p.add_argument("--force", action="store_true", help="allow --png to replace an existing file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_int(args.domains, "--domains", 1, MAX_DRAWN)
    check_output(args.png, "--png", args.force)
    target, _, layout, _ = load_runnable_layout(args.layout)
    args.domains = min(args.domains, max(1, MAX_DRAWN_RANKS // target.ranks(layout.lnc, 1)))
    if args.png:
        png_map(layout, target, args.png, args.force, args.domains)
        print(f"wrote {args.png}: {min(args.domains, layout.domains)} of {layout.domains} domain(s)")
        return 0
    print(text_map(layout, target, args.domains))
    return 0
