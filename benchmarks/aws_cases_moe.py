"""Cases of benchmarks/aws_kernels.py: nki-library's mixture-of-experts kernels on BF16 operands
(blockwise matmul forward, with dropping, and backward)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from aws_case import BF16, Case, bf16, lib_case, psum_matmul


MOE_CASES: list[Case] = []


def moe_inputs(block: int) -> Callable[[np.random.Generator, int], tuple[tuple, dict]]:
    """Top-1 routed tokens in blocks of ``block`` per expert (padding token id T, zero row)."""
    def make(rng: np.random.Generator, r: int, t: int = 256, h: int = 512, e: int = 4, i: int = 512):
        x = np.zeros((t + 1, h), np.float32)
        x[:t] = rng.standard_normal((t, h)) * 0.5
        expert = rng.integers(0, e, t)
        aff = np.zeros((t + 1, e), np.float32)
        aff[np.arange(t), expert] = rng.uniform(0.5, 1, t)
        pos, b2e = [], []
        for k in range(e):
            toks = list(np.flatnonzero(expert == k))
            for b0 in range(0, max(len(toks), 1), block):
                blk = toks[b0:b0 + block]
                pos += blk + [t] * (block - len(blk))
                b2e.append(k)
        wg = rng.standard_normal((e, h, 2, i)) * 0.05
        wd = rng.standard_normal((e, i, h)) * 0.05
        return (x.astype(BF16), aff.reshape(-1, 1).astype(BF16), wg.astype(BF16), wd.astype(BF16), block,
                np.array(pos, np.int32), np.array(b2e, np.int32).reshape(-1, 1)), {}
    return make


def silu_f32(g: np.ndarray) -> np.ndarray:
    """silu(g) = g sigmoid(g) in FP32 arithmetic, as the engines compute it ("nki.isa.activation":
    the computation is in fp32 whatever the input and output dtypes), rounded to BF16."""
    g = np.asarray(g, np.float32)
    return bf16(g * (np.float32(1) / (np.float32(1) + np.exp(-g))))


def ref_moe(x, aff, wg, wd, block, pos, b2e, shards: int = 1):
    """out[t] = affinity * (silu(x Wg) * (x Wu)) Wd of the token's expert (affinity after the MLP),
    block by block as the kernels run: g and u are FP32 PSUM sums of 128-row H tiles of
    weight^T x^T (``psum_matmul``; stationary the gate/up weight tile, moving the block's
    transposed tokens: bwmm_shard_on_I's ``compute_gate_and_up_projections_shard_on_intermediate``).
    The kernels hold silu(g) and the gated product in their compute dtype (BF16 here: the
    ``tmp_lst`` and ``intermediate_states_lst`` tiles of nki-library's moe_cte_utils
    ``compute_intermediate_states``), so the reference computes those two values in FP32 and
    rounds them to BF16 where the kernel does; the down projection is the FP32 PSUM sum of
    128-row I tiles (stationary the intermediate states, moving Wd). ``shards`` > 1: the kernel splits I into that many
    contiguous parts, one per core; each core rounds its partial down projection to BF16
    (``block_new_lst``), the cores exchange them (``sendrecv``) and add them in BF16, and the
    affinity multiplies that sum into the BF16 block (bwmm_shard_on_I.py's down projection)."""
    wg, wd = wg.astype(np.float32), wd.astype(np.float32)
    e, n_i = wg.shape[0], wg.shape[3]
    a = aff.astype(np.float64).reshape(-1, e)
    t = x.shape[0] - 1
    out = np.zeros((t, x.shape[1]))
    for b, k in enumerate(np.asarray(b2e).reshape(-1)):
        toks = np.asarray(pos[b * block:(b + 1) * block])  # padding slots: id t, a zero row of x
        x_t = x[toks].astype(np.float32).T  # [H, block]
        g, u = (psum_matmul(wg[k, :, j], x_t) for j in (0, 1))
        act = bf16(silu_f32(g).astype(np.float32) * u.astype(np.float32))  # [I, tokens]
        parts = np.split(np.arange(n_i), shards)
        down = [psum_matmul(act[p], wd[k][p]) for p in parts]  # [tokens, H] per core
        real = toks < t
        aff_k = a[toks[real], k][:, None]
        if shards == 1:
            out[toks[real]] = aff_k * down[0][real]
        else:
            out[toks[real]] = bf16(aff_k * bf16(sum(bf16(d[real]) for d in down)))
    return out


def moe_out(o: Any) -> np.ndarray:
    o = np.asarray(o[0] if isinstance(o, (tuple, list)) else o).astype(np.float64)
    return (o.sum(1) if o.ndim == 3 else o)[:-1]  # shard partials summed; padding row dropped


def _post_scale(make: Any) -> Any:
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        args, _ = make(rng, r)
        return args, {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}
    return inputs


def _hybrid(make: Any) -> Any:
    """The hybrid kernel's inputs: conditions [N+1] (1: a block with tokens, last 0) first."""
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        args, _ = make(rng, r)
        pos, t = args[5].reshape(-1, args[4]), args[0].shape[0] - 1
        cond = np.concatenate([(pos != t).any(1), [False]]).astype(np.int32)
        return (cond,) + args, {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}
    return inputs


def _moe_cte(make: Any) -> Any:
    """moe_cte's order (token_position_to_id, block_to_expert, block_size, spec): shard_on_block."""
    def inputs(rng: np.random.Generator, r: int) -> tuple[tuple, dict]:
        from nkilib.core.moe.moe_cte.moe_cte import MoECTEImplementation, MoECTESpec
        from nkilib.core.utils.common_types import ExpertAffinityScaleMode
        (x, aff, wg, wd, block, pos, b2e), _ = make(rng, r)
        return (x, aff, wg, wd, pos, b2e, block, MoECTESpec(implementation=MoECTEImplementation.shard_on_block)), \
            {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}
    return inputs


MOE_CASES += [
    lib_case("core/moe/moe_cte/moe_cte.py", "moe_cte", _moe_cte(moe_inputs(128)),
         lambda a, kw, r, al: ref_moe(a[0], a[1], a[2], a[3], a[6], a[4], a[5]), lnc=2,
         post=moe_out, eps_dtype=BF16),
    lib_case("core/moe/moe_cte/bwmm_shard_on_I.py", "blockwise_mm_baseline_shard_intermediate_hybrid",
         _hybrid(moe_inputs(256)), lambda a, kw, r, al: ref_moe(*a[1:], shards=2), lnc=2,
         post=moe_out, eps_dtype=BF16),
    lib_case("core/moe/moe_cte/bwmm_shard_on_block.py", "bwmm_shard_on_block", moe_inputs(128),
         lambda a, kw, r, al: ref_moe(*a), lnc=2, post=moe_out, eps_dtype=BF16),
    lib_case("experimental/moe/forward/bwmm_shard_on_H.py", "blockwise_mm_baseline_shard_hidden", moe_inputs(128),
         lambda a, kw, r, al: ref_moe(*a), lnc=2, post=moe_out, eps_dtype=BF16),
    lib_case("core/moe/moe_cte/bwmm_shard_on_I.py", "blockwise_mm_baseline_shard_intermediate",
         _post_scale(moe_inputs(256)), lambda a, kw, r, al: ref_moe(*a, shards=2), lnc=2,
         post=moe_out, eps_dtype=BF16),
]

def _dropping_inputs(rng: np.random.Generator, r: int, t: int = 2176, h: int = 512, e: int = 2, i: int = 256,
                     block: int = 1024) -> tuple[tuple, dict]:
    """The dropping layer's layout: block k holds expert k's tokens (up to ``block``; the rest are
    dropped), padding token id T."""
    from nkilib.core.utils.common_types import ExpertAffinityScaleMode
    (x, aff, wg, wd, _, _, _), _ = moe_inputs(block)(rng, r, t, h, e, i)
    a = aff.astype(np.float32).reshape(t + 1, e)
    pos = np.full((e, block), t, np.int32)
    for k in range(e):
        toks = np.flatnonzero(a[:t, k])[:block]
        pos[k, :toks.size] = toks
    return (x, aff, wg, wd, block, pos.reshape(-1), np.arange(e, dtype=np.int32).reshape(-1, 1)), \
        {"expert_affinities_scaling_mode": ExpertAffinityScaleMode.POST_SCALE}


def ref_moe_dropping(x, aff, wg, wd, block, pos, b2e):
    """ref_moe (I split over the two cores) for the tokens that got a slot in their expert's
    block; dropped tokens give zero."""
    out = ref_moe(x, aff, wg, wd, block, pos, b2e, shards=2)
    kept = np.zeros(out.shape[0], bool)
    kept[pos[pos < out.shape[0]]] = True
    return np.where(kept[:, None], out, 0.0)


MOE_CASES.append(lib_case("core/moe/moe_cte/bwmm_shard_on_I.py", "blockwise_mm_shard_intermediate_dropping",
                      _dropping_inputs, lambda a, kw, r, al: ref_moe_dropping(*a), lnc=2,
                      post=moe_out, eps_dtype=BF16))


def _silu(z: np.ndarray) -> np.ndarray:
    return z / (1 + np.exp(-z))


def _moe_bwd_inputs(rng: np.random.Generator, r: int, t: int = 512, h: int = 256, i: int = 256, e: int = 2,
                    block: int = 256) -> tuple[tuple, dict]:
    """Top-1 routing, every block full (the dropless layout without skipped tokens); the
    checkpoints are the forward pass's gate/up projections (transposed, [N, 2, I, B]) and
    down projection (before the affinity, [N, B, H]), computed here in float64."""
    x = (rng.standard_normal((t, h)) * 0.5).astype(BF16)
    wg = (rng.standard_normal((e, h, 2, i)) * 0.05).astype(BF16)
    wd = (rng.standard_normal((e, i, h)) * 0.05).astype(BF16)
    n = t // block
    # the kernel zeroes the affinity gradient [T * E] in halves (program p the p-th half, with
    # no barrier before the first block) and program p handles the p-th 128-row tile of each
    # block: tile p of every block takes tokens of the p-th half, so each program writes only
    # gradients it zeroed itself (any token order within a block is a valid routing)
    half, tile = t // 2, 128
    lo, hi = rng.permutation(half), half + rng.permutation(half)
    pos = np.concatenate([np.concatenate([lo[b * tile:(b + 1) * tile], hi[b * tile:(b + 1) * tile]])
                          for b in range(t // block)]).astype(np.int32)
    b2e = rng.integers(0, e, n).astype(np.int32)
    aff = np.zeros((t, e), np.float32)
    for b in range(n):
        aff[pos[b * block:(b + 1) * block], b2e[b]] = rng.uniform(0.5, 1, block)
    gu_t = np.zeros((n, 2, i, block))
    down = np.zeros((n, block, h))
    for b in range(n):
        xb = x[pos[b * block:(b + 1) * block]].astype(np.float64)
        gu = np.einsum("bh,hki->bki", xb, wg[b2e[b]].astype(np.float64))
        gu_t[b] = gu.transpose(1, 2, 0)
        down[b] = (_silu(gu[:, 0]) * gu[:, 1]) @ wd[b2e[b]].astype(np.float64)
    dy = rng.standard_normal((t, h)).astype(BF16)
    return (x, aff.reshape(-1, 1).astype(BF16), wg, wd, gu_t.astype(BF16), down.astype(BF16), pos,
            b2e.reshape(-1, 1), dy, block), {}


def ref_moe_bwd(x, aff, wg, wd, gu_t, down, pos, b2e, dy, block):
    """Gradients of y[t] = a[t, e] * z, z = (silu(g) * u) Wd[e], g, u = x Wg[e], x Wu[e] (the
    affinity on the H side): dz = a dy; da = sum_h dy z; dWd = act^T dz with act = silu(g) u;
    d_act = dz Wd^T; dg = d_act u silu'(g), du = d_act silu(g); dWg, dWu = x^T dg, x^T du;
    dx = dg Wg^T + du Wu^T. The gate/up values are the checkpoint's (as the kernel reads them).
    Rounded where nki-library's bwmm_bwd_dropless keeps BF16 (its compute dtype): dy z
    elementwise (``block_multiply_tile``) before the FP32 row sum, and da itself; dz
    (``down_proj_output_grad_tile``); silu(g), act, d_act, du, d_act u, silu'(g) and dg
    (``_compute_gate_up_projection_output_grad``'s tiles; silu and silu' in FP32 on the Scalar
    engine); each block's weight gradient out of FP32 PSUM, added in BF16 to the gradient
    accumulated in HBM; dx as the BF16 gate part plus the FP32 PSUM up part
    (``_compute_hidden_states_grad``). Every product is the FP32 PSUM sum of 128-row tiles
    (``psum_matmul``)."""
    x, wg, wd, dy = (a.astype(np.float64) for a in (x, wg, wd, dy))
    e = wg.shape[0]
    a = aff.astype(np.float64).reshape(-1, e)
    dx, da, dwg, dwd = np.zeros_like(x), np.zeros_like(a), np.zeros_like(wg), np.zeros_like(wd)
    for b in range(len(b2e)):
        k, toks = int(b2e[b, 0]), pos[b * block:(b + 1) * block]
        g, u = (gu_t[b, j].astype(np.float64).T for j in (0, 1))
        dz = bf16(a[toks, k:k + 1].astype(np.float32).astype(np.float64) * dy[toks])
        da[toks, k] = bf16(bf16(dy[toks] * down[b].astype(np.float64)).sum(1))
        g32 = g.astype(np.float32)
        sg = np.float32(1) / (np.float32(1) + np.exp(-g32))
        silu = bf16(g32 * sg)
        sdx = bf16(sg * (np.float32(1) + g32 * (np.float32(1) - sg)))
        act = bf16(silu * u)
        dwd[k] = bf16(dwd[k] + bf16(psum_matmul(act, dz)))
        d_act = bf16(psum_matmul(dz.T, wd[k].T))
        dg = bf16(bf16(d_act * u) * sdx)
        du = bf16(d_act * silu)
        dwg[k, :, 0] = bf16(dwg[k, :, 0] + bf16(psum_matmul(x[toks], dg)))
        dwg[k, :, 1] = bf16(dwg[k, :, 1] + bf16(psum_matmul(x[toks], du)))
        dx[toks] = bf16(bf16(psum_matmul(dg.T, wg[k, :, 0].T)) + psum_matmul(du.T, wg[k, :, 1].T))
    return dx, da.reshape(-1, 1), dwg, dwd


MOE_CASES.append(lib_case("experimental/moe/bwd/blockwise_mm_backward.py", "blockwise_mm_bwd", _moe_bwd_inputs,
                      lambda a, kw, r, al: ref_moe_bwd(*a), lnc=2,
                      post=lambda o: tuple(o[:4])))
