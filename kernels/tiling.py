"""Matmul tiling shared by the overlap kernels: a streamed matmul within the hardware limits.

Over ~450 lines: the tiling choice, the pipeline that emits it and the baseline matmul
built on it share one cost picture (the SBUF budget, the per-DMA fixed cost, the issue
order of loads and stores); the pipeline is one stateful emitter whose parts hand each
other pending evacuations and stores, so split, each file would reach into the other's.

`MatmulPipeline` emits ``out[m, n] = x_t[K, m].T @ w[K, n]`` for one or more row blocks
that share a weight ``w``, with every operand in HBM:

- K is cut into tiles of 128 partitions (the contraction runs over partitions), grouped in
  blocks of ``k_block`` tiles. A block of whole tiles is loaded with one DMA per operand
  as a [128, k_block, cols] tile whose partition p, slot j holds row p * k_block + j of
  the block: the matmul contracts over partitions, and x and w share the row order, so
  the sum is the same while the DMA count drops k_block-fold (the per-DMA fixed cost,
  ~0.6 us of descriptor generation and ~1.3 us to start, "NKI Performance Guide", is
  what limits small-tile streams). Ragged blocks load tile by tile;
- output rows of all row blocks of a call are packed into stationary tiles of up to 128
  rows (a tile may hold rows of several blocks: two half-chunks of a two-channel ring
  fill one tile, so the matmul runs at its full rate, max(min(64, M), N) cycles for M
  up to 128); columns into moving tiles of up to 512 (one 2 KiB PSUM bank of FP32);
- a group of ``m_tiles x n_tiles`` output tiles accumulates over all of K in PSUM (at most
  8 banks, round-robin), so one group's evacuation (PSUM -> SBUF with the cast, one
  store per row piece) overlaps the next group's matmuls; evacuation copies alternate
  between the Vector and Scalar engines;
- streamed x and w K blocks rotate through ``bufs`` staging buffers, 3 where they fit:
  with 2, block b + 2's load can start only when block b's matmul ends, and where a
  block's matmul is shorter than a load's fixed cost plus its transfer the Tensor Engine
  waits on every block; with 3 the load starts a block earlier;
- ``resident_w``: the whole weight stays in SBUF, loaded once on first use, when it fits
  (small weight shards at large TP degree would otherwise be re-read once per row group);
- an optional ``addend`` (HBM, [m, n]) is added at evacuation (the reduce-scatter's last
  step adds the partial sum that arrived over the ring).

The SBUF capacity is a parameter (`choose_tiling(sbuf_bytes=...)`), from the target's
chip (`Target.chip.sbuf_bytes_per_partition`); `SBUF_TRN2` is only the default.
Buffers are allocated once per pipeline and reused, so the simulator's dependency
tracking sees the write-after-read hazards that real buffer rotation has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from trnopt.kernels.nki_api import nisa, nki, nl

PMAX = 128  # partitions (nl.tile_size.pmax)
STATIONARY_FMAX = 128  # nc_matmul stationary free size (nl.tile_size.gemm_stationary_fmax)
MOVING_FMAX = 512  # nc_matmul moving free size (nl.tile_size.gemm_moving_fmax)
PSUM_BANKS = 8  # nl.tile_size.psum_num_banks, 2 KiB (512 FP32) per partition each
SBUF_TRN2 = 224 * 1024  # bytes per partition, Trn2 ("Trainium2 Architecture Guide for NKI")
SBUF_SHARE = 0.75  # share of SBUF a pipeline may take; the rest is the kernel's own tiles


def matmul_operands(x_t, w) -> tuple[int, int, int]:
    """``(K, M, N)`` of ``x_t`` [K, M] and ``w`` [K, N], asserting both 2-D with equal K and dtype."""
    assert len(x_t.shape) == 2 and len(w.shape) == 2, (
        f"x_t and w must be 2-D, got x_t {tuple(x_t.shape)}, w {tuple(w.shape)}")
    k, m = x_t.shape
    kw, n = w.shape
    assert k == kw, f"contraction mismatch: x_t is [{k}, {m}] but w is [{kw}, {n}]"
    assert x_t.dtype == w.dtype, f"x_t dtype {x_t.dtype} != w dtype {w.dtype}"
    return k, m, n


def tile_spans(total: int, size: int) -> list[tuple[int, int]]:
    """``[(start, length), ...]`` covering ``range(total)`` in tiles of ``size``; the last may be short."""
    assert total > 0 and size > 0, f"tile_spans needs positive sizes, got total={total}, size={size}"
    return [(s, min(size, total - s)) for s in range(0, total, size)]


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


def unit_pieces(total: int, unit: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(total)`` into at most ``parts`` spans whose inner boundaries fall on
    multiples of ``unit`` (tile or block edges), sizes as even as the units allow."""
    units = -(-total // unit)
    out = []
    for u0, nu in split_rows(units, max(1, min(parts, units))):
        start = u0 * unit
        out.append((start, min(total, (u0 + nu) * unit) - start))
    return out


def k_interleaved(view: Any, kb: int) -> Any:
    """A [kb * 128, cols] view as [128, kb, cols]: element [p, j, c] is row p * kb + j.

    One DMA moves a whole K block this way; both matmul operands use it, so the
    contraction pairs the same rows (see the module docstring)."""
    (s0, rows), (s1, cols) = view.get_pattern()
    assert rows == kb * PMAX, f"k_interleaved: {rows} rows, expected {kb} x {PMAX}"
    return view.ap([[kb * s0, PMAX], [s0, kb], [s1, cols]])


@dataclass(frozen=True)
class MatmulTiling:
    """Tile counts of a `MatmulPipeline` (see the module docstring)."""

    k_block: int = 4  # K tiles (of 128) per DMA block
    m_tiles: int = 4  # output row tiles (of <= 128) per PSUM group
    n_tiles: int = 2  # output column tiles (of <= 512) per PSUM group
    out_bufs: int = 2  # SBUF staging groups for PSUM evacuation
    resident_w: bool = False  # the whole weight in SBUF, loaded once
    resident_x: bool = False  # a call's x (one row group) in SBUF, loaded once for all column groups
    bufs: int = 2  # staging buffers of streamed x and w K blocks (3: a block's load starts two blocks ahead)

    def __post_init__(self) -> None:
        assert self.k_block >= 1, f"k_block must be >= 1, got {self.k_block}"
        assert self.bufs in (2, 3), f"bufs must be 2 or 3, got {self.bufs}"
        assert self.m_tiles >= 1 and self.n_tiles >= 1, f"m_tiles, n_tiles must be >= 1, got {self}"
        assert self.m_tiles * self.n_tiles <= PSUM_BANKS, (
            f"a PSUM group of {self.m_tiles} x {self.n_tiles} tiles needs "
            f"{self.m_tiles * self.n_tiles} banks > {PSUM_BANKS}")

    def sbuf_bytes(self, k: int, n: int, in_itemsize: int, out_itemsize: int, addend_itemsize: int = 0) -> int:
        """SBUF bytes per partition the pipeline allocates for a [k, n] weight."""
        ncols = min(self.n_tiles * MOVING_FMAX, n)
        x = self.bufs * self.k_block * self.m_tiles * STATIONARY_FMAX * in_itemsize
        w = (math.ceil(k / PMAX) * n if self.resident_w else self.bufs * self.k_block * ncols) * in_itemsize
        o = self.out_bufs * self.m_tiles * ncols * out_itemsize
        a = 2 * self.m_tiles * ncols * addend_itemsize
        if self.resident_x:
            x = 2 * math.ceil(k / PMAX) * self.m_tiles * STATIONARY_FMAX * in_itemsize
        return x + w + o + a

    def traffic_bytes(self, m: int, k: int, n: int, itemsize: int) -> int:
        """HBM->SBUF bytes of x and w for one [m, k] x [k, n] product (re-reads included):
        x once per column group (once if ``resident_x``), w once per row group (once if
        ``resident_w``)."""
        m_groups = math.ceil(math.ceil(m / STATIONARY_FMAX) / self.m_tiles)
        n_groups = math.ceil(math.ceil(n / MOVING_FMAX) / self.n_tiles)
        x_reads = 1 if self.resident_x else n_groups
        return (m * k * x_reads + k * n * (1 if self.resident_w else m_groups)) * itemsize


def loads_outlast_matmul(rows: int, k: int, n: int, itemsize: int, tiling: MatmulTiling, extra_bytes: int) -> bool:
    """Whether one call of ``rows`` x ``k`` x ``n`` is bound by its DMA: the call's loads
    (``traffic_bytes``) plus ``extra_bytes`` the core's DMA engines also move meanwhile (a
    ring's transfers), at the core's DMA bandwidth, against its matmul, ceil(rows/128) x
    ceil(k/128) x n cycles of the Tensor Engine (one moving column per cycle per stationary
    tile). Both rates are the Trainium2 architecture guide's, as the simulator has them
    (`trnopt.kernels.sim.rates`): a kernel's choice, not a simulator call."""
    from trnopt.kernels.sim.rates import DMA_BANDWIDTH_BPS, TENSOR_ENGINE_HZ
    loads = (tiling.traffic_bytes(rows, k, n, itemsize) + extra_bytes) / DMA_BANDWIDTH_BPS
    matmul = math.ceil(rows / STATIONARY_FMAX) * math.ceil(k / PMAX) * n / TENSOR_ENGINE_HZ
    return loads > matmul


def choose_tiling(rows: int, k: int, n: int, in_itemsize: int, out_itemsize: int, *,
                  addend: bool = False, addend_itemsize: int | None = None,
                  sbuf_bytes: int = SBUF_TRN2) -> MatmulTiling:
    """Pick group and block sizes for products with up to ``rows`` output rows per call.

    Of the tilings that fit within ``SBUF_SHARE`` of ``sbuf_bytes`` per partition (the
    target chip's capacity): the largest K block (fewer, larger DMAs: each pays about
    2 us of fixed cost, "NKI Performance Guide"), then the fewest bytes loaded from HBM
    (`MatmulTiling.traffic_bytes`: x re-read per column group unless a call's x stays on
    chip, ``resident_x``; w re-read per row group unless it stays on chip, ``resident_w``),
    then the widest column group, then three staging buffers over two. Row groups use all
    8 PSUM banks' worth of row tiles the rows need; a resident weight may take narrower
    column groups. ``addend``: the calls pass addends, of ``addend_itemsize`` bytes per
    element (default ``in_itemsize``).
    """
    m_t = min(math.ceil(rows / STATIONARY_FMAX), PSUM_BANKS)
    n_t = min(math.ceil(n / MOVING_FMAX), max(1, PSUM_BANKS // m_t))
    m_t = min(m_t, PSUM_BANKS // n_t)
    kt = math.ceil(k / PMAX)
    a_size = (addend_itemsize or in_itemsize) if addend else 0
    budget = int(sbuf_bytes * SBUF_SHARE)
    one_row_group = math.ceil(rows / STATIONARY_FMAX) <= m_t
    widths = [n_t]
    while widths[-1] > 1:
        widths.append(widths[-1] // 2)
    candidates = [MatmulTiling(k_block=min(kb, kt), m_tiles=m_t, n_tiles=nt, resident_w=resident, resident_x=rx,
                               bufs=nb)
                  for resident, nts in ((True, widths), (False, [n_t])) for nt in nts for kb in (8, 4, 2, 1)
                  for rx in {one_row_group and math.ceil(n / MOVING_FMAX) > nt, False} for nb in (3, 2)]
    fits = [t for t in candidates if t.sbuf_bytes(k, n, in_itemsize, out_itemsize, a_size) <= budget]
    if fits:
        return min(fits, key=lambda t: (-t.k_block, t.traffic_bytes(rows, k, n, in_itemsize), -t.n_tiles, -t.bufs))
    t = MatmulTiling(k_block=1, m_tiles=m_t, n_tiles=n_t)
    raise AssertionError(f"matmul tiling for rows={rows}, k={k}, n={n} needs "
                         f"{t.sbuf_bytes(k, n, in_itemsize, out_itemsize, a_size)} SBUF bytes per partition "
                         f"> budget {budget} ({SBUF_SHARE:.0%} of {sbuf_bytes})")


@dataclass(frozen=True)
class RowBlock:
    """One row block of a pipeline call: ``out[m, n] (+)= x_t[K, m].T @ w``.

    ``x_t`` and ``out`` (and ``addend``) are HBM tensors or views; ``addend``, when given,
    is added to the product before the cast to ``out``'s dtype. With a call's ``x_sbuf``,
    ``x_t`` is None: the rows are columns of that SBUF tile.
    """

    x_t: Any
    out: Any
    addend: Any = None

    @property
    def rows(self) -> int:
        return self.out.shape[0]


def pack_rows(blocks: Sequence[RowBlock]) -> list[list[tuple[RowBlock, int, int, int]]]:
    """The rows of ``blocks`` in order, packed into stationary tiles of up to 128 rows:
    per tile, pieces ``(block, first row, rows, row offset in the tile)``."""
    tiles: list[list[tuple[RowBlock, int, int, int]]] = [[]]
    used = 0
    for b in blocks:
        r0 = 0
        while r0 < b.rows:
            if used == STATIONARY_FMAX:
                tiles.append([])
                used = 0
            rs = min(b.rows - r0, STATIONARY_FMAX - used)
            tiles[-1].append((b, r0, rs, used))
            used += rs
            r0 += rs
    return tiles if tiles[0] else []


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
        self.k_tiles = tile_spans(k, PMAX)
        kb = tiling.k_block
        self.k_blocks = [(i, self.k_tiles[i:i + kb]) for i in range(0, len(self.k_tiles), kb)]
        self.ncols = min(tiling.n_tiles * MOVING_FMAX, n)
        mcols = tiling.m_tiles * STATIONARY_FMAX
        xk = len(self.k_tiles) if tiling.resident_x else kb
        self.x_bufs = [nl.ndarray((PMAX, xk, mcols), dtype=in_dtype, buffer=nl.sbuf, name=f"{name}_x{i}")
                       for i in range(2 if tiling.resident_x else tiling.bufs)]
        self._calls = 0
        if tiling.resident_w:
            self.w_res = nl.ndarray((PMAX, len(self.k_tiles), n), dtype=in_dtype, buffer=nl.sbuf, name=f"{name}_w")
        else:
            self.w_bufs = [nl.ndarray((PMAX, kb, self.ncols), dtype=in_dtype, buffer=nl.sbuf, name=f"{name}_w{i}")
                           for i in range(tiling.bufs)]
        self.psum = [nl.ndarray((STATIONARY_FMAX, MOVING_FMAX), dtype=nl.float32, buffer=nl.psum,
                                name=f"{name}_ps{i}") for i in range(PSUM_BANKS)]
        mt = tiling.m_tiles
        self.o_bufs = [nl.ndarray((STATIONARY_FMAX, mt, self.ncols), dtype=out_dtype, buffer=nl.sbuf,
                                  name=f"{name}_o{i}") for i in range(tiling.out_bufs)]
        self.a_bufs = []
        if addend_dtype is not None:
            self.a_bufs = [nl.ndarray((STATIONARY_FMAX, mt, self.ncols), dtype=addend_dtype, buffer=nl.sbuf,
                                      name=f"{name}_a{i}") for i in range(2)]
        self._xi = self._wi = self._pi = self._oi = self._ai = self._ev = self._iter = 0
        self._loaded: set = set()
        self._x_sbuf: Any = None
        self._w_key: Any = None
        self._pending: Any = None
        self._stores: Any = None  # the evacuated group's stores, emitted after the next loads
        self._on_evac: Any = None
        self._deferred: list = []  # (call index of the evacuated group, fn)
        self._evac_call = 0
        self._side: list = []
        self._due: list = []
        self._lead: list = []

    def iterations(self, rows: Sequence[int]) -> int:
        """K-block iterations of one call over row blocks of the given sizes."""
        m_tiles = -(-sum(rows) // STATIONARY_FMAX)
        n_tiles = -(-self.n // MOVING_FMAX)
        groups = -(-m_tiles // self.t.m_tiles) * -(-n_tiles // self.t.n_tiles)
        return groups * len(self.k_blocks)

    def __call__(self, blocks: Sequence[RowBlock], w: Any, *, n_outer: bool = False,
                 side: Sequence[tuple[Any, Any]] = (),
                 lead: Sequence[Any] = (), at: Sequence[tuple[int, Any]] = (), flush: bool = True,
                 w_key: Any = None, x_sbuf: Any = None, on_evac: Any = None) -> None:
        """Emit the instructions for every block of ``blocks`` against weight ``w`` [k, n].

        The evacuation of a group (PSUM -> SBUF) is emitted after the next group's first
        K-block loads and its stores (SBUF -> HBM) after the next K-block iteration's loads:
        the DMA queues serve in issue order, and the loads feed the matmuls while a store
        only frees a staging buffer, so a store issued first would hold back the loads the
        Tensor Engine waits for.

        ``n_outer``: loop column groups outside row groups, so that output columns complete
        left to right (the reduce-scatter sends column pieces as they complete). ``side``:
        (dst, src) DMA copies, or callables that emit instructions (ring sends), spread
        evenly over the first half of the call's K-block iterations (a big copy issued at
        once would hold the matmul's loads back). ``at``: (iteration, item) pairs, each
        item emitted after the loads of that K-block iteration of the call (clamped to the
        call's iterations, `iterations`).
        ``flush=False`` leaves the last group's evacuation pending until the next
        call or `flush` (the caller must not read those outputs before). ``w_key``: names
        the weight for a resident tiling (a call with another key reloads it). ``x_sbuf``:
        x already on chip, a [128, K tiles, rows] tile in this pipeline's K layout
        (`k_major_copies`), the blocks' rows being its columns in order; no x loads.
        ``on_evac(n0, ncols)``: called once columns n0..n0+ncols are complete, after the
        stores of their last row group are emitted (a caller sending them on must not see
        them before every row is stored).
        ``lead``: callables, the i-th emitted at the start of the call's K-block iteration i,
        before that iteration's loads (the expert kernel's first dispatch goes K block by K
        block, each slab just ahead of the loads that read it).
        """
        assert tuple(w.shape) == (self.k, self.n), (
            f"{self.name}: weight shape {tuple(w.shape)} != ({self.k}, {self.n})")
        if w_key != self._w_key:
            self._loaded, self._w_key = set(), w_key
        tiles = pack_rows(blocks)
        for b in blocks:
            assert x_sbuf is not None or tuple(b.x_t.shape) == (self.k, b.rows), (
                f"{self.name}: x_t block shape {tuple(b.x_t.shape)} != ({self.k}, rows)")
            assert tuple(b.out.shape) == (b.rows, self.n), (
                f"{self.name}: out block shape {tuple(b.out.shape)} != ({b.rows}, {self.n})")
            assert b.addend is None or self.a_bufs, f"{self.name}: addend given but no addend_dtype"
        assert len({b.addend is None for b in blocks}) <= 1, f"{self.name}: addend on some blocks only"
        n_spans = tile_spans(self.n, MOVING_FMAX)
        mgs = [tiles[i:i + self.t.m_tiles] for i in range(0, len(tiles), self.t.m_tiles)]
        ngs = [n_spans[j:j + self.t.n_tiles] for j in range(0, len(n_spans), self.t.n_tiles)]
        pairs = [(a, b) for b in ngs for a in mgs] if n_outer else [(a, b) for a in mgs for b in ngs]
        iters = len(pairs) * len(self.k_blocks)
        half = max(1, iters // 2)
        # copy i of a list of n goes after iteration start + floor(i * span / n)
        due = [(i * half) // len(side) for i in range(len(side))]
        due += [min(max(0, i), iters - 1) for i, _ in at]
        order = sorted(range(len(due)), key=lambda j: due[j])
        items = list(side) + [item for _, item in at]
        self._side, self._due, self._iter = [items[j] for j in order], [due[j] for j in order], 0
        self._lead = list(lead)
        self._on_evac = on_evac
        if x_sbuf is not None:
            want = (PMAX, len(self.k_tiles), sum(b.rows for b in blocks))
            assert tuple(x_sbuf.shape) == want, f"{self.name}: x_sbuf shape {tuple(x_sbuf.shape)} != {want}"
        self._x_sbuf = x_sbuf
        self._calls += 1
        # what the evacuations of two calls back deferred goes first (their buffers turn over)
        while self._deferred and self._deferred[0][0] <= self._calls - 2:
            self._deferred.pop(0)[1]()
        if self.t.resident_x:
            assert len(mgs) == 1, f"{self.name}: resident_x tiling for one row group, got {len(mgs)}"
        for mi, (mg, ng) in enumerate(pairs):
            row_group = mi // len(ngs) if not n_outer else mi % len(mgs)
            self._group(mg, ng, w, row_group * self.t.m_tiles, complete=row_group == len(mgs) - 1)
        while self._lead:
            self._lead.pop(0)()
        for item in self._side:
            self._emit_side(item)
        self._side = []
        if flush:
            self.flush()

    def flush(self) -> None:
        """Emit the pending evacuation and stores of the last group, if any, and what `defer` holds."""
        self._evac_pending()
        self._store_pending()
        while self._deferred:
            self._deferred.pop(0)[1]()

    def _evac_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending()

    def _store_pending(self) -> None:
        if self._stores is not None:
            stores, self._stores = self._stores, None
            stores()

    def defer(self, fn: Any) -> None:
        """Emit ``fn()`` (instructions) at the next K-block iteration, one deferred call per
        iteration, so that a burst (the ring sends after an evacuation) spreads out; what is
        left goes out at the next call's start, before an addend load and at `flush`."""
        self._deferred.append((self._evac_call, fn))

    def _emit_side(self, item: Any) -> None:
        if callable(item):
            item()
        else:
            nisa.dma_copy(dst=item[0], src=item[1], name=f"{self.name}_side")

    def _load(self, dst: Any, src: Any, what: str) -> None:
        nisa.dma_copy(dst=dst, src=src, name=f"{self.name}_{what}")

    def _load_block(self, buf: Any, slot0: int, tiles: list, src: Any, c0: int, cols: int, what: str) -> None:
        """Rows of K block ``tiles`` of ``src`` (columns c0..c0+cols) into ``buf`` slots from slot0."""
        if len(tiles) > 1 and all(ks == PMAX for _, ks in tiles):
            k0 = tiles[0][0]
            kb = len(tiles)
            self._load(buf[0:PMAX, slot0:slot0 + kb, c0:c0 + cols],
                       k_interleaved(src[k0:k0 + kb * PMAX], kb), what)
            return
        for j, (k0, ks) in enumerate(tiles):
            self._load(buf[0:ks, slot0 + j, c0:c0 + cols], src[k0:k0 + ks], what)

    def k_major_copies(self, dst: Any, src: Any) -> list[tuple[Any, Any]]:
        """(dst, src) DMA copies that put ``src`` [K, cols] (HBM) into ``dst`` [128, K tiles,
        cols] (SBUF) in this pipeline's K layout, one per K block."""
        cols = src.shape[1]
        out = []
        for t0, tiles in self.k_blocks:
            if len(tiles) > 1 and all(ks == PMAX for _, ks in tiles):
                k0, kb = tiles[0][0], len(tiles)
                out.append((dst[0:PMAX, t0:t0 + kb, 0:cols], k_interleaved(src[k0:k0 + kb * PMAX], kb)))
            else:
                out += [(dst[0:ks, t0 + j, 0:cols], src[k0:k0 + ks]) for j, (k0, ks) in enumerate(tiles)]
        return out

    def _group(self, mts: list, nts: list, w: Any, tile0: int = 0, complete: bool = True) -> None:
        """One group's loads and matmuls (its evacuation and stores left pending); ``complete``:
        its row group is the call's last, so its stores complete their columns (``on_evac``)."""
        n0 = nts[0][0]
        ncols = nts[-1][0] + nts[-1][1] - n0
        # x segments: consecutive rows of one block in consecutive stationary columns load together
        segs: list[list[Any]] = []
        for a, tile in enumerate(mts):
            for b, r0, rs, off in tile:
                col = a * STATIONARY_FMAX + off
                if segs and segs[-1][0] is b and segs[-1][1] + segs[-1][2] == r0 and segs[-1][3] + segs[-1][2] == col:
                    segs[-1][2] += rs
                else:
                    segs.append([b, r0, rs, col])
        ps = [[self.psum[(self._pi + a * len(nts) + c) % PSUM_BANKS] for c in range(len(nts))]
              for a in range(len(mts))]
        self._pi += len(mts) * len(nts)
        adds: Any = None
        for bi, (t0, kblock) in enumerate(self.k_blocks):
            if self._lead:
                self._lead.pop(0)()
            if self._x_sbuf is not None:
                xb, xslot, xc0 = self._x_sbuf, t0, tile0 * STATIONARY_FMAX
            elif self.t.resident_x:
                xb, xslot, xc0 = self.x_bufs[self._calls % 2], t0, 0
                if n0 == 0:  # the first column group loads x for the whole call
                    for b, r0, rs, col in segs:
                        self._load_block(xb, t0, kblock, b.x_t[:, r0:r0 + rs], col, rs, "ld_x")
            else:
                xb, xslot, xc0 = self.x_bufs[self._xi % len(self.x_bufs)], 0, 0
                self._xi += 1
                for b, r0, rs, col in segs:
                    self._load_block(xb, 0, kblock, b.x_t[:, r0:r0 + rs], col, rs, "ld_x")
            if self.t.resident_w:
                wb, wslot, wc0 = self.w_res, t0, n0
                if (t0, n0) not in self._loaded:
                    self._loaded.add((t0, n0))
                    self._load_block(self.w_res, t0, kblock, w[:, n0:n0 + ncols], n0, ncols, "ld_w")
            else:
                wb, wslot, wc0 = self.w_bufs[self._wi % len(self.w_bufs)], 0, 0
                self._wi += 1
                self._load_block(wb, 0, kblock, w[:, n0:n0 + ncols], 0, ncols, "ld_w")
            while self._side and self._due[0] <= self._iter:
                self._due.pop(0)
                self._emit_side(self._side.pop(0))
            self._iter += 1
            self._store_pending()  # the group before's, now that these loads are queued
            if bi == 0:
                self._evac_pending()
            if self._deferred and bi > 0:
                self._deferred.pop(0)[1]()
            if bi == len(self.k_blocks) // 2:
                # mid-group: the addends are needed only at this group's evacuation
                adds = self._load_addends(mts, n0, ncols)
            for j, (k0, ks) in enumerate(kblock):
                first = bi == 0 and j == 0
                for a, tile in enumerate(mts):
                    rows = sum(p[2] for p in tile)
                    c = xc0 + a * STATIONARY_FMAX
                    for cc, (c0, cs) in enumerate(nts):
                        col = c0 - n0 + wc0
                        nisa.nc_matmul(ps[a][cc][0:rows, 0:cs], xb[0:ks, xslot + j, c:c + rows],
                                       wb[0:ks, wslot + j, col:col + cs], accumulate=not first,
                                       name=f"{self.name}_mm")
        on_evac, call = self._on_evac if complete else None, self._calls
        self._pending = lambda: self._evacuate(mts, nts, ps, adds, on_evac, call)

    def _runs(self, mts: list) -> list[tuple[Any, int, int, int, int]]:
        """The group's row pieces as ``(block, first row, rows, tile, tiles)``: consecutive
        whole tiles of one block make one run (one DMA through a [128, tiles, cols] pattern),
        any other piece is a run of its own (``tiles`` 0, ``rows`` its rows at offset
        ``first row``; see `_transfer`)."""
        runs: list[list[Any]] = []
        for a, tile in enumerate(mts):
            for b, r0, rs, off in tile:
                whole = rs == STATIONARY_FMAX
                last = runs[-1] if runs else None
                if whole and last and last[4] and last[0] is b and last[1] + last[2] == r0 and last[3] + last[4] == a:
                    last[2] += rs
                    last[4] += 1
                else:
                    runs.append([b, r0, rs, a, 1 if whole else 0, off])
        return [tuple(r) for r in runs]

    def _transfer(self, hbm: Any, sb: Any, run: tuple, n0: int, ncols: int, to_hbm: bool, what: str) -> None:
        """One DMA between rows of an HBM view and the staging tile ``sb`` [128, m_tiles, ncols]."""
        _, r0, rs, a, tiles, off = run
        if tiles:
            view = hbm[r0:r0 + rs, n0:n0 + ncols]
            (s0, _), (s1, _) = view.get_pattern()
            h = view.ap([[s0, STATIONARY_FMAX], [STATIONARY_FMAX * s0, tiles], [s1, ncols]])
            s = sb[0:STATIONARY_FMAX, a:a + tiles, 0:ncols]
        else:
            h, s = hbm[r0:r0 + rs, n0:n0 + ncols], sb[off:off + rs, a, 0:ncols]
        nisa.dma_copy(dst=h if to_hbm else s, src=s if to_hbm else h, name=f"{self.name}_{what}")

    def _load_addends(self, mts: list, n0: int, ncols: int) -> Any:
        if not mts or mts[0][0][0].addend is None:
            return None
        self._store_pending()  # its on_evac may defer the collective that writes the addend
        while self._deferred:  # what an addend reads may be written by a deferred collective
            self._deferred.pop(0)[1]()
        t = self.a_bufs[self._ai % len(self.a_bufs)]
        self._ai += 1
        for run in self._runs(mts):
            self._transfer(run[0].addend, t, run, n0, ncols, False, "ld_add")
        return t

    def _evacuate(self, mts: list, nts: list, ps: list, adds: Any, on_evac: Any = None, call: int = 0) -> None:
        self._store_pending()  # the group before's stores go first: one group's wait at a time
        n0 = nts[0][0]
        ncols = nts[-1][0] + nts[-1][1] - n0
        o = self.o_bufs[self._oi % len(self.o_bufs)]
        self._oi += 1
        for a, tile in enumerate(mts):
            rows = sum(p[2] for p in tile)
            for c, (c0, cs) in enumerate(nts):
                dst, src = o[0:rows, a, c0 - n0:c0 - n0 + cs], ps[a][c][0:rows, 0:cs]
                if adds is not None:
                    nisa.tensor_tensor(dst, src, adds[0:rows, a, c0 - n0:c0 - n0 + cs], op=nl.add,
                                       name=f"{self.name}_evac_add")
                else:
                    # alternate engines: the copies of one group run two at a time
                    eng = nisa.vector_engine if self._ev % 2 == 0 else nisa.scalar_engine
                    self._ev += 1
                    nisa.tensor_copy(dst, src, engine=eng, name=f"{self.name}_evac")
        self._stores = lambda: self._store(mts, o, n0, ncols, on_evac, call)

    def _store(self, mts: list, o: Any, n0: int, ncols: int, on_evac: Any, call: int) -> None:
        for run in self._runs(mts):
            self._transfer(run[0].out, o, run, n0, ncols, True, "st")
        if on_evac is not None:
            self._evac_call = call
            on_evac(n0, ncols)


@nki.jit
def matmul(x_t, w, sbuf_bytes=SBUF_TRN2, split="rows"):
    """The undecomposed matmul Y = X @ W on one rank (the T_mm baseline of the overlap kernels).

    Dimensions:
        K contraction, M rows, N columns.

    Args:
        x_t: [K, M], X transposed (K-major), HBM. w: [K, N], HBM, same dtype.
        sbuf_bytes: SBUF bytes per partition of the target chip.
        split: how an LNC 2 rank's two physical cores share the work, as the overlap
            kernel measured against it does: "rows" (each core loads half of X and all of
            W) or "cols" (all of X and half of W). Ignored at LNC 1.

    Returns:
        Y: [M, N] in w's dtype, shared HBM, via one `MatmulPipeline` over this program's
        rows and columns (`ring.program_share`).
    """
    from trnopt.kernels.ring import program_share  # ring imports this module
    k, m, n = matmul_operands(x_t, w)
    assert split in ("rows", "cols"), f"split must be 'rows' or 'cols', got {split!r}"
    y = nl.ndarray((m, n), dtype=w.dtype, buffer=nl.shared_hbm, name="y")
    r0, rows = program_share(m, "matmul") if split == "rows" else (0, m)
    c0, cols = program_share(n, "matmul") if split == "cols" else (0, n)
    tiling = choose_tiling(rows, k, cols, x_t.dtype.itemsize, w.dtype.itemsize, sbuf_bytes=sbuf_bytes)
    MatmulPipeline(k, cols, x_t.dtype, w.dtype, tiling, name="mm")(
        [RowBlock(x_t[0:k, r0:r0 + rows], y[r0:r0 + rows, c0:c0 + cols])], w[0:k, c0:c0 + cols])
    return y
