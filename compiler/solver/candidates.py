"""The search space: divisor generators for each axis, and cheap structural pruning with counts.

The space has two levels, so that whole families can be bounded (and counted) at once:

* a **shape** fixes the GPU type and the parallel degrees that set the world size:
  ``tp x pp x cp x dp`` (plus ``ep``, carved out of dp x cp). Shapes come from generators
  that already obey the per-axis rules (tp divides the attention and KV heads and stays in
  a node; cp with 2 x cp dividing the sequence; pp with a Megatron split, see compiler.split, and at
  most MAX_PIPELINE_PARALLEL stages), and
  from the GPU-count rule (whole nodes within [min_gpus, max_gpus], or exactly num_gpus).
  A dp that breaks the batch arithmetic is tallied per shape as ``batch_not_divisible``.
* the **inner** choices of a shape are independent of each other, so a shape holds
  ``|pipeline| x |sharding| x |batch| x |recompute| x |sp|`` layouts, counted without
  enumerating them:

  - pipeline: pp == 1 -> one choice; pp > 1 -> gpipe, 1f1b, and interleaved_1f1b for every
    vpp > 1 with a split (pp x vpp <= layers + 2); each with compiler.split.default_split;
  - sharding: zero 0 (replicate); zero 1/2/3 over every dp_shard that divides dp (dp_shard
    < dp is hybrid sharding, HSDP), with optimizer offload none/cpu (+ nvme at zero 3) and
    parameter offload none/cpu/nvme at zero 3. A zero stage needs a shard group of more
    than one GPU, except with offload on a single data-parallel rank (ZeRO-Offload);
  - batch: micro_batch divides global_batch / dp and grad_accum = global_batch / (dp x
    micro_batch); with a tolerance, every micro_batch with a grad_accum whose realised
    batch is within it (the one closest to the requested batch); micro_batch at most
    MAX_MICRO_BATCH (the spec's cap, so the space does not grow with the batch);
  - recompute none / selective / full; sequence parallel off/on when tp > 1.

Pins of the spec's ``layout`` section replace a generator by the pinned value. Every generator asks
compiler.rules about the values it offers (the same rules the spec's pins, the cost model and
``dtc estimate`` apply), so what is legal is stated once.
"""
from __future__ import annotations

import functools

import itertools
import operator
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from compiler import rules
from compiler.arith import GpuCounts, batch_range, divisors, grad_accums_for
from compiler.layout import Layout
from compiler.problem import GpuOption, Problem
from compiler.solver import feasibility as F
from compiler.spec.models import MAX_MICRO_BATCH, MAX_PIPELINE_PARALLEL
from compiler.split import default_split
from compiler.targets.support import support_key_of

RECOMPUTE_MODES = ("none", "selective", "full")


class _ShapeFields(NamedTuple):
    option: int  # index into problem.gpu_options
    gpu: str
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    world: int  # tp x pp x cp x dp
    etp: int | None  # the expert tensor-parallel degree (Layout.etp): None is tp
    experts: tuple[int, int | None]  # (ep, etp): how the expert layers are laid out, as the search's caches key it


class Shape(_ShapeFields):
    """The parallel degrees that fix the world size, on one GPU type: a tuple whose world is derived (the search
    builds 150,000 of them for 16,384 GPUs, and they key its caches)."""

    __slots__ = ()

    def __new__(cls, option: int, gpu: str, gpus_per_node: int, tp: int, pp: int, cp: int, dp: int,
                ep: int, etp: int | None = None) -> "Shape":
        etp = None if etp == tp else etp
        return tuple.__new__(cls, (option, gpu, gpus_per_node, tp, pp, cp, dp, ep, tp * pp * cp * dp, etp, (ep, etp)))

    def __getnewargs__(self) -> tuple:  # (pickle: __new__ derives the world and the experts)
        return tuple(self)[:8] + (self.etp,)

    def _replace(self, **changes: object) -> "Shape":
        raise TypeError("a Shape's world is derived: build a new Shape")

    @property
    def num_parallel_dims(self) -> int:
        return sum(x > 1 for x in (self.tp, self.pp, self.cp, self.ep, self.dp))


@dataclass(frozen=True)
class Sharding:
    zero_stage: int
    dp_shard: int
    offload_optimizer: str = "none"
    offload_params: str = "none"


@dataclass
class ShapeSpace:
    shapes: list[Shape]
    rejected_shapes: dict[str, int] = field(default_factory=dict)  # code -> number of shapes
    examples: dict[str, str] = field(default_factory=dict)  # code -> one message


class Space:
    """The generators for one Problem (pins applied), with per-argument caches."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.pins = problem.pins
        self._shape_space: ShapeSpace | None = None
        s = problem.shape
        self.num_layers = s.num_layers
        self.lo_batch, self.hi_batch = batch_range(problem.global_batch, problem.global_batch_tolerance)
        self._pipeline: dict[int, tuple[tuple[str, int], ...]] = {}
        self._sharding: dict[int, tuple[tuple[int, int, tuple[Sharding, ...]], ...]] = {}  # sharding_groups
        self._sharding_flat: dict[int, tuple[Sharding, ...]] = {}
        self._offloads: dict[int, tuple[tuple[str, str], ...]] = {}
        self._offloaded: dict[tuple[int, int, bool], tuple[Sharding, ...]] = {}
        self._group_classes: dict[tuple, tuple[int, ...]] = {}
        self._class_ids: dict[tuple, int] = {}  # sharding_class -> its number
        self._batch: dict[int, tuple[tuple[int, int], ...]] = {}
        self._extremes: dict[int, tuple[int, int]] = {}
        self._gas: dict[int, tuple[int, ...]] = {}
        self._classes: dict[int, tuple[tuple[int, Sharding, int], ...]] = {}
        self._choice_classes: dict[int, tuple[tuple[int, Sharding], ...]] = {}
        self._class_counts: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # by _sharding_signature
        assert self._separable(), "a rule reads both the shard group and the offload knobs: see sharding_choices"
        # whether batch_choices must ask the rules row by row: not while the batch rule is the only structural rule
        # that reads (micro_batch, grad_accum), for batch_choices' rows meet it by construction (grad_accums_for
        # keeps each in batch_range, the rule's own range; an exact batch divides into them): a million rows
        # (16,384 GPUs with a batch tolerance) are then legal when dp alone breaks no rule
        self._check_batch_rows = tuple(r.code for r in rules.rules_reading(
            frozenset({"micro_batch", "grad_accum"}), F.STRUCTURAL_CODES)) != (rules.BATCH_NOT_DIVISIBLE,)
        self._shard_rows_by_divisors = self.pins.dp_shard is None and {r.code for r in rules.rules_reading(
            frozenset({"dp_shard", "zero_stage"}), F.STRUCTURAL_CODES)} == {rules.DP_SHARD_INVALID, rules.OFFLOAD_INVALID}
        self._sp: dict[tuple[int, int], tuple[bool, ...]] = {}
        self._recompute: tuple[str, ...] | None = None  # recompute_choices
        self._dp_legal: dict[int, bool] = {}  # _dp_ok
        self._ep: dict[tuple[int, int, int], tuple[tuple[int, int | None], ...]] = {}  # (tp, dp, cp) -> expert_values
        self.facts = problem.facts

    def legal(self, **knobs) -> bool:
        """No structural layout rule (compiler.rules) rejects these knobs (the others still open); what the
        frameworks cannot run stays in the space, counted by the search as framework_unsupported."""
        return rules.first_violation_of(self.facts, rules.rules_reading(frozenset(knobs), F.STRUCTURAL_CODES),
                                        rules.Knobs.partial(**knobs)) is None

    @staticmethod
    def _separable() -> bool:
        """No structural rule reads both the shard group (dp, dp_shard) and the offload knobs, so that a
        sharding's legality is the conjunction of the two (sharding_choices)."""
        shard, offload = {"dp", "dp_shard"}, {"offload_optimizer", "offload_params"}
        return all(not (shard & set(r.knobs) and offload & set(r.knobs))
                   for r in rules.RULES if r.code in F.STRUCTURAL_CODES)

    # ------------------------------------------------------------------ per-axis generators
    def tp_values(self, option: GpuOption) -> tuple[int, ...]:
        values = [t for t in divisors(self.problem.shape.num_attention_heads)
                  if self.legal(tp=t, gpus_per_node=option.gpus_per_node)]
        return self._pin(values, self.pins.tp)

    def pp_values(self) -> tuple[int, ...]:
        values = [p for p in range(1, min(self.num_layers + 2, MAX_PIPELINE_PARALLEL) + 1) if self.pipeline_choices(p)]
        return self._pin(values, self.pins.pp)

    def cp_values(self) -> tuple[int, ...]:
        values = [c for c in divisors(self.problem.seq_len) if self.legal(cp=c)]
        return self._pin(values, self.pins.cp)

    def expert_values(self, tp: int, dp: int, cp: int) -> tuple[tuple[int, int | None], ...]:
        """The (ep, etp) choices of a shape; etp None is tp (Megatron's default). With tp > 1 an MoE model's experts
        may also run whole on each rank (etp = 1, Megatron-Bridge's recipes for DeepSeek-V3 and Qwen3) where every
        target can run it, for ep > 1 (a pin asks for any other)."""
        got = self._ep.get((tp, dp, cp))
        if got is None:
            moe = self.problem.shape.moe
            out = []
            for etp in self.etp_values(tp):
                values = [e for e in (divisors(moe.num_experts) if moe else (1,))
                          if (etp is None or e > 1 or self.pins.etp is not None)
                          and self.legal(ep=e, etp=tp if etp is None else etp, tp=tp, dp=dp, cp=cp)]
                out += [(e, etp) for e in self._pin(values, self.pins.ep)]
            got = self._ep[(tp, dp, cp)] = tuple(out)
        return got

    def etp_values(self, tp: int) -> tuple[int | None, ...]:
        """None (etp = tp), and 1 where the search may choose it (expert_values)."""
        if self.pins.etp is not None:
            return (None if self.pins.etp == tp else self.pins.etp,)
        if self.problem.shape.moe is None or tp == 1 or not self._etp_runs:
            return (None,)
        return (None, 1)

    @functools.cached_property
    def _etp_runs(self) -> bool:
        """Every target of the problem runs an expert tensor-parallel degree other than tp."""
        from compiler.targets.support import unsupported_reasons

        return not unsupported_reasons(self.problem.targets, self.problem.precision,
                                       rules.Knobs.partial(tp=2, etp=1), self.problem.shape)[0]

    def dp_values(self, counts: GpuCounts, base: int) -> tuple[list[int], int]:
        """(dp values whose world base x dp is allowed and meets the batch rule, number failing the batch)."""
        first, last, step = counts.multiples_of(base)
        if first > last:
            return [], 0
        if self.pins.dp is not None:
            n = base * self.pins.dp
            if n not in counts:
                return [], 0
            return ([self.pins.dp], 0) if self._dp_batch_ok(self.pins.dp) else ([], 1)
        lo_dp, hi_dp = first // base, last // base
        dstep = step // base
        total = (hi_dp - lo_dp) // dstep + 1
        if self.lo_batch == self.hi_batch:
            ok = [d for d in divisors(self.problem.global_batch) if lo_dp <= d <= hi_dp and (d - lo_dp) % dstep == 0]
        else:
            top = min(hi_dp, self.hi_batch)
            ok = [d for d in range(lo_dp, top + 1, dstep) if self._dp_batch_ok(d)]
        return ok, total - len(ok)

    def _dp_batch_ok(self, dp: int) -> bool:
        if self.lo_batch == self.hi_batch:
            return self.problem.global_batch % dp == 0
        return -(-self.lo_batch // dp) * dp <= self.hi_batch

    # ------------------------------------------------------------------ inner generators
    def pipeline_choices(self, pp: int) -> tuple[tuple[str, int], ...]:
        """(schedule, vpp) pairs for ``pp``."""
        got = self._pipeline.get(pp)
        if got is not None:
            return got
        pins = self.pins
        out: list[tuple[str, int]] = []
        if pp == 1:
            sched = pins.schedule if pins.schedule in ("gpipe", "1f1b") else "1f1b"
            if pins.schedule != "interleaved_1f1b" and pins.vpp in (None, 1) and self.legal(pp=1, split=pins.split):
                out.append((sched, 1))
        else:
            for sched in ("gpipe", "1f1b"):
                if pins.schedule in (None, sched) and pins.vpp in (None, 1) \
                        and self.legal(pp=pp, vpp=1, schedule=sched, split=pins.split):
                    out.append((sched, 1))
            if pins.schedule in (None, "interleaved_1f1b"):
                for vpp in range(2, (self.num_layers + 2) // pp + 1):
                    if pins.vpp in (None, vpp) and self.legal(pp=pp, vpp=vpp, schedule="interleaved_1f1b",
                                                              split=pins.split):
                        out.append(("interleaved_1f1b", vpp))
        result = tuple(out)
        self._pipeline[pp] = result
        return result

    def sharding_groups(self, dp: int) -> tuple[tuple[int, int, tuple[Sharding, ...]], ...]:
        """sharding_choices(dp) as (zero_stage, dp_shard, its choices, one per offload) groups, in that order."""
        got = self._sharding.get(dp)
        if got is not None:
            return got
        pins = self.pins
        rows: list[tuple[int, int]] = []  # (dp_shard, zero_stage)
        for zero in (0, 1, 2, 3):
            if (pins.zero_stage is None or zero == pins.zero_stage) and self.offload_choices(zero):
                rows += [(d, zero) for d in ((1,) if zero == 0 else divisors(dp))
                         if pins.dp_shard is None or d == pins.dp_shard]
        # legal(dp, dp_shard, zero_stage, offload_optimizer, offload_params) as two questions: no rule reads both the
        # shard group and the offload knobs (asserted in _separable)
        legal = rules.legal_rows(self.facts, F.STRUCTURAL_CODES, {"dp": dp}, ("dp_shard", "zero_stage"), rows)
        out = []
        for d, zero in legal:
            key = (zero, d, dp == 1)
            choices = self._offloaded.get(key)
            if choices is None:
                # a zero stage needs a shard group of more than one GPU, except ZeRO-Offload on one rank
                choices = self._offloaded[key] = tuple(
                    Sharding(zero, d, oo, op) for oo, op in self.offload_choices(zero)
                    if not (zero > 0 and d == 1 and not (dp == 1 and (oo != "none" or op != "none"))))
            if choices:
                out.append((zero, d, choices))
        result = tuple(out)
        self._sharding[dp] = result
        return result

    def offload_choices(self, zero: int) -> tuple[tuple[str, str], ...]:
        """The legal (offload_optimizer, offload_params) pairs of a zero stage, pins applied."""
        got = self._offloads.get(zero)
        if got is None:
            pins = self.pins
            if zero == 0:
                pairs: tuple[tuple[str, str], ...] = (("none", "none"),)
            else:
                opt = ("none", "cpu", "nvme") if zero == 3 else ("none", "cpu")
                par = ("none", "cpu", "nvme") if zero == 3 else ("none",)
                pairs = tuple((oo, op) for oo in opt for op in par)
            got = self._offloads[zero] = tuple(
                (oo, op) for oo, op in pairs
                if (pins.offload_optimizer is None or oo == pins.offload_optimizer)
                and (pins.offload_params is None or op == pins.offload_params)
                and self.legal(zero_stage=zero, offload_optimizer=oo, offload_params=op))
        return got

    def sharding_choices(self, dp: int) -> tuple[Sharding, ...]:
        got = self._sharding_flat.get(dp)
        if got is None:
            got = self._sharding_flat[dp] = tuple(sh for _, _, choices in self.sharding_groups(dp) for sh in choices)
        return got

    def sharding_count(self, dp: int) -> int:
        """len(sharding_choices(dp)): every choice is in one class."""
        return sum(self.class_counts(dp)[1])

    def batch_choices(self, dp: int) -> tuple[tuple[int, int], ...]:
        """(micro_batch, grad_accum) pairs for ``dp``."""
        got = self._batch.get(dp)
        if got is not None:
            return got
        b, tol = self.problem.global_batch, self.problem.global_batch_tolerance
        out: list[tuple[int, int]] = []
        if tol <= 0:
            if b % dp == 0:
                out = [(mb, b // dp // mb) for mb in divisors(b // dp) if mb <= MAX_MICRO_BATCH]
        else:
            out = grad_accums_for(b, tol, dp, range(1, min(self.hi_batch // dp, MAX_MICRO_BATCH) + 1))
        if self.pins.micro_batch is not None:
            out = [c for c in out if c[0] == self.pins.micro_batch]
        if self._check_batch_rows:  # legal(dp=dp, micro_batch=mb, grad_accum=ga) for every pair at once
            out = rules.legal_rows(self.facts, F.STRUCTURAL_CODES, {"dp": dp}, ("micro_batch", "grad_accum"), out)
        elif not self._dp_ok(dp):
            out = []
        result = tuple(out)
        self._batch[dp] = result
        return result

    def sharding_class(self, dp: int, sh: Sharding) -> tuple:
        """What the targets' support rules read of a sharding choice (support_key_of, the shape's own degrees
        left out): choices of one class are supported alike."""
        return support_key_of(tp=1, pp=1, cp=1, ep=1, sequence_parallel=False, zero_stage=sh.zero_stage, vpp=1,
                              schedule="1f1b", dp_replicate=dp // sh.dp_shard, dp_shard=sh.dp_shard,
                              offload_optimizer=sh.offload_optimizer, offload_params=sh.offload_params)

    def sharding_classes(self, dp: int) -> tuple[tuple[int, Sharding, int], ...]:
        """sharding_choices(dp) by sharding_class: (the class's number, the first choice of the class, how many it
        stands for). A group's classes are found once per (zero stage, dp_shard > 1, replicate > 1): support_key_of
        reads the degrees only as > 1 (tests/unit/solver/test_solver_frameworks.py holds it). So the classes of dp
        are counted per such group key, not per choice: a dp of many divisors has hundreds of choices but a few
        keys, and the search counts every dp of the space (tens of thousands on a large cluster)."""
        got = self._classes.get(dp)
        if got is None:
            groups: dict[tuple, list] = {}  # group key -> [number of groups, the first group's choices]
            for zero, d, choices in self.sharding_groups(dp):
                key = self._group_key(zero, d, dp)
                seen = groups.get(key)
                if seen is None:
                    groups[key] = [1, choices]
                else:
                    seen[0] += 1
            first: dict[int, Sharding] = {}
            counts: dict[int, int] = {}
            for key, (n, choices) in groups.items():  # (in the order of each key's first group)
                for cid, sh in zip(self._group_class_ids(dp, key, choices), choices):
                    if cid not in counts:
                        first[cid], counts[cid] = sh, n
                    else:
                        counts[cid] += n
            got = self._classes[dp] = tuple((c, first[c], counts[c]) for c in first)
        return got

    def class_counts(self, dp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """sharding_classes(dp) as two tuples, the class numbers and how many choices each stands for, kept per
        _sharding_signature: the search counts every dp of the space (5,120 on 16,384 GPUs), a few signatures."""
        sig = self._sharding_signature(dp)
        got = self._class_counts.get(sig)
        if got is None:
            classes = self.sharding_classes(dp)
            got = self._class_counts[sig] = (tuple(c[0] for c in classes), tuple(c[2] for c in classes))
        return got

    def _sharding_signature(self, dp: int) -> tuple:
        """What sharding_groups(dp)'s classes and their counts depend on. Its rows are (dp_shard, zero stage) for
        each divisor dp_shard of dp (1 alone under ZeRO-0); a group's class and choices read dp_shard and the
        replicate degree only as > 1, and dp only as == 1; so while no pin names a dp_shard and the rules that
        read (dp_shard, zero_stage) are the shard rule (which those rows meet: they divide dp, and ZeRO-0 does
        not shard) and the offload rule (which reads offloads, not asked with them), the counts follow the number
        of divisors of dp, whether dp is 1, and whether dp alone breaks a rule (then there are none). Otherwise dp
        itself."""
        if not self._shard_rows_by_divisors:
            return (dp,)
        return (len(divisors(dp)), dp == 1, self._dp_ok(dp))

    def _dp_ok(self, dp: int) -> bool:
        """legal(dp=dp), kept."""
        ok = self._dp_legal.get(dp)
        if ok is None:
            ok = self._dp_legal[dp] = self.legal(dp=dp)
        return ok

    @staticmethod
    def _group_key(zero: int, dp_shard: int, dp: int) -> tuple:
        """What fixes the classes and offload choices of a sharding group: support_key_of reads the shard and
        replicate degrees only as > 1, and the offload choices read dp_shard and dp only as == 1."""
        return (zero, dp_shard > 1, dp // dp_shard > 1, dp == 1)

    def _group_class_ids(self, dp: int, key: tuple, choices: tuple[Sharding, ...]) -> tuple[int, ...]:
        """The sharding_class number of each of a group's ``choices`` (the group's key fixes them)."""
        ids = self._group_classes.get(key)
        if ids is None:
            ids = self._group_classes[key] = tuple(
                self._class_ids.setdefault(self.sharding_class(dp, sh), len(self._class_ids)) for sh in choices)
        return ids

    def choice_classes(self, dp: int) -> tuple[tuple[int, Sharding], ...]:
        """Each of sharding_choices(dp), in order, with its sharding_class's number."""
        got = self._choice_classes.get(dp)
        if got is None:
            out: list[tuple[int, Sharding]] = []
            for zero, d, choices in self.sharding_groups(dp):
                key = self._group_key(zero, d, dp)
                out.extend(zip(self._group_class_ids(dp, key, choices), choices))
            got = self._choice_classes[dp] = tuple(out)
        return got

    def grad_accums(self, dp: int) -> tuple[int, ...]:
        """The grad_accum of each of batch_choices(dp), in order."""
        got = self._gas.get(dp)
        if got is None:
            got = self._gas[dp] = tuple(map(operator.itemgetter(1), self.batch_choices(dp)))
        return got

    def batch_extremes(self, dp: int) -> tuple[int, int]:
        """(the largest micro_batch, the largest micro_batch x grad_accum) of batch_choices(dp), which is not
        empty."""
        got = self._extremes.get(dp)
        if got is None:
            batches = self.batch_choices(dp)
            got = self._extremes[dp] = (max(batches)[0], max(itertools.starmap(operator.mul, batches)))
        return got

    def recompute_choices(self) -> tuple[str, ...]:
        got = self._recompute
        if got is None:
            got = self._recompute = self._pin(list(RECOMPUTE_MODES), self.pins.recompute)
        return got

    def sp_choices(self, tp: int, cp: int = 1) -> tuple[bool, ...]:
        got = self._sp.get((tp, cp))
        if got is None:
            values = [sp for sp in (False, True) if self.legal(sequence_parallel=sp, tp=tp, cp=cp)]
            got = self._sp[(tp, cp)] = self._pin(values, self.pins.sequence_parallel)
        return got

    @staticmethod
    def _pin(values, pin) -> tuple:
        if pin is None:
            return tuple(values)
        return (pin,) if pin in values else ()

    # ------------------------------------------------------------------ shapes and counts
    def shapes(self) -> ShapeSpace:
        """Every parallel shape of the problem (built once: the searches that share this space read it, never change
        it)."""
        if self._shape_space is None:
            self._shape_space = self._build_shapes()
        return self._shape_space

    def _build_shapes(self) -> ShapeSpace:
        space = ShapeSpace(shapes=[])
        cps, pps = self.cp_values(), self.pp_values()
        for index, option in enumerate(self.problem.gpu_options):
            counts = F.gpu_counts(self.problem, option)
            if counts.largest is None:
                continue
            for tp in self.tp_values(option):
                for cp in cps:
                    if tp * cp > counts.hi:
                        break
                    for pp in pps:
                        base = tp * cp * pp
                        if base > counts.hi:
                            break
                        dps, failed = self.dp_values(counts, base)
                        if failed:
                            self._note_batch(space, failed, base)
                        for dp in dps:
                            for ep, etp in self.expert_values(tp, dp, cp):
                                space.shapes.append(Shape(index, option.name, option.gpus_per_node,
                                                       tp, pp, cp, dp, ep, etp))
        return space

    def _note_batch(self, space: ShapeSpace, failed: int, base: int) -> None:
        code = F.BATCH_NOT_DIVISIBLE
        space.rejected_shapes[code] = space.rejected_shapes.get(code, 0) + failed
        if code not in space.examples:
            want = (str(self.problem.global_batch) if self.lo_batch == self.hi_batch
                    else f"{self.lo_batch}-{self.hi_batch}")
            space.examples[code] = (f"dp must divide the global batch ({want} sequences) so that "
                                    f"micro_batch x grad_accum x dp equals it; e.g. tp x pp x cp = {base} "
                                    "leaves a dp that does not")

    def inner_count(self, shape: Shape) -> int:
        return (len(self.pipeline_choices(shape.pp)) * self.sharding_count(shape.dp)
                * len(self.batch_choices(shape.dp)) * len(self.recompute_choices()) * len(self.sp_choices(shape.tp, shape.cp)))

    def layout(self, shape: Shape, sched: str, vpp: int, sh: Sharding, mb: int, ga: int, recompute: str,
               sp: bool) -> Layout:
        return Layout(gpu=shape.gpu, gpus_per_node=shape.gpus_per_node, tp=shape.tp, pp=shape.pp, cp=shape.cp,
                      ep=shape.ep, etp=shape.etp, dp_replicate=shape.dp // sh.dp_shard, dp_shard=sh.dp_shard,
                      zero_stage=sh.zero_stage, micro_batch=mb, grad_accum=ga, vpp=vpp,
                      schedule=sched, recompute=recompute,  # type: ignore[arg-type]
                      sequence_parallel=sp, offload_optimizer=sh.offload_optimizer,  # type: ignore[arg-type]
                      offload_params=sh.offload_params,  # type: ignore[arg-type]
                      split=self.pins.split or default_split(self.num_layers, shape.pp, vpp))

    def layouts_of(self, shape: Shape) -> Iterator[Layout]:
        for sched, vpp in self.pipeline_choices(shape.pp):
            for mb, ga in self.batch_choices(shape.dp):
                for rc in self.recompute_choices():
                    for sp in self.sp_choices(shape.tp, shape.cp):
                        for sh in self.sharding_choices(shape.dp):
                            yield self.layout(shape, sched, vpp, sh, mb, ga, rc, sp)


def enumerate_layouts(problem: Problem) -> Iterator[Layout]:
    """Every layout of the search space, shape by shape (for tests and brute force; the solver bounds)."""
    space = Space(problem)
    for shape in space.shapes().shapes:
        yield from space.layouts_of(shape)


def count_layouts(problem: Problem) -> int:
    space = Space(problem)
    return sum(space.inner_count(s) for s in space.shapes().shapes)
