"""Tiling shared by the overlap kernels: a streamed matmul within the hardware limits.

`MatmulPipeline` emits ``out[m, n] = x_t[K, m].T @ w[K, n]`` for one or more row blocks
that share a weight ``w``, with every operand in HBM:

- K is cut into tiles of 128 partitions (the contraction runs over partitions), grouped in
  blocks of ``k_block`` tiles; each block of x and w is DMA'd into one of two SBUF buffers
  (double buffering: block j+1 loads while block j multiplies);
- output rows are cut into tiles of up to 128 (matmul stationary free size), columns into
  tiles of up to 512 (moving free size, one 2 KiB PSUM bank of FP32);
- a group of ``m_tiles x n_tiles`` output tiles accumulates over all of K in PSUM (at most
  8 banks); PSUM tiles come from a round-robin pool of 8, so the evacuation of one group
  (PSUM -> SBUF with the cast to the output dtype, then DMA to HBM) overlaps the next
  group's matmuls;
- an optional ``addend`` (HBM, [m, n]) is added at evacuation (the reduce-scatter's last
  step adds the partial sum that arrived over the ring).

Buffers are allocated once per pipeline and reused, so the simulator's dependency
tracking sees the write-after-read hazards that real buffer rotation has. The x and w
blocks of a group are loaded once per group: x is re-read once per column group and w
once per row group (`MatmulTiling.traffic_bytes`).

`matmul_operands` and `ring_setup` are the precondition checks the kernels share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from trnopt.kernels.nki_api import ncc, nisa, nki, nl

PMAX = 128  # partitions (nl.tile_size.pmax)
STATIONARY_FMAX = 128  # nc_matmul stationary free size (nl.tile_size.gemm_stationary_fmax)
MOVING_FMAX = 512  # nc_matmul moving free size (nl.tile_size.gemm_moving_fmax)
PSUM_BANKS = 8  # nl.tile_size.psum_num_banks, 2 KiB (512 FP32) per partition each
SBUF_BYTES_PER_PARTITION = 224 * 1024  # Trn2 (DESIGN section 7)


def matmul_operands(x_t, w) -> tuple[int, int, int]:
    """``(K, M, N)`` of ``x_t`` [K, M] and ``w`` [K, N], asserting both 2-D with equal K and dtype."""
    assert len(x_t.shape) == 2 and len(w.shape) == 2, (
        f"x_t and w must be 2-D, got x_t {tuple(x_t.shape)}, w {tuple(w.shape)}")
    k, m = x_t.shape
    kw, n = w.shape
    assert k == kw, f"contraction mismatch: x_t is [{k}, {m}] but w is [{kw}, {n}]"
    assert x_t.dtype == w.dtype, f"x_t dtype {x_t.dtype} != w dtype {w.dtype}"
    return k, m, n


def ring_setup(groups: Sequence[Sequence[int]], channels: int, what: str):
    """``(replica group, this rank's rank-list, its size)`` for a ring kernel ``what``, asserting
    rank-lists of equal size, channels in (1, 2) and one program per rank (LNC 1)."""
    sizes = {len(g) for g in groups}
    assert len(sizes) == 1, f"replica groups must have equal sizes, got {[len(g) for g in groups]}"
    assert channels in (1, 2), f"channels must be 1 or 2, got {channels}"
    assert nl.num_programs() == 1, f"{what} runs one program per rank (LNC 1), got {nl.num_programs()}"
    rg = ncc.ReplicaGroup([list(g) for g in groups])
    me = ncc.rank_id()
    for g in groups:
        if me in g:
            return rg, list(g), len(g)
    raise AssertionError(f"rank {me} is in no rank-list of replica groups {[list(g) for g in groups]}")


def tile_spans(total: int, size: int) -> list[tuple[int, int]]:
    """``[(start, length), ...]`` covering ``range(total)`` in tiles of ``size``; the last may be short."""
    assert total > 0 and size > 0, f"tile_spans needs positive sizes, got total={total}, size={size}"
    return [(s, min(size, total - s)) for s in range(0, total, size)]


def unit_pieces(total: int, unit: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(total)`` into at most ``parts`` spans whose inner boundaries fall on
    multiples of ``unit`` (tile or block edges), sizes as even as the units allow."""
    units = -(-total // unit)
    out = []
    for u0, nu in split_rows(units, max(1, min(parts, units))):
        start = u0 * unit
        out.append((start, min(total, (u0 + nu) * unit) - start))
    return out


def split_rows(rows: int, parts: int) -> list[tuple[int, int]]:
    """Split ``rows`` into ``parts`` contiguous spans, sizes differing by at most one (larger first)."""
    assert 1 <= parts <= rows, f"cannot split {rows} rows into {parts} non-empty parts"
    base, extra = divmod(rows, parts)
    out, start = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((start, n))
        start += n
    return out


@dataclass(frozen=True)
class MatmulTiling:
    """Tile counts of a `MatmulPipeline` (see the module docstring)."""

    k_block: int = 4  # K tiles (of 128) per DMA block
    m_tiles: int = 4  # output row tiles (of <= 128) per PSUM group
    n_tiles: int = 2  # output column tiles (of <= 512) per PSUM group
    out_bufs: int = 8  # SBUF staging tiles for PSUM evacuation

    def __post_init__(self) -> None:
        assert self.k_block >= 1, f"k_block must be >= 1, got {self.k_block}"
        assert self.m_tiles >= 1 and self.n_tiles >= 1, f"m_tiles, n_tiles must be >= 1, got {self}"
        assert self.m_tiles * self.n_tiles <= PSUM_BANKS, (
            f"a PSUM group of {self.m_tiles} x {self.n_tiles} tiles needs "
            f"{self.m_tiles * self.n_tiles} banks > {PSUM_BANKS}")

    def sbuf_bytes(self, in_itemsize: int, out_itemsize: int, addend_itemsize: int = 0) -> int:
        """SBUF bytes per partition the pipeline allocates."""
        x = 2 * self.k_block * self.m_tiles * STATIONARY_FMAX * in_itemsize
        w = 2 * self.k_block * self.n_tiles * MOVING_FMAX * in_itemsize
        o = self.out_bufs * MOVING_FMAX * max(out_itemsize, 4 if addend_itemsize else out_itemsize)
        a = 2 * self.m_tiles * self.n_tiles * MOVING_FMAX * addend_itemsize
        return x + w + o + a

    def traffic_bytes(self, m: int, k: int, n: int, itemsize: int) -> int:
        """HBM->SBUF bytes of x and w for one [m, k] x [k, n] product (re-reads included)."""
        m_groups = math.ceil(math.ceil(m / STATIONARY_FMAX) / self.m_tiles)
        n_groups = math.ceil(math.ceil(n / MOVING_FMAX) / self.n_tiles)
        return (m * k * n_groups + k * n * m_groups) * itemsize


def choose_tiling(rows: int, k: int, n: int, in_itemsize: int, out_itemsize: int, *,
                  addend: bool = False, sbuf_budget: int = SBUF_BYTES_PER_PARTITION // 2) -> MatmulTiling:
    """Pick group and block sizes for products with up to ``rows`` output rows per call.

    Uses all 8 PSUM banks for a group (fewest re-reads), biased towards whole row blocks
    (x re-read less), then the largest K block (fewer, larger DMAs) whose double buffers
    fit ``sbuf_budget`` bytes per partition (half of SBUF by default, leaving room for the
    caller's own buffers).
    """
    m_t = min(math.ceil(rows / STATIONARY_FMAX), PSUM_BANKS)
    n_t = min(math.ceil(n / MOVING_FMAX), max(1, PSUM_BANKS // m_t))
    m_t = min(m_t, PSUM_BANKS // n_t)
    kt = math.ceil(k / PMAX)
    a_size = in_itemsize if addend else 0
    for kb in (8, 4, 2, 1):
        t = MatmulTiling(k_block=min(kb, kt), m_tiles=m_t, n_tiles=n_t)
        if t.sbuf_bytes(in_itemsize, out_itemsize, a_size) <= sbuf_budget:
            return t
    t = MatmulTiling(k_block=1, m_tiles=m_t, n_tiles=n_t)
    raise AssertionError(f"matmul tiling for rows={rows}, k={k}, n={n} needs "
                         f"{t.sbuf_bytes(in_itemsize, out_itemsize, a_size)} SBUF bytes per partition "
                         f"> budget {sbuf_budget}")


@dataclass(frozen=True)
class RowBlock:
    """One row block of a pipeline call: ``out[m, n] (+)= x_t[K, m].T @ w``.

    ``x_t`` and ``out`` (and ``addend``) are HBM tensors or views; ``addend``, when given,
    is added to the product before the cast to ``out``'s dtype.
    """

    x_t: Any
    out: Any
    addend: Any = None

    @property
    def rows(self) -> int:
        return self.x_t.shape[1]


class MatmulPipeline:
    """Emits tiled matmuls for row blocks sharing one weight; see the module docstring.

    Args:
        k: contraction size (rows of x_t and w).
        n: output columns (columns of w).
        in_dtype: dtype of x_t and w (they must match, nc_matmul rule).
        out_dtype: dtype of the outputs.
        tiling: a `MatmulTiling` (e.g. from `choose_tiling`).
        addend_dtype: dtype of addend tensors if any call passes one.
        name: prefix of instruction names.
    """

    def __init__(self, k: int, n: int, in_dtype: Any, out_dtype: Any, tiling: MatmulTiling,
                 addend_dtype: Any = None, name: str = "mm") -> None:
        self.k, self.n, self.t, self.name = k, n, tiling, name
        self.in_dtype, self.out_dtype = in_dtype, out_dtype
        self.k_tiles = tile_spans(k, PMAX)
        self.k_blocks = [self.k_tiles[i:i + tiling.k_block] for i in range(0, len(self.k_tiles), tiling.k_block)]
        kb, mcols, ncols = tiling.k_block, tiling.m_tiles * STATIONARY_FMAX, tiling.n_tiles * MOVING_FMAX
        ncols = min(ncols, n)
        self.x_bufs = [nl.ndarray((PMAX, kb, mcols), dtype=in_dtype, buffer=nl.sbuf, name=f"{name}_x{i}")
                       for i in range(2)]
        self.w_bufs = [nl.ndarray((PMAX, kb, ncols), dtype=in_dtype, buffer=nl.sbuf, name=f"{name}_w{i}")
                       for i in range(2)]
        self.psum = [nl.ndarray((STATIONARY_FMAX, MOVING_FMAX), dtype=nl.float32, buffer=nl.psum,
                                name=f"{name}_ps{i}") for i in range(PSUM_BANKS)]
        self.o_bufs = [nl.ndarray((STATIONARY_FMAX, MOVING_FMAX), dtype=out_dtype, buffer=nl.sbuf,
                                  name=f"{name}_o{i}") for i in range(tiling.out_bufs)]
        self.a_bufs = []
        if addend_dtype is not None:
            self.a_bufs = [nl.ndarray((STATIONARY_FMAX, MOVING_FMAX), dtype=addend_dtype, buffer=nl.sbuf,
                                      name=f"{name}_a{i}") for i in range(2 * tiling.m_tiles * tiling.n_tiles)]
        self._xi = self._wi = self._pi = self._oi = self._ai = self._iter = 0
        self._pending: Any = None
        self._hook: Any = None
        self._side: list = []
        self._due: list = []

    def _tiles(self, blocks: Sequence[RowBlock]) -> list:
        tiles = []
        for b in blocks:
            assert tuple(b.x_t.shape) == (self.k, b.rows), (
                f"{self.name}: x_t block shape {tuple(b.x_t.shape)} != ({self.k}, rows)")
            assert tuple(b.out.shape) == (b.rows, self.n), (
                f"{self.name}: out block shape {tuple(b.out.shape)} != ({b.rows}, {self.n})")
            assert b.addend is None or self.a_bufs, f"{self.name}: addend given but no addend_dtype"
            tiles += [(b, r0, rs) for r0, rs in tile_spans(b.rows, STATIONARY_FMAX)]
        return tiles

    def iterations(self, rows: Sequence[int]) -> int:
        """K-block iterations of one call over row blocks of the given sizes."""
        m_tiles = sum(-(-r // STATIONARY_FMAX) for r in rows)
        n_tiles = -(-self.n // MOVING_FMAX)
        groups = -(-m_tiles // self.t.m_tiles) * -(-n_tiles // self.t.n_tiles)
        return groups * len(self.k_blocks)

    def __call__(self, blocks: Sequence[RowBlock], w: Any, *, n_outer: bool = False,
                 side: Sequence[tuple[Any, Any]] = (), late: Sequence[tuple[Any, Any]] = (),
                 hook: Any = None, flush: bool = True) -> None:
        """Emit the instructions for every block of ``blocks`` against weight ``w`` [k, n].

        The evacuation of a group (PSUM -> SBUF -> HBM) is emitted after the next group's
        first K-block loads: the DMA queues serve in issue order, so stores waiting on the
        last matmul would otherwise hold back the next group's loads.

        ``n_outer``: loop column groups outside row groups, so that output columns complete
        left to right (the reduce-scatter sends column pieces as they complete); the HBM
        traffic is the same either way. ``side``: (dst, src) DMA copies spread evenly over the
        first half of the call's K-block iterations (a big copy issued at once would hold
        the matmul's loads back); ``late``: the same over the second half (for copies whose
        data arrives during the call). ``hook``: called once, after the first group's first loads and
        the previous call's last evacuation (the reduce-scatter sends the previous step's
        last piece there). ``flush=False`` leaves the last group's evacuation pending until
        the next call or `flush` (the caller must not read those outputs before).
        """
        assert tuple(w.shape) == (self.k, self.n), (
            f"{self.name}: weight shape {tuple(w.shape)} != ({self.k}, {self.n})")
        tiles = self._tiles(blocks)
        n_tiles = tile_spans(self.n, MOVING_FMAX)
        mgs = [tiles[i:i + self.t.m_tiles] for i in range(0, len(tiles), self.t.m_tiles)]
        ngs = [n_tiles[j:j + self.t.n_tiles] for j in range(0, len(n_tiles), self.t.n_tiles)]
        pairs = [(a, b) for b in ngs for a in mgs] if n_outer else [(a, b) for a in mgs for b in ngs]
        iters = len(pairs) * len(self.k_blocks)
        half = max(1, iters // 2)
        # copy i of a list of n goes after iteration start + floor(i * span / n)
        due = [(i * half) // len(side) for i in range(len(side))]
        due += [half + (i * max(1, iters - half)) // len(late) for i in range(len(late))]
        self._side, self._due, self._iter = list(side) + list(late), due, 0
        self._hook = hook
        for mg, ng in pairs:
            self._group(mg, ng, w)
        for dst, src in self._side:
            nisa.dma_copy(dst=dst, src=src, name=f"{self.name}_side")
        self._side = []
        if self._hook is not None:
            self.flush()
            self._hook()
            self._hook = None
        if flush:
            self.flush()

    def flush(self) -> None:
        """Emit the pending evacuation of the last group, if any."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending()

    def _group(self, mts: list, nts: list, w: Any) -> None:
        n0 = nts[0][0]
        ncols = nts[-1][0] + nts[-1][1] - n0
        # x segments: consecutive row tiles of one block load with one DMA per K tile.
        segs: list[list[Any]] = []
        for slot, (b, r0, rs) in enumerate(mts):
            if segs and segs[-1][0] is b and segs[-1][2] + segs[-1][3] == r0:
                segs[-1][3] += rs
            else:
                segs.append([b, slot, r0, rs])
        ps = [[self.psum[(self._pi + a * len(nts) + c) % PSUM_BANKS] for c in range(len(nts))]
              for a in range(len(mts))]
        self._pi += len(mts) * len(nts)
        adds: dict = {}
        for bi, kblock in enumerate(self.k_blocks):
            xb = self.x_bufs[self._xi % 2]
            wb = self.w_bufs[self._wi % 2]
            self._xi += 1
            self._wi += 1
            for j, (k0, ks) in enumerate(kblock):
                for b, slot, r0, rs in segs:
                    c = slot * STATIONARY_FMAX
                    nisa.dma_copy(dst=xb[0:ks, j, c:c + rs], src=b.x_t[k0:k0 + ks, r0:r0 + rs],
                                  name=f"{self.name}_ld_x")
                nisa.dma_copy(dst=wb[0:ks, j, 0:ncols], src=w[k0:k0 + ks, n0:n0 + ncols],
                              name=f"{self.name}_ld_w")
            while self._side and self._due[0] <= self._iter:
                dst, src = self._side.pop(0)
                self._due.pop(0)
                nisa.dma_copy(dst=dst, src=src, name=f"{self.name}_side")
            self._iter += 1
            if bi == 0:
                self.flush()
                if self._hook is not None:
                    self._hook()
                    self._hook = None
                adds = self._load_addends(mts, nts)
            for j, (k0, ks) in enumerate(kblock):
                first = bi == 0 and j == 0
                for a, (_, _, rs) in enumerate(mts):
                    c = a * STATIONARY_FMAX
                    for cc, (c0, cs) in enumerate(nts):
                        nisa.nc_matmul(ps[a][cc][0:rs, 0:cs], xb[0:ks, j, c:c + rs],
                                       wb[0:ks, j, c0 - n0:c0 - n0 + cs], accumulate=not first,
                                       name=f"{self.name}_mm")
        self._pending = lambda: self._evacuate(mts, nts, ps, adds)

    def _load_addends(self, mts: list, nts: list) -> dict:
        adds = {}
        if not any(b.addend is not None for b, _, _ in mts):
            return adds
        base = (self._ai % 2) * self.t.m_tiles * self.t.n_tiles
        self._ai += 1
        for a, (b, r0, rs) in enumerate(mts):
            for c, (c0, cs) in enumerate(nts):
                if b.addend is not None:
                    t = self.a_bufs[base + a * len(nts) + c]
                    nisa.dma_copy(dst=t[0:rs, 0:cs], src=b.addend[r0:r0 + rs, c0:c0 + cs], name=f"{self.name}_ld_add")
                    adds[(a, c)] = t
        return adds

    def _evacuate(self, mts: list, nts: list, ps: list, adds: dict) -> None:
        for a, (b, r0, rs) in enumerate(mts):
            for c, (c0, cs) in enumerate(nts):
                o = self.o_bufs[self._oi % len(self.o_bufs)]
                self._oi += 1
                if (a, c) in adds:
                    nisa.tensor_tensor(o[0:rs, 0:cs], ps[a][c][0:rs, 0:cs], adds[(a, c)][0:rs, 0:cs],
                                       op=nl.add, name=f"{self.name}_evac_add")
                else:
                    nisa.tensor_copy(o[0:rs, 0:cs], ps[a][c][0:rs, 0:cs], name=f"{self.name}_evac")
                nisa.dma_copy(dst=b.out[r0:r0 + rs, c0:c0 + cs], src=o[0:rs, 0:cs], name=f"{self.name}_st")


@nki.jit
def matmul(x_t, w):
    """The undecomposed matmul Y = X @ W on one rank (the T_mm baseline of the overlap kernels).

    Args:
        x_t: [K, M], X transposed (K-major), HBM. w: [K, N], HBM, same dtype.

    Returns:
        Y: [M, N] in w's dtype, shared HBM, via one `MatmulPipeline` over all M rows.
    """
    k, m, n = matmul_operands(x_t, w)
    y = nl.ndarray((m, n), dtype=w.dtype, buffer=nl.shared_hbm, name="y")
    tiling = choose_tiling(m, k, n, x_t.dtype.itemsize, w.dtype.itemsize)
    MatmulPipeline(k, n, x_t.dtype, w.dtype, tiling, name="mm")([RowBlock(x_t, y)], w)
    return y
