"""The CP-SAT model of one Space: placement, degrees and memory plan, exact on the cost model.

Over ~500 lines: the model's variables, its rules and the readers and writers of its
literals (layout, hint, fix, restricted, canonical) share the literal families' layout;
split, each part would reach into the others' internals.

Formulation, and why: one variable family per decision, and the cost model's own trees
(cost/steptime.py ``step_terms``, cost/memory.py ``memory_terms``), whose factors each
depend on one decision, tabulated over that decision's values and multiplied as integers
(search/tabulate.py). The model therefore grows with the sum of the choices (most tables
are one dimension's placement row, a few hundred entries; the TP and CP collectives', timed
at their message size, are a row by CP degree by micro-batch size, up to some tens of
thousands, which a branch's restricted copy narrows at once) and never with their
product, and no formula of the cost model is restated here. A log-domain linearisation
would make the objective linear but only approximately (it needs exp), and then CP-SAT's
optimum could differ from brute force's; integer products keep it exact.

Times are integers in ticks of 2^-24 of the step's compute at peak (a floor on any layout's), memory in bytes. Every
term carries a bound on what rounding its table entries moved it (intmodel.Term.error,
evaluated at the solution); the answer is re-scored by the float cost model and a
disagreement beyond that bound raises SolverMismatch. Placement factors are tied to the
axis sizes exactly through their prime exponents (linear constraints).

Names: the placement rows are those of Layout (tp, cp, ep, dp, pp), whose dp row places
the edp = dp // ep expert-data replicas; here that family is called edp, and dp is every
data-parallel rank (ep x edp), as everywhere in trnopt.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection

import numpy as np
from ortools.sat.python import cp_model

from trnopt.optimizer.cost.evaluate import Evaluation, inverse_goodput
from trnopt.optimizer.cost.memory import memory_terms
from trnopt.optimizer.cost.steptime import TERMS, ideal_compute_time, step_terms
from trnopt.optimizer.model.layout import DIMS, Layout, every_nth
from trnopt.optimizer.search.intmodel import CAP, IntModel, Term, const
from trnopt.optimizer.model.placement import instance_prefix
from trnopt.optimizer.search.space import Space, divisors, prime_exponents
from trnopt.optimizer.search.solver import BoundedSolver
from trnopt.optimizer.search.placements import PLACED, axis_key, canonical, interchangeable
from trnopt.optimizer.search.spacebounds import SPANS
from trnopt.optimizer.search.tabulate import Tabulator

TICKS_PER_COMPUTE = 2**24  # ticks in the compute at peak
GOODPUT_SCALE = 2**24  # 1/goodput in units of 2^-24: 6e-8 relative
OBJECTIVE_BITS = 50  # CP-SAT's objective bounds lose exactness far above 2^53 (doubles)


class SolverMismatch(AssertionError):
    """The CP-SAT objective and the cost model's score of the same layout disagree: a bug."""


class LayoutModel(IntModel):
    """The CP-SAT model of one Space (one LNC, one domain count)."""

    def __init__(self, space: Space, memory_objective: bool = False, step_bound: float | None = None,
                 scoring: bool = False):
        """``memory_objective`` minimises memory (HBM limit off); ``step_bound`` (seconds) caps the
        step time, which the goodput objective needs (see _objective); ``scoring`` keeps every
        layout in (no HBM limit, no symmetry breaking), to score a given one."""
        super().__init__()
        # -- data ---------------------------------------------------------------------------
        self.space, self.problem = space, space.problem
        self.scoring, self.step_bound, self.memory_objective = scoring, step_bound, memory_objective
        w, t = self.problem.workload, self.problem.target
        self.steps = step_terms(w, t, space.axes, space.lnc, self.problem.overlap)
        self.memories = memory_terms(w, t, space.axes)
        self.tick = ideal_compute_time(w, t, space.ranks, space.lnc) / TICKS_PER_COMPUTE
        self.coarse_bits = 0
        self._codes: list | None = None  # _table_codes, built on the first restricted copy
        self._variables()
        self.tabulator = Tabulator(self, self.domain, self.direct)
        self._constraints()
        self._objective()

    # -- variables ----------------------------------------------------------------------------
    def _variables(self):
        space, axes = self.space, self.space.axes
        degrees = {"tp": space.degrees["tp"], "cp": space.degrees["cp"], "ep": space.degrees["ep"],
                   "edp": space.degrees["dp"], "pp": space.degrees["pp"]}
        self.active = [d for d in PLACED if len(degrees[d]) > 1]
        self.axis_divisors = [divisors(a.size) for a in axes]
        # placement: per active family and axis, a one-hot over the axis size's divisors
        self.place = {d: [self.one_hot(divs, f"{d}@{a.name}") for a, divs in zip(axes, self.axis_divisors)]
                      for d in self.active}
        # the dense gradients' group spans ep and edp's factors together
        self.dense_group = None
        if "ep" in self.active and "edp" in self.active:
            self.dense_group = [self.one_hot(divs, f"dp@{a.name}") for a, divs in zip(axes, self.axis_divisors)]
        # degrees: per active family, a one-hot over its candidates
        self.degree_values = {d: degrees[d] for d in self.active}
        self.deg = {d: self.one_hot(degrees[d], f"deg_{d}") for d in self.active}
        # memory plan: ZeRO stage, recomputation, micro-batch size, interleaved stages
        self.zero_values = tuple(self.problem.zero_stages)
        self.zero = self.one_hot(self.zero_values, "zero")
        self.recompute_values = tuple(self.problem.recompute)
        self.rc = self.one_hot(self.recompute_values, "recompute")
        self.micro = self.one_hot(space.micro_batches, "micro_batch")
        self.interleaves = space.interleaves if "pp" in self.active else (1,)
        self.inter = self.one_hot(self.interleaves, "interleave")
        self.hsdp_values = space.hsdp_values
        self.hsdp = self.one_hot(self.hsdp_values, "hsdp")
        # micro-batches per step
        self.m = self.var(1, self.problem.workload.training.global_batch, "micro_batches")
        # dp = ep * edp, and its index among the products of the candidates
        self.dp_values = sorted({a * b for a in degrees["ep"] for b in degrees["edp"]})
        self.dp = self.materialise(self.mul(self.degree("ep"), self.degree("edp"), "dp"), "dp")
        self.dp_index = const(0)
        if len(self.dp_values) > 1:
            self.dp_index = self.var(0, len(self.dp_values) - 1, "dp_index")
            self.model.add_element(self.dp_index.expr, self.dp_values, self.dp.expr)
        self.spans = {key: self._spans(families) for key, families in SPANS.items()}

    def _spans(self, families: tuple[str, ...]) -> tuple[list | None, list]:
        """(the one-hots of the group's row, the span of every row in row-index order)."""
        if len(families) == 2:
            choice = self.dense_group if self.dense_group is not None else (
                self.place.get("ep") or self.place.get("edp"))
        else:
            choice = self.place.get(families[0])
        if choice is None:
            return None, [()]
        axes = self.space.axes
        rows = itertools.product(*self.axis_divisors)
        return choice, [tuple((a, n) for a, n in zip(axes, row) if n > 1) for row in rows]

    def degree(self, family: str) -> Term:
        return self.value(self.deg[family], self.degree_values[family]) if family in self.active else const(1)

    # -- the decisions' domains, for the tabulator ----------------------------------------------
    def domain(self, key: str) -> tuple[Term, list]:
        """(index, values) of one decision (factors.decisions names them)."""
        if key in self.spans:
            choice, spans = self.spans[key]
            return (self.row_index(choice) if choice is not None else const(0)), spans
        if key == "dp":
            return self.dp_index, self.dp_values
        if key == "ep_fold":  # the search places experts as TP does (expert TP = TP); folded EP is evaluated only
            return const(0), [1]
        one_hots = {"recompute": (self.rc, self.recompute_values), "zero": (self.zero, self.zero_values),
                    "micro_batch": (self.micro, self.space.micro_batches),
                    "interleave": (self.inter, self.interleaves), "hsdp": (self.hsdp, self.hsdp_values)}
        if key in one_hots:
            bools, values = one_hots[key]
            return self.index(bools), list(values)
        if key in self.active:
            return self.index(self.deg[key]), list(self.degree_values[key])
        if key in PLACED:
            return const(0), [1]
        raise KeyError(f"no decision named {key!r} in the layout model")

    def direct(self, key: str) -> Term:
        """The variable of an integer decision itself."""
        if key == "micro_batches":
            return self.m
        if key == "dp":
            return self.dp
        if key in PLACED:
            return self.degree(key)
        if key in ("micro_batch", "interleave"):
            index, values = self.domain(key)
            return self.value(self.micro if key == "micro_batch" else self.inter, tuple(values))
        raise KeyError(f"no integer decision named {key!r} in the layout model")

    def row_index(self, choice: list[list]) -> Term:
        """Mixed-radix index of a placement row, last axis fastest (itertools.product order)."""
        terms, stride = [], 1
        for bools in reversed(choice):
            terms.append(self.mul(self.index(bools), const(stride), "row"))
            stride *= len(bools)
        return self.add(*terms)

    # -- constraints ----------------------------------------------------------------------------
    def _constraints(self):
        space, md = self.space, self.model
        for j, axis in enumerate(space.axes):
            divs = self.axis_divisors[j]
            for p, e in prime_exponents(axis.size).items():
                # every axis is shared out exactly: per prime, the families' exponents add up
                md.add(sum(prime_exponents(v).get(p, 0) * b for d in self.active
                           for v, b in zip(divs, self.place[d][j])) == e)
                # the dense gradients' group takes what ep and edp take on every axis
                if self.dense_group is not None:
                    md.add(sum(prime_exponents(v).get(p, 0) * b for v, b in zip(divs, self.dense_group[j]))
                           == sum(prime_exponents(v).get(p, 0) * b for d in ("ep", "edp")
                                  for v, b in zip(divs, self.place[d][j])))
        for j in () if self.scoring else self.interchangeable():
            # identical neighbouring axes (a torus's x and y) are interchangeable: keep the
            # placements whose factors on the first are lexicographically >= the second's
            md.add(self._axis_key(j, lambda d, jj: sum(k * b for k, b in enumerate(self.place[d][jj])))
                   >= self._axis_key(j + 1, lambda d, jj: sum(k * b for k, b in enumerate(self.place[d][jj]))))
        for d in self.active:
            for p in prime_exponents(space.ranks):
                # a family's degree is the product of its factors (exponents again)
                md.add(sum(prime_exponents(v).get(p, 0) * b
                           for j, divs in enumerate(self.axis_divisors) for v, b in zip(divs, self.place[d][j]))
                       == sum(prime_exponents(v).get(p, 0) * b for v, b in zip(self.degree_values[d], self.deg[d])))
        # the global batch splits into dp * micro-batch * m
        batch = md.new_constant(self.problem.workload.training.global_batch)
        b = self.materialise(self.value(self.micro, self.space.micro_batches), "b")
        md.add_multiplication_equality(batch, [self.m.expr, self.dp.expr, b.expr])
        if "ep" in self.active and "cp" in self.active and not self.problem.rules.expert_with_context:
            # expert groups must not take context ranks (Rules.expert_with_context)
            ep_one = self.deg["ep"][list(self.degree_values["ep"]).index(1)] if 1 in self.degree_values["ep"] else None
            cp_one = self.deg["cp"][list(self.degree_values["cp"]).index(1)] if 1 in self.degree_values["cp"] else None
            md.add_bool_or([lit for lit in (ep_one, cp_one) if lit is not None])
        if len(self.interleaves) > 1:
            pp = self.materialise(self.degree("pp"), "pp")
            for v, v_lit in zip(self.interleaves, self.inter):
                if v == 1:
                    continue
                for value, pp_lit in zip(self.degree_values["pp"], self.deg["pp"]):
                    # interleaving needs pipeline stages, made of the layers as the framework splits them
                    if value == 1 or not self.space.stages_ok(value, v):
                        md.add_bool_or([pp_lit.Not(), v_lit.Not()])
                # interleaved 1F1B runs the micro-batches in groups of pp
                md.add_modulo_equality(0, self.m.expr, pp.expr).only_enforce_if(v_lit)
        stage_layers = self.problem.workload.model.layers
        pp_values = self.degree_values["pp"] if "pp" in self.active else (1,)
        for rc, rc_lit in zip(self.recompute_values, self.rc):
            n = every_nth(rc)
            for value, pp_lit in zip(pp_values, self.deg["pp"] if "pp" in self.active else [None]):
                # every n-th layer recomputed: n divides the layers of a stage
                if n and math.ceil(stage_layers / value) % n:
                    md.add_bool_or([rc_lit.Not()] + ([pp_lit.Not()] if pp_lit is not None else []))
        if len(self.hsdp_values) > 1:
            self._hsdp()
        if self.problem.instance_blocks:
            self._instance_blocks()
        self.memory = self.add(*(self.tabulator.compile(e, 1.0) for e in self.memories.values()))
        if not self.scoring and not self.memory_objective:
            # the plan fits the HBM less the headroom
            usable = int(self.problem.target.chip.hbm_bytes * (1 - self.problem.headroom))
            md.add(self.memory.expr <= usable)

    def interchangeable(self) -> list[int]:
        """Each j whose axes j and j + 1 are identical (kind, size, bandwidth, latency)."""
        return interchangeable(self.space.axes)

    def _axis_key(self, j: int, factor_index):
        return axis_key(self.active, self.axis_divisors, j, factor_index)

    def canonical(self, rows: dict[str, tuple[int, ...]]) -> bool:
        """Whether a placement (family -> row) keeps the symmetry rule of _constraints."""
        return canonical(self.space.axes, self.active, self.axis_divisors, rows)

    def _hsdp(self):
        """HSDP's rules, enforced by its literal (space.Space.layouts holds the same ones)."""
        md, on = self.model, self.hsdp[self.hsdp_values.index(True)]
        edp = self.place.get("edp")
        if edp is None:  # no data parallelism to replicate
            md.add(on == 0)
            return
        # the replicas are dp's factor on the scale-out axis: more than one
        md.add(edp[-1][0] == 0).only_enforce_if(on)
        # and the shards span more than one rank: some factor > 1 inside the domain
        md.add_bool_or([row[0].Not() for row in edp[:-1]] + [on.Not()])
        # the sharded state needs ZeRO; HSDP with expert parallelism is not modelled
        for z, lit in zip(self.zero_values, self.zero):
            if z == 0:
                md.add_bool_or([lit.Not(), on.Not()])
        if "ep" in self.active:
            md.add(self.deg["ep"][list(self.degree_values["ep"]).index(1)] == 1).only_enforce_if(on)

    def _instance_blocks(self):
        """Every instance holds one block of consecutive ranks (torchrun's numbering).

        The ranks' digits run in rank order (tp, cp, ep, edp, pp; within a family, axes fastest
        first), and the digits the families put on one axis nest there: after family i the
        axis's positions taken multiply to P_i. An instance holds the first k of axis j's
        positions (all of the core axis, none of the scale-out axis, a prefix of a domain
        axis). Family i's digit on axis j is inside the instance when P_i divides k, outside
        when k divides P_(i-1), split (the rest of the inside, then outside) when P_(i-1)
        divides k and k divides P_i; any other digit straddles the boundary. The block rule:
        no digit straddles, and no family with an outside digit comes before one with an
        inside digit (space.instance_blocks_hold, the same rule on one layout). Divisibility is
        read off prime exponents, so it stays linear."""
        md = self.model
        families = self.active
        inside_sizes = instance_prefix(self.space.axes, self.problem.target.chips_per_instance)
        has_in = {d: [] for d in families}
        has_out = {d: [] for d in families}
        for j, k in enumerate(inside_sizes):
            divs, k_exp = self.axis_divisors[j], prime_exponents(k)
            primes = sorted(set(prime_exponents(self.space.axes[j].size)) | set(k_exp))
            cumulative = {p: 0 for p in primes}
            divides_k, k_divides = [True], [k == 1]  # P_(-1) = 1
            for i, d in enumerate(families):
                for p in primes:
                    cumulative[p] = cumulative[p] + sum(prime_exponents(v).get(p, 0) * b
                                                        for v, b in zip(divs, self.place[d][j]))
                a_lit, b_lit = md.new_bool_var(f"{d}@{j}|k"), md.new_bool_var(f"k|{d}@{j}")
                over = [md.new_bool_var(f"{d}@{j}>{p}") for p in primes]
                for p, o in zip(primes, over):
                    # o: P_i has more of prime p than k (so P_i does not divide k)
                    md.add(cumulative[p] >= k_exp.get(p, 0) + 1).only_enforce_if(o)
                    md.add(cumulative[p] <= k_exp.get(p, 0)).only_enforce_if(o.Not())
                md.add_bool_or([a_lit, *over])                   # P_i | k unless some prime is over
                for o in over:
                    md.add_implication(a_lit, o.Not())
                under = [md.new_bool_var(f"{d}@{j}<{p}") for p in primes]
                for p, u in zip(primes, under):
                    # u: P_i has less of prime p than k (so k does not divide P_i)
                    md.add(cumulative[p] <= k_exp.get(p, 0) - 1).only_enforce_if(u)
                    md.add(cumulative[p] >= k_exp.get(p, 0)).only_enforce_if(u.Not())
                md.add_bool_or([b_lit, *under])
                for u in under:
                    md.add_implication(b_lit, u.Not())
                used = self.place[d][j][0].Not()  # the factor is more than 1 (divs[0] == 1)
                prev_a, prev_b = divides_k[-1], k_divides[-1]
                split = md.new_bool_var(f"{d}@{j}split")
                md.add_bool_and([b_lit] + ([prev_a] if prev_a is not True else [])).only_enforce_if(split)
                if prev_a is not True:
                    md.add_bool_or([split.Not(), prev_a])
                # a digit is inside, outside or split: never across the boundary
                options = [a_lit, split] + ([] if prev_b is False else [prev_b] if prev_b is not True else [])
                if prev_b is not True:
                    md.add_bool_or([used.Not(), *options])
                # it has an inside part unless it is outside, an outside part unless it is inside
                if prev_b is not True:
                    inside = md.new_bool_var(f"{d}@{j}in")
                    md.add_bool_and([used] + ([prev_b.Not()] if prev_b is not False else [])).only_enforce_if(inside)
                    md.add_bool_or([inside, used.Not()] + ([prev_b] if prev_b is not False else []))
                    has_in[d].append((j, inside))
                outside = md.new_bool_var(f"{d}@{j}out")
                md.add_bool_and([used, a_lit.Not()]).only_enforce_if(outside)
                md.add_bool_or([outside, used.Not(), a_lit])
                has_out[d].append((j, outside))
                divides_k.append(a_lit)
                k_divides.append(b_lit)
        for i, d in enumerate(families):
            for j, o in has_out[d]:
                # rank order: nothing inside an instance after an outside digit, in this family's
                # later axes or in any later family
                later = [n for jn, n in has_in[d] if jn > j] + [n for e in families[i + 1:] for _, n in has_in[e]]
                for n in later:
                    md.add_bool_or([o.Not(), n.Not()])

    # -- objective ------------------------------------------------------------------------------
    def _objective(self):
        if self.memory_objective:
            self.model.minimize(self.memory.expr)
            self.step = self.objective = None
            return
        per_tick = 1 / self.tick
        self.terms = {name: self.tabulator.compile(self.steps[name], per_tick) for name in TERMS if name != "tp_raw"}
        self.step = self.materialise(self.add(*self.terms.values()), "step")
        objective = self.step
        if self.problem.objective == "goodput":
            # step / goodput as step * (2^24 / goodput). CP-SAT bounds the objective with
            # doubles, so the product must stay well below 2^53: the step is bounded (by the
            # step-time optimum's own objective, see driver.solve_space) and counted in units
            # of 2^k ticks, k keeping the product under 2^50 with 26 significant bits of step.
            p = self.problem
            chips = self.space.ranks // self.space.axes[0].size
            inverse = self.tabulator.compile(inverse_goodput(p.workload, p.target, chips), GOODPUT_SCALE)
            bound = int(round(self.step_bound / self.tick)) if self.step_bound else CAP
            self.model.add(self.step.expr <= bound)
            self.coarse_bits = max(0, bound.bit_length() + inverse.hi.bit_length() - OBJECTIVE_BITS)
            coarse = self.div(Term(self.step.expr, self.step.lo, bound, self.step.error),
                              const(2**self.coarse_bits), "coarse_step")
            objective = self.mul(coarse, inverse, "per_good_step", cap=2**62)
        self.objective = objective
        self.model.minimize(objective.expr)

    def prefer_robust(self, step_cap_s: float) -> None:
        """Replace the objective: among layouts whose step is at most ``step_cap_s``, the one
        whose TP group leans least on slower links (each of TP's prime factors on the j-th
        fastest axis counts j: the core axis, inside a chip, counts 0), then the one with the
        least memory (most headroom). A step-time model is least certain where it is
        least measured (slow links, overlap), so near-ties go to the layout that depends
        least on it."""
        md = self.model
        md.add(self.step.expr <= math.floor(step_cap_s / self.tick))
        lean = 0
        if "tp" in self.active:
            for j, divs in enumerate(self.axis_divisors):
                lean += sum(j * sum(prime_exponents(v).values()) * b for v, b in zip(divs, self.place["tp"][j]))
        mib = self.var(0, CAP >> 20, "memory_mib")
        md.add_division_equality(mib.expr, self.materialise(self.memory, "memory").expr, 2**20)
        md.minimize(lean * (CAP >> 19) + mib.expr)

    @property
    def objective_unit(self) -> float:
        """Seconds (of step, or of step / goodput) per unit of the integer objective."""
        if self.problem.objective == "goodput":
            return self.tick * 2**self.coarse_bits / GOODPUT_SCALE
        return self.tick

    # -- layouts in and out -----------------------------------------------------------------------
    def _literals(self, layout: Layout):
        """(literal, whether ``layout`` sets it) for every decision variable."""
        for d in self.active:
            row = layout.placement[PLACED.index(d)]
            for j, bools in enumerate(self.place[d]):
                for v, b in zip(self.axis_divisors[j], bools):
                    yield b, v == row[j]
            for v, b in zip(self.degree_values[d], self.deg[d]):
                yield b, v == math.prod(row)
        for values, bools, chosen in ((self.zero_values, self.zero, layout.zero), (self.recompute_values, self.rc, layout.recompute),
                                      (self.space.micro_batches, self.micro, layout.micro_batch),
                                      (self.interleaves, self.inter, layout.interleave),
                                      (self.hsdp_values, self.hsdp, layout.dp_replicate > 1)):
            for v, b in zip(values, bools):
                yield b, v == chosen

    def restricted(self, degrees: dict[str, int], plans: Collection[tuple[str, int]], objective_cap_s: float,
                   rows: dict[str, tuple[int, ...]] | None = None):
        """A copy of the model with each family's degree fixed (and its placement row, given
        ``rows``: span decision -> row), the (recompute, ZeRO) pairs limited to ``plans`` and the
        objective at most ``objective_cap_s`` (one branch of search/branch.py). The copy shares
        this model's variable indices, so ``layout`` reads its solutions."""
        copy = cp_model.CpModel()
        copy.proto.copy_from(self.model.proto)
        for d in self.active:
            # the family's one-hot: its degree's literal true
            copy.proto.variables[self.deg[d][self.degree_values[d].index(degrees[d])].index].domain[0] = 1
            if rows is not None:
                # and on each axis, its factor's literal
                for j, factor in enumerate(rows[f"span.{d}"]):
                    copy.proto.variables[self.place[d][j][self.axis_divisors[j].index(factor)].index].domain[0] = 1
        for rc, rc_lit in zip(self.recompute_values, self.rc):
            for zero, zero_lit in zip(self.zero_values, self.zero):
                if (rc, zero) not in plans:
                    # a plan the branch dropped
                    copy.add_bool_or([rc_lit.Not(), zero_lit.Not()])
        fixed = {key: values.pop() for key, values in _degree_sets([degrees]).items()}
        for key, row in (rows or {}).items():
            fixed[key] = tuple((a, n) for a, n in zip(self.space.axes, row) if n > 1)
        self._narrow(copy, fixed=fixed)
        if objective_cap_s < math.inf:
            # only layouts that could enter the best found so far
            copy.add(self.objective.expr <= math.floor(objective_cap_s / self.objective_unit) + 1)
        return copy

    def narrow_degrees(self, tuples: Collection[dict[str, int]]) -> None:
        """Keep only layouts whose degrees are, family by family, among those of ``tuples``
        (the branches that can hold an answer): their literals, and every table's index."""
        allowed = _degree_sets(tuples)
        for d in self.active:
            for v, lit in zip(self.degree_values[d], self.deg[d]):
                if v not in allowed[d]:
                    self.model.add(lit == 0)  # a degree no candidate has
        ok = {key: (lambda v, s=allowed[key]: v in s) for key in allowed}
        for key in self.spans:
            family = key.split(".", 1)[1]
            ok[key] = lambda v, s=allowed[family]: math.prod(n for _, n in v) in s
        self._narrow(self.model, tests=ok)

    def _narrow(self, model: cp_model.CpModel, fixed: dict | None = None, tests: dict | None = None) -> None:
        """Each table's index to the entries whose decisions take their ``fixed`` value (decision
        -> value) or pass their ``tests`` (decision -> test of a value): the rules the literals
        already state, where presolve reads them at once (a large table cost presolve a third
        of a second per branch before)."""
        fixed, tests = fixed or {}, tests or {}
        for var, codes in self._table_codes():
            keep = None
            for key, (code, values) in codes.items():
                if key in fixed:
                    hit = code == values.get(fixed[key], -1)
                elif key in tests:
                    good = np.array([tests[key](v) for v in values])  # by code, in first-seen order
                    hit = good[code]
                else:
                    continue
                keep = hit if keep is None else keep & hit
            if keep is not None and not keep.all():
                allowed = cp_model.Domain.from_values(np.flatnonzero(keep).tolist())
                model.add_linear_expression_in_domain(var, allowed)

    def _table_codes(self) -> list:
        """Per table index variable: decision -> (each entry's value as a code, value -> code)."""
        if self._codes is None:
            self._codes = []
            for var, (keys, combos) in self.indexed:
                codes = {}
                for j, key in enumerate(keys):
                    values: dict = {}
                    codes[key] = (np.array([values.setdefault(c[j], len(values)) for c in combos]), values)
                self._codes.append((var, codes))
        return self._codes

    def hint(self, layout: Layout):
        """Start the search from ``layout``."""
        for b, value in self._literals(layout):
            self.model.add_hint(b, value)

    def fix(self, layout: Layout):
        """Pin every decision to ``layout`` (to score one layout with the model)."""
        for b, value in self._literals(layout):
            self.model.add(b == value)

    def forbid_degrees(self, layout: Layout):
        """Exclude this combination of degrees (for the runner-up solves)."""
        lits = []
        for d in self.active:
            value = layout.placement_degree(DIMS[PLACED.index(d)])
            lits += [b.Not() for v, b in zip(self.degree_values[d], self.deg[d]) if v == value]
        if lits:
            self.model.add_bool_or(lits)

    def layout(self, solver: BoundedSolver) -> Layout:
        def pick(values, bools):
            return values[next(i for i, b in enumerate(bools) if solver.boolean_value(b))]

        rows = [tuple(pick(divs, bools) for divs, bools in zip(self.axis_divisors, self.place[d]))
                if d in self.active else (1,) * len(self.space.axes) for d in PLACED]
        deg = {d: math.prod(r) for d, r in zip(PLACED, rows)}
        return Layout(tp=deg["tp"], pp=deg["pp"], dp=deg["edp"] * deg["ep"], ep=deg["ep"], cp=deg["cp"],
                      axes=self.space.axes, placement=tuple(rows), zero=pick(self.zero_values, self.zero),
                      recompute=pick(self.recompute_values, self.rc), micro_batch=pick(self.space.micro_batches, self.micro),
                      interleave=pick(self.interleaves, self.inter), lnc=self.space.lnc,
                      dp_replicate=rows[DIMS.index("dp")][-1] if pick(self.hsdp_values, self.hsdp) else 1)


def check_agreement(lm: LayoutModel, solver: cp_model.CpSolver, e: Evaluation):
    """The solver's integer objective must equal the cost model's score within the rounding
    bound the model carries (Term.error) plus float noise; anything more is a bug."""
    expected = lm.problem.score(e) / lm.objective_unit
    tolerance = lm.objective.error(solver.value) + 1e-9 * expected + 1
    if abs(expected - solver.objective_value) > tolerance:
        raise SolverMismatch(f"CP-SAT objective {solver.objective_value:.0f} ticks vs cost model {expected:.0f} "
                             f"for {e.layout.describe()} [{e.layout.placement_text()}]")


def _degree_sets(tuples: Collection[dict[str, int]]) -> dict[str, set[int]]:
    """Each degree decision's values over branch degree tuples (tp, cp, ep, edp, pp), dp = ep * edp."""
    out = {d: {t[d] for t in tuples} for d in ("tp", "cp", "ep", "edp", "pp")}
    out["dp"] = {t["ep"] * t["edp"] for t in tuples}
    return out
