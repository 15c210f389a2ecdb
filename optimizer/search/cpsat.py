"""CP-SAT layout search: placement, degrees and memory plan in one model, exact on the cost model.

Formulation, and why: cost tables over single decisions, composed with integer products.
Every term of the step time (steptime.py) is, after substituting m = B / (dp * b) and
dp = ranks / (tp * cp * pp), a sum of products of a few factors that each depend on one
decision: a coefficient of one dimension's placement row (seconds per byte and seconds
of latency of its collective, from collectives.coefficients), an integer of the
pipeline degree (layers per stage), of the recomputation (collectives per layer), the
micro-batch count m, and so on. The model keeps one variable family per decision,
looks each factor up in a table (``add_element``) and multiplies factors with
``add_multiplication_equality``. The model therefore grows with the sum of the choices
(the largest table is one dimension's placement row, a few hundred entries) and never
with their product; CP-SAT's propagation over the products does the pruning. A log-domain
linearisation would make the objective linear but only approximately (it needs exp), and
then CP-SAT's optimum could differ from brute force's; integer products keep it exact.

Times are integers in ticks of 2^-24 of the best compute time. Every term carries a bound
on what rounding its table entries to whole ticks can have moved it (Term.error,
evaluated at the solution); the answer is re-scored by the float cost model (evaluate.py)
and a disagreement beyond that bound raises.
Memory is in bytes. Placement factors are tied to the axis sizes exactly through their
prime exponents (linear constraints).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from trnopt.optimizer.cost import collectives as cc
from trnopt.optimizer.cost.evaluate import Evaluation, checkpoint_bytes, evaluate, objective_value
from trnopt.optimizer.search.intmodel import CAP, IntModel, Term, const
from trnopt.optimizer.model.layout import DIMS, RECOMPUTE, Layout, default_placement
from trnopt.optimizer.cost.memory import activation_bytes_per_layer
from trnopt.optimizer.cost.overlap import tp_hidden
from trnopt.optimizer.cost.reliability import reliability
from trnopt.optimizer.defaults import WORKERS as DEFAULT_WORKERS
from trnopt.optimizer.search.space import INTERLEAVES, Space, divisors, prime_exponents
from trnopt.optimizer.cost.steptime import (BACKWARD_SHARE, compute_time, ep_alltoalls_per_layer,
                                       tp_collectives_per_layer)

TICKS_PER_COMPUTE = 2**24  # ticks in the best compute time
GOODPUT_SCALE = 2**24  # 1/goodput in units of 2^-24: 6e-8 relative
OBJECTIVE_BITS = 50  # CP-SAT's objective bounds lose exactness far above 2^53 (doubles)


class SolverMismatch(AssertionError):
    """The CP-SAT objective and the cost model's score of the same layout disagree: a bug."""




@dataclass
class LnCResult:
    lnc: int
    status: str
    evaluation: Evaluation | None
    objective: float
    bound: float
    seconds: float
    runners_up: list[Evaluation] = field(default_factory=list)
    rounding: float = 0.0  # seconds: how far the integer objective may be from the cost model's


class LayoutModel(IntModel):
    """The CP-SAT model of one Space (one LNC, one domain count)."""

    def __init__(self, space: Space, memory_objective: bool = False, step_bound: float | None = None,
                 scoring: bool = False):
        """``step_bound`` (seconds) caps the step time; the goodput objective needs one (see _objective).
        ``scoring`` keeps every layout in (no HBM limit, no symmetry breaking), to score a given one."""
        self.space, self.problem = space, space.problem
        self.scoring = scoring
        self.step_bound = step_bound
        self.coarse_bits = 0
        super().__init__()
        self.memory_objective = memory_objective
        w, t = self.problem.workload, self.problem.target
        best_compute = min(compute_time(w, t, tp, "none", space.ranks, space.lnc) for tp in space.degrees["tp"])
        self.tick = best_compute / TICKS_PER_COMPUTE
        self._variables()
        self._constraints()
        self._objective()
        self._hint()

    # -- helpers ------------------------------------------------------------------------
    def ticks(self, seconds: float) -> int:
        return int(round(seconds / self.tick))

    # -- variables ----------------------------------------------------------------------
    def _variables(self):
        space = self.space
        axes = space.axes
        # placement: for each active dimension and axis, a one-hot over the axis size's divisors
        self.active = [d for d in DIMS if space.active(d)]
        self.axis_divisors = [divisors(a.size) for a in axes]
        self.place = {d: [self.one_hot(divs, f"{d}@{a.name}") for a, divs in zip(axes, self.axis_divisors)]
                      for d in self.active}
        # degrees: for each active dimension, a one-hot over its candidate degrees
        self.degree_values = {d: space.degrees[d] for d in self.active}
        self.deg = {d: self.one_hot(space.degrees[d], f"deg_{d}") for d in self.active}
        # the DP group of dense weights spans ep and dp's factors together
        self.dpg = None
        if "ep" in self.active and "dp" in self.active:
            self.dpg = [self.one_hot(divs, f"dpg@{a.name}") for a, divs in zip(axes, self.axis_divisors)]
        # memory plan: ZeRO stage, recomputation, micro-batch size, interleaved stages
        self.zero_values = tuple(self.problem.zero_stages)
        self.zero = self.one_hot(self.zero_values, "zero")
        self.rc = self.one_hot(RECOMPUTE, "recompute")
        self.micro = self.one_hot(space.micro_batches, "micro_batch")
        self.interleaves = INTERLEAVES if "pp" in self.active else (1,)
        self.inter = self.one_hot(self.interleaves, "interleave")
        # micro-batches per step
        self.m = self.var(1, self.problem.workload.training.global_batch, "micro_batches")

    def dp_index(self) -> Term:
        """Index of the total data parallelism (ep * dp) in ``self.dp_values``."""
        if len(self.dp_values) == 1:
            return const(0)
        if self._dp_index is None:
            self._dp_index = self.var(0, len(self.dp_values) - 1, "dp_index")
            self.model.add_element(self._dp_index.expr, self.dp_values, self.materialise(self.dp_total, "dpv").expr)
        return self._dp_index

    def zero_is(self, stage: int):
        """The literal 'ZeRO stage is ``stage``', or a constant when the stage is excluded or the only one."""
        if stage not in self.zero_values:
            return False
        if len(self.zero_values) == 1:
            return True
        return self.zero[self.zero_values.index(stage)]

    def degree(self, dim: str) -> Term:
        return self.value(self.deg[dim], self.degree_values[dim]) if dim in self.active else const(1)

    def degree_index(self, dim: str) -> tuple[list, tuple]:
        return (self.deg[dim], self.degree_values[dim]) if dim in self.active else ([True], (1,))

    def row_index(self, choice: list[list]) -> Term:
        """Mixed-radix index of a placement row, last axis fastest (itertools.product order)."""
        terms, stride = [], 1
        for bools in reversed(choice):
            terms.append(self.mul(self.index(bools), const(stride), "row"))
            stride *= len(bools)
        return self.add(*terms)

    def row_table(self, dim_choice: list[list] | None, fn, name: str) -> Term:
        """Look up fn(span) over every placement row of a dimension (or of the dense DP group)."""
        axes = self.space.axes
        if dim_choice is None:
            return const(fn(()), err=0.5)
        values = []
        for row in _rows(self.axis_divisors):
            values.append(fn(tuple((a, f) for a, f in zip(axes, row) if f > 1)))
        return self.table(self.row_index(dim_choice), values, name, err=0.5)

    # -- constraints --------------------------------------------------------------------
    def _constraints(self):
        space, md = self.space, self.model
        # every axis is shared out exactly: per prime, the dimensions' exponents add up
        for j, axis in enumerate(space.axes):
            divs = self.axis_divisors[j]
            for p, e in prime_exponents(axis.size).items():
                md.add(sum(prime_exponents(v).get(p, 0) * b for d in self.active
                           for v, b in zip(divs, self.place[d][j])) == e)
                if self.dpg is not None:
                    md.add(sum(prime_exponents(v).get(p, 0) * b for v, b in zip(divs, self.dpg[j]))
                           == sum(prime_exponents(v).get(p, 0) * b for d in ("ep", "dp")
                                  for v, b in zip(divs, self.place[d][j])))
        # identical neighbouring axes (the x and y of a torus) are interchangeable: keep only the
        # placements whose per-dimension factors on the first are lexicographically >= the second's
        for j in range(0 if self.scoring else len(space.axes) - 1):
            a0, a1 = space.axes[j], space.axes[j + 1]
            if (a0.kind, a0.size, a0.bandwidth, a0.latency) != (a1.kind, a1.size, a1.bandwidth, a1.latency):
                continue
            base = len(self.axis_divisors[j])
            keys = []
            for axis_j in (j, j + 1):
                keys.append(sum(base ** (len(self.active) - 1 - i) * k * b for i, d in enumerate(self.active)
                                for k, b in enumerate(self.place[d][axis_j])))
            md.add(keys[0] >= keys[1])
        # a dimension's degree is the product of its factors (exponents again)
        for d in self.active:
            for p in prime_exponents(space.ranks):
                md.add(sum(prime_exponents(v).get(p, 0) * b
                           for j, divs in enumerate(self.axis_divisors) for v, b in zip(divs, self.place[d][j]))
                       == sum(prime_exponents(v).get(p, 0) * b for v, b in zip(self.degree_values[d], self.deg[d])))
        # the global batch splits into dp * micro-batch * m
        self.dp_total = self.mul(self.degree("ep"), self.degree("dp"), "dp_total")
        self.dp_values = sorted({a * b for a in self.degree_values.get("ep", (1,))
                                 for b in self.degree_values.get("dp", (1,))})
        self._dp_index = None
        self.b = self.value(self.micro, self.space.micro_batches)
        self.v = self.value(self.inter, self.interleaves)
        batch = self.model.new_constant(self.problem.workload.training.global_batch)
        md.add_multiplication_equality(batch, [self.m.expr, self.materialise(self.dp_total, "dp").expr,
                                               self.materialise(self.b, "b").expr])
        layers = self.problem.workload.model.layers
        if len(self.interleaves) > 1:
            v2 = self.inter[1]
            pp_bools, pp_values = self.deg["pp"], self.degree_values["pp"]
            for value, b in zip(pp_values, pp_bools):
                if value == 1 or 2 * value > layers:
                    md.add_bool_or([b.Not(), v2.Not()])
            md.add_modulo_equality(0, self.m.expr, self.materialise(self.degree("pp"), "pp").expr).only_enforce_if(v2)
        self.memory = self._memory()
        if not self.scoring and not self.memory_objective:
            usable = int(self.problem.target.chip.hbm_bytes * (1 - self.problem.headroom))
            md.add(self.memory.expr <= usable)

    def _memory(self) -> Term:
        """Bytes per chip: ranks_per_chip * (state + activations) + reserve, as memory.py counts them."""
        w, space = self.problem.workload, self.space
        tr, mdl = w.training, w.model
        experts = mdl.expert_params()
        dense = mdl.total_params() - experts
        ranks, c = space.ranks, space.axes[0].size
        per_param = tr.state_bytes_per_param
        unsharded = {0: per_param, 1: tr.weight_bytes + tr.grad_bytes, 2: tr.weight_bytes, 3: 0}
        # state per rank = cp * (u(zero) * (P_d * dp + P_e * dp/ep) + (16 - u) * P) / ranks, with
        # the parameter shares per rank looked up by dp so that no term outgrows what it counts
        dp_index = self.dp_index()
        replicated = self.add(
            self.table(dp_index, [round(dense * dp / ranks) for dp in self.dp_values], "rep_d"),
            self.table(self.index(self.deg["dp"]) if "dp" in self.active else const(0),
                       [round(experts * d / ranks) for d in self.degree_values.get("dp", (1,))], "rep_e"))
        u = self.table(self.index(self.zero), [unsharded[z] for z in self.zero_values], "unsharded")
        s = self.table(self.index(self.zero), [per_param - unsharded[z] for z in self.zero_values], "sharded")
        state = self.add(self.mul(u, replicated, "state_rep"),
                         self.mul(s, const(round((dense + experts) / ranks)), "state_sh"))
        state = self.mul(self.degree("cp"), state, "state")
        # activations per rank = A(rc, tp, cp) * b * layers/stage * in-flight * interleave factor
        tp_b, tp_v = self.degree_index("tp")
        cp_b, cp_v = self.degree_index("cp")
        pp_b, pp_v = self.degree_index("pp")
        per_layer = []
        for rc in RECOMPUTE:
            for tp in tp_v:
                for cp in cp_v:
                    per_layer.append(int(round(activation_bytes_per_layer(w, tp, cp, 1, rc))))
        idx = self.add(self.mul(self.index(self.rc), const(len(tp_v) * len(cp_v)), "a_rc"),
                       self.mul(self.index(tp_b) if len(tp_v) > 1 else const(0), const(len(cp_v)), "a_tp"),
                       self.index(cp_b) if len(cp_v) > 1 else const(0))
        act = self.table(idx, per_layer, "act_layer")
        act = self.mul(act, self.b, "act_b")
        self.ls = self.table(self.index(pp_b) if len(pp_v) > 1 else const(0),
                             [math.ceil(mdl.layers / p) for p in pp_v], "layers_per_stage")
        act = self.mul(act, self.ls, "act_ls")
        pp = self.degree("pp")
        in_flight = pp if pp.constant and pp.lo == 1 else self.var(1, pp.hi, "in_flight")
        if not in_flight.constant:
            self.model.add_min_equality(in_flight.expr, [self.m.expr, self.materialise(pp, "pp").expr])
        act = self.mul(act, in_flight, "act_inflight")
        if len(self.interleaves) > 1:
            # (1 + (p-1)/(p v)) = (p v + p - 1) / (p v) when v = 2, else 1
            num = self.table(self.pair_index(pp_b, self.inter),
                             [(3 * p - 1) if v == 2 else 1 for p in pp_v for v in self.interleaves], "il_num")
            den = self.table(self.pair_index(pp_b, self.inter),
                             [(2 * p) if v == 2 else 1 for p in pp_v for v in self.interleaves], "il_den")
            act = self.div(self.mul(act, num, "act_il"), den, "act_il_div")
        reserve = int(round(self.problem.target.runtime_reserve_bytes))
        return self.add(self.mul(const(c), self.add(state, act), "per_chip"), const(reserve))

    # -- objective ----------------------------------------------------------------------
    def _objective(self):
        if self.memory_objective:
            self.model.minimize(self.memory.expr)
            self.step = None
            return
        self.step = self._step()
        objective = self.step
        if self.problem.objective == "goodput":
            # step / goodput as step * (2^24 / goodput). CP-SAT bounds the objective with
            # doubles, so the product must stay well below 2^53: the step is bounded (by the
            # step-time optimum's own objective, see solve_space) and counted in units of
            # 2^k ticks, k keeping the product under 2^50 with 26 significant bits of step.
            inverse = self._inverse_goodput()
            bound = self.ticks(self.step_bound) if self.step_bound else CAP
            self.model.add(self.step.expr <= bound)
            self.coarse_bits = max(0, bound.bit_length() + inverse.hi.bit_length() - OBJECTIVE_BITS)
            coarse = self.div(Term(self.step.expr, self.step.lo, bound, self.step.error), const(2**self.coarse_bits),
                              "coarse_step")
            objective = self.mul(coarse, inverse, "per_good_step", cap=2**62)
        self.objective = objective
        self.model.minimize(objective.expr)

    @property
    def objective_unit(self) -> float:
        """Seconds (of step, or of step / goodput) per unit of the integer objective."""
        if self.problem.objective == "goodput":
            return self.tick * 2**self.coarse_bits / GOODPUT_SCALE
        return self.tick

    def _step(self) -> Term:
        p, space = self.problem, self.space
        w, t = p.workload, p.target
        mdl, tr = w.model, w.training
        R, c, B, s, h, a = space.ranks, space.axes[0].size, tr.global_batch, tr.seq, mdl.hidden, tr.activation_bytes
        lat = True
        tp_b, tp_v = self.degree_index("tp")
        pp_b, pp_v = self.degree_index("pp")

        def coeff(op: str, span) -> tuple[float, float]:
            return cc.coefficients(op, span, c, lat) if span else (0.0, 0.0)

        # compute, by (recompute, tp)
        compute = self.table(self.pair_index(self.rc, tp_b) if len(tp_v) > 1 else self.index(self.rc),
                             [self.ticks(compute_time(w, t, tp, rc, R, space.lnc)) for rc in RECOMPUTE for tp in tp_v],
                             "compute", err=0.5)
        self.compute = compute
        rc_pp = self.pair_index(self.rc, pp_b) if len(pp_v) > 1 else self.index(self.rc)
        ls_of = [math.ceil(mdl.layers / pp) for pp in pp_v]
        ms_of = [math.ceil(mdl.moe_layers / pp) for pp in pp_v]
        n_tp = [tp_collectives_per_layer(rc) for rc in RECOMPUTE]
        n_ep = [ep_alltoalls_per_layer(rc) for rc in RECOMPUTE]
        m = self.m

        # TP: n(rc) * Ls * pp * X(row) + n(rc) * Ls * m * Y(row)
        tp_choice = self.place.get("tp")
        hidden = p.overlap

        def tp_x(span):
            k, _ = coeff("all_reduce", span)
            tp = math.prod(f for _, f in span)
            return self.ticks((1 - tp_hidden(hidden, span)) * B * tp * s * h * a * k / R)

        def tp_y(span):
            _, lam = coeff("all_reduce", span)
            return self.ticks((1 - tp_hidden(hidden, span)) * lam)

        np_ = self.table(rc_pp, [n * ls * pp for n in n_tp for ls, pp in zip(ls_of, pp_v)], "tp_np")
        nl_ = self.table(rc_pp, [n * ls for n in n_tp for ls in ls_of], "tp_nl")
        tp_term = self.add(self.mul(np_, self.row_table(tp_choice, tp_x, "tp_x"), "tp_bw"),
                           self.mul(nl_, self.mul(m, self.row_table(tp_choice, tp_y, "tp_y"), "tp_my"), "tp_lat"))

        # CP: 2 Ls pp max(kv, tp) X(row) + 2 Ls m Y(row)
        terms = [compute, tp_term]
        if "cp" in self.active:
            kvd = mdl.head_dim * 2 * a

            def cp_x(span):
                k, _ = coeff("all_gather", span)
                cp = math.prod(f for _, f in span)
                return self.ticks(B * cp * s * kvd * k / R)

            def cp_y(span):
                return self.ticks(coeff("all_gather", span)[1])

            kv = self.table(self.index(tp_b) if len(tp_v) > 1 else const(0), [max(mdl.kv_heads, tp) for tp in tp_v], "kv")
            lspp = self.table(self.index(pp_b) if len(pp_v) > 1 else const(0),
                              [2 * ls * pp for ls, pp in zip(ls_of, pp_v)], "cp_lspp")
            terms.append(self.add(
                self.mul(self.mul(lspp, kv, "cp_k"), self.row_table(self.place["cp"], cp_x, "cp_x"), "cp_bw"),
                self.mul(self.mul(const(2), self.ls, "cp_2ls"), self.mul(m, self.row_table(self.place["cp"], cp_y, "cp_y"),
                                                                          "cp_my"), "cp_lat")))

        # EP: n(rc) * Ms * pp * X(row) + n(rc) * Ms * m * Y(row)
        if "ep" in self.active:
            k_top = mdl.moe.top_k

            def ep_x(span):
                return self.ticks(B * s * k_top * h * a * coeff("all_to_all", span)[0] / R)

            def ep_y(span):
                return self.ticks(coeff("all_to_all", span)[1])

            nmp = self.table(rc_pp, [n * ms * pp for n in n_ep for ms, pp in zip(ms_of, pp_v)], "ep_nmp")
            nm = self.table(rc_pp, [n * ms for n in n_ep for ms in ms_of], "ep_nm")
            terms.append(self.add(self.mul(nmp, self.row_table(self.place["ep"], ep_x, "ep_x"), "ep_bw"),
                                  self.mul(nm, self.mul(m, self.row_table(self.place["ep"], ep_y, "ep_y"), "ep_my"),
                                           "ep_lat")))

        # pipeline sends: v * X(row) + v * m * Y(row)
        if "pp" in self.active:
            def pp_x(span):
                pp = math.prod(f for _, f in span)
                return self.ticks(2 * B * pp * s * h * a * coeff("p2p", span)[0] / R)

            def pp_y(span):
                return self.ticks(2 * coeff("p2p", span)[1])

            terms.append(self.mul(self.v, self.add(self.row_table(self.place["pp"], pp_x, "pp_x"),
                                                   self.mul(m, self.row_table(self.place["pp"], pp_y, "pp_y"), "pp_my")),
                                  "pp_send"))
        work = self.materialise(self.add(*terms), "work")
        self.work = work

        # bubble = (pp - 1) * W / (v * m)
        step = [work]
        if "pp" in self.active:
            pm1 = Term(self.degree("pp").expr - 1, 0, max(pp_v) - 1)
            step.append(self.div(self.mul(pm1, work, "bubble_n"), self.mul(self.v, m, "bubble_d"), "bubble"))

        # DP: gradients of dense weights over ep x dp, of experts over dp
        g, wb = tr.grad_bytes, tr.weight_bytes
        experts = mdl.expert_params()
        dense = mdl.total_params() - experts
        dense_group = self.dpg if self.dpg is not None else self.place.get("ep") or self.place.get("dp")
        cp_deg = self.degree("cp")

        def scaled(op, params, per_param):
            def x(span):
                n = math.prod(f for _, f in span)
                return self.ticks(per_param * params * n * coeff(op, span)[0] / R)

            def y(span):
                return self.ticks(coeff(op, span)[1])
            return x, y

        def group_time(op, per_param, name):
            dx, dy = scaled(op, dense, per_param)
            ex, ey = scaled(op, experts, per_param)
            parts = [self.mul(cp_deg, self.row_table(dense_group, dx, name + "_dx"), name + "_dcp"),
                     self.row_table(dense_group, dy, name + "_dy")]
            if experts:
                parts += [self.mul(cp_deg, self.row_table(self.place.get("dp"), ex, name + "_ex"), name + "_ecp"),
                          self.row_table(self.place.get("dp"), ey, name + "_ey")]
            return self.materialise(self.add(*parts), name)

        z3 = self.zero_is(3)
        if dense_group is not None:
            dp_full = group_time("all_reduce", g, "dp")
            half = self.div(dp_full, const(2), "dp_half")
            dp_total = self.var(0, dp_full.hi, "dp_comm", error=dp_full.error)
            self.select(z3, dp_total, half.expr, dp_full.expr)
            bw12 = self.table(self.index(self.rc), [int(round(12 * BACKWARD_SHARE[rc])) for rc in RECOMPUTE], "bw12")
            window = self.div(self.mul(work, bw12, "window_n"), self.mul(const(12), m, "window_d"), "window")
            first = self.div(dp_total, self.ls, "dp_bucket")
            rest = Term(dp_total.expr - window.expr, -window.hi, dp_total.hi, self.add(dp_total, window).error)
            step.append(self.maximum(first, rest, "dp_exposed"))

            # ZeRO-3: 2 m gathers of the weights per step, hidden under compute but the first layer
            # zero unless ZeRO-3 before any product, so that a huge gather time cannot exclude
            # the layouts that do not gather at all
            gather_time = group_time("all_gather", wb, "z3")
            gather = self.var(0, gather_time.hi, "z3_gather", error=gather_time.error)
            self.select(z3, gather, gather_time.expr, 0)
            gathers = self.mul(const(2), self.mul(m, gather, "z3_m"), "z3_all")
            z3_first = self.div(gather, self.ls, "z3_first")
            z3_rest = Term(gathers.expr - compute.expr, -compute.hi, gathers.hi, self.add(gathers, compute).error)
            step.append(self.maximum(z3_first, z3_rest, "zero3"))

        # optimizer: reads and writes the rank's (sharded) state once at HBM bandwidth
        per_byte = 2 * tr.state_bytes_per_param * c / t.chip.hbm_bandwidth / R
        sharded = self.ticks(per_byte * (dense + experts))  # rounded: err 0.5
        z0 = self.zero_is(0)
        unsharded = self.add(self.mul(const(self.ticks(per_byte * dense), 0.5), self.dp_total, "opt_d"),
                             self.mul(const(self.ticks(per_byte * experts), 0.5), self.degree("dp"), "opt_e"))
        opt = self.var(0, max(unsharded.hi, sharded), "opt", error=lambda value: max(unsharded.error(value), 0.5))
        self.select(z0, opt, unsharded.expr, sharded)
        step.append(self.mul(cp_deg, opt, "opt_cp"))
        return self.materialise(self.add(*step), "step")

    def _inverse_goodput(self) -> Term:
        """GOODPUT_SCALE / goodput, by (ZeRO >= 1, dp): checkpoints are written by every chip when the
        state is sharded over DP, by one replica's chips otherwise (evaluate.checkpoint_writer_chips)."""
        p, space = self.problem, self.space
        chips = space.ranks // space.axes[0].size
        ckpt = checkpoint_bytes(p.workload)
        dp_values = self.dp_values
        table = []
        for zero in self.zero_values:
            for dp in dp_values:
                writers = chips if zero >= 1 else max(1, chips // dp)
                good = reliability(p.target, chips, ckpt, writers).goodput
                table.append(int(round(GOODPUT_SCALE / max(good, 1e-9))))
        return self.table(self.add(self.mul(self.index(self.zero), const(len(dp_values)), "gz"), self.dp_index()),
                          table, "inv_goodput", err=0.5)

    # -- hint ---------------------------------------------------------------------------
    def _hint(self):
        """A greedy layout as the starting point (``greedy_layout``)."""
        hint = greedy_layout(self.space)
        if hint is None:
            return
        for d in self.active:
            row = hint.placement[DIMS.index(d)]
            for j, bools in enumerate(self.place[d]):
                for v, b in zip(self.axis_divisors[j], bools):
                    self.model.add_hint(b, v == row[j])
            value = math.prod(row)
            for v, b in zip(self.degree_values[d], self.deg[d]):
                self.model.add_hint(b, v == value)
        for v, b in zip(self.zero_values, self.zero):
            self.model.add_hint(b, v == hint.zero)
        for v, b in zip(RECOMPUTE, self.rc):
            self.model.add_hint(b, v == hint.recompute)
        for v, b in zip(self.space.micro_batches, self.micro):
            self.model.add_hint(b, v == hint.micro_batch)

    # -- reading a solution ---------------------------------------------------------------
    def layout(self, solver: cp_model.CpSolver) -> Layout:
        rows = []
        for d in DIMS:
            if d in self.active:
                rows.append(tuple(divs[next(i for i, b in enumerate(bools) if solver.boolean_value(b))]
                                  for divs, bools in zip(self.axis_divisors, self.place[d])))
            else:
                rows.append((1,) * len(self.space.axes))
        deg = {d: math.prod(r) for d, r in zip(DIMS, rows)}

        def pick(values, bools):
            return values[next(i for i, b in enumerate(bools) if solver.boolean_value(b))]

        return Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["dp"] * deg["ep"], ep=deg["ep"], cp=deg["cp"],
                      axes=self.space.axes, placement=tuple(rows), zero=pick(self.zero_values, self.zero),
                      recompute=pick(RECOMPUTE, self.rc), micro_batch=pick(self.space.micro_batches, self.micro),
                      interleave=pick(self.interleaves, self.inter), lnc=self.space.lnc)

    def fix(self, layout: Layout):
        """Pin every decision to ``layout`` (to score one layout with the model, or to debug it)."""
        for d in self.active:
            row = layout.placement[DIMS.index(d)]
            for j, bools in enumerate(self.place[d]):
                for v, b in zip(self.axis_divisors[j], bools):
                    self.model.add(b == (v == row[j]))
        for values, bools, chosen in ((self.zero_values, self.zero, layout.zero), (RECOMPUTE, self.rc, layout.recompute),
                                      (self.space.micro_batches, self.micro, layout.micro_batch),
                                      (self.interleaves, self.inter, layout.interleave)):
            for v, b in zip(values, bools):
                self.model.add(b == (v == chosen))

    def forbid_degrees(self, layout: Layout):
        """Exclude this combination of degrees (for the runner-up solves)."""
        lits = []
        for d in self.active:
            value = layout.placement_degree(d)
            lits += [b.Not() for v, b in zip(self.degree_values[d], self.deg[d]) if v == value]
        if lits:
            self.model.add_bool_or(lits)


def _rows(axis_divisors: list[tuple[int, ...]]):
    return itertools.product(*axis_divisors)


def greedy_layout(space: Space) -> Layout | None:
    """TP on the fastest axes (8 ranks, else the nearest degree), the rest data parallel; the first
    plan that fits."""
    p = space.problem
    for tp in sorted(space.degrees["tp"], key=lambda t: (abs(math.log2(t / 8)), -t)):
        for zero, rc in ((1, "selective"), (1, "full"), (3, "full")):
            dp = space.ranks // tp
            try:
                rows = default_placement(space.axes, {"tp": tp, "dp": dp})
                layout = Layout(tp=tp, pp=1, dp=dp, axes=space.axes, placement=rows, zero=zero, recompute=rc,
                                micro_batch=1, lnc=space.lnc)
            except Exception:  # the degrees may not tile these axes; try the next
                continue
            if layout.workload_problems(p.workload):
                continue
            if p.evaluate(layout).fits:
                return layout
    return None


STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
          cp_model.MODEL_INVALID: "MODEL_INVALID", cp_model.UNKNOWN: "UNKNOWN"}


def _solver(time_limit: float, workers: int, seed: int, interleave: bool = True) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    # interleaved search makes several workers deterministic for a fixed seed and count
    solver.parameters.interleave_search = interleave and workers > 1
    return solver


def solve_space(space: Space, time_limit: float = 60.0, workers: int = DEFAULT_WORKERS, seed: int = 0,
                runners_up: int = 0, cutoff: float | None = None) -> LnCResult:
    """Solve one LNC's space; re-score the answer with the cost model and check they agree.

    ``cutoff`` (the objective of a layout found elsewhere, e.g. at another LNC) keeps only
    layouts at least as good: status NO_BETTER then proves there is none, usually at once.
    """
    start = time.perf_counter()
    p = space.problem
    bound = None
    if p.objective == "goodput":
        # the step-time optimum S with goodput g bounds the goodput optimum's step: S / g / min goodput
        first = solve_space(Space(replace(p, objective="step-time"), space.lnc), time_limit / 2, workers, seed)
        if first.evaluation is None:
            return first
        bound = objective_value(first.evaluation, "goodput") * 1.000001 + 1e-12
        time_limit = max(1.0, time_limit - (time.perf_counter() - start))
    if cutoff is not None:
        # Prove first that nothing beats the cutoff, usually at once. Without interleaving:
        # CP-SAT 9.15 aborts ("heuristics.fixed_search != nullptr") when an interleaved search
        # meets a model that the cutoff makes infeasible. If something better exists, the
        # ordinary solve below finds it, deterministically.
        probe = LayoutModel(space, step_bound=bound)
        probe.model.add(probe.objective.expr <= math.floor(cutoff * (1 + 1e-6) / probe.objective_unit) + 1)
        if STATUS[_solver(time_limit, workers, seed, interleave=False).solve(probe.model)] == "INFEASIBLE":
            return LnCResult(space.lnc, "NO_BETTER", None, math.inf, math.inf, time.perf_counter() - start)
        time_limit = max(1.0, time_limit - (time.perf_counter() - start))
    lm = LayoutModel(space, step_bound=bound)
    solver = _solver(time_limit, workers, seed)
    status = STATUS[solver.solve(lm.model)]
    if status not in ("OPTIMAL", "FEASIBLE"):
        return LnCResult(space.lnc, status, None, math.inf, math.inf, time.perf_counter() - start)
    layout = lm.layout(solver)
    e = p.evaluate(layout)
    check_agreement(lm, solver, e)
    objective = objective_value(e, p.objective)
    scale = objective / solver.objective_value if solver.objective_value else 0.0
    result = LnCResult(space.lnc, status, e, objective, solver.best_objective_bound * scale,
                       time.perf_counter() - start, rounding=lm.objective.error(solver.value) * lm.objective_unit)
    for _ in range(runners_up):
        lm.forbid_degrees(result.runners_up[-1].layout if result.runners_up else layout)
        lm.model.clear_hints()
        # one worker: deterministic, and clear of the interleaved-search abort noted above
        sub = _solver(max(1.0, time_limit / 10), 1, seed)
        if STATUS[sub.solve(lm.model)] not in ("OPTIMAL", "FEASIBLE"):
            break
        result.runners_up.append(p.evaluate(lm.layout(sub)))
    return result


def check_agreement(lm: LayoutModel, solver: cp_model.CpSolver, e: Evaluation):
    """The solver's integer objective must equal the cost model's score within the rounding
    bound the model carries (Term.err) plus float noise; anything more is a bug."""
    expected = objective_value(e, lm.problem.objective) / lm.objective_unit
    tolerance = lm.objective.error(solver.value) + 1e-9 * expected + 1
    if abs(expected - solver.objective_value) > tolerance:
        raise SolverMismatch(f"CP-SAT objective {solver.objective_value:.0f} ticks vs cost model {expected:.0f} "
                             f"for {e.layout.describe()} [{e.layout.placement_text()}]")


def score_layout(space: Space, layout: Layout, workers: int = 1) -> tuple[float, float]:
    """(objective, rounding) of one layout in the CP-SAT model, in the objective's seconds."""
    lm = LayoutModel(space, scoring=True)
    lm.fix(layout)
    solver = _solver(30.0, workers, 0)
    if STATUS[solver.solve(lm.model)] != "OPTIMAL":
        raise SolverMismatch(f"the model rejects {layout.describe()} [{layout.placement_text()}]")
    return solver.objective_value * lm.objective_unit, lm.objective.error(solver.value) * lm.objective_unit


def minimum_memory(space: Space, time_limit: float = 10.0, workers: int = DEFAULT_WORKERS, seed: int = 0) -> float | None:
    """A floor on the memory per chip (bytes) every layout of the space needs, HBM limit ignored:
    the least memory when proven within the time limit, else CP-SAT's proven bound."""
    lm = LayoutModel(space, memory_objective=True)
    solver = _solver(time_limit, workers, seed, interleave=False)  # the bound is the answer, not the layout
    if STATUS[solver.solve(lm.model)] not in ("OPTIMAL", "FEASIBLE"):
        return None
    return solver.best_objective_bound


def fits(space: Space, time_limit: float = 20.0, workers: int = DEFAULT_WORKERS, seed: int = 0) -> bool | None:
    """Whether some layout of the space fits the HBM limit (None: undecided within the time limit)."""
    lm = LayoutModel(space, memory_objective=True)
    lm.model.add(lm.memory.expr <= int(space.problem.target.chip.hbm_bytes * (1 - space.problem.headroom)))
    lm.model.clear_objective()
    solver = _solver(time_limit, workers, seed, interleave=False)  # yes or no, not a layout
    status = STATUS[solver.solve(lm.model)]
    return {"OPTIMAL": True, "FEASIBLE": True, "INFEASIBLE": False}.get(status)
