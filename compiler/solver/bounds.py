"""Lower bounds on step time and memory, built from the cost model's own quantity functions.

The cost model is reached through its public parts (compiler.costmodel.parts) only. "Candidate
stages" are the distinct stages of the split (one per (dense, MoE, first, last), the earliest of
each): every stage's time is one of theirs, and the earliest holds the most micro-batches.

Every bound here is <= what ``compiler.costmodel.evaluation.evaluate`` returns for every layout it
covers (tests/unit/solver/test_solver_bounds.py checks it on sampled layouts, and the
brute-force property tests check that pruning never loses the optimum). The argument
for each, in the cost model's terms (compiler/costmodel/step.py):

    step = pipeline makespan (with p2p) + exposed dp comm + optimizer step + offload,
    makespan >= (m + (pp - 1) / v) x (f + b) + 2 (pp v - 1) x p2p     (v = 1 unless interleaved),
    (f, b) of the bottleneck stage = compute + exposed tp/cp/ep comm + exposed ZeRO-2/3 comm.

* **shape** (GPU-seconds per token): the bottleneck stage is busy m x (f + b) >= m x the
  mean over stages, and the stages' compute + tp/cp/ep terms add up to the whole model's,
  which per token only falls as the micro-batch grows (GEMM efficiency sat(M) rises,
  latencies amortise; attention, memory-bound work and bandwidth terms are linear). So the
  whole model's time for a huge micro-batch, per token, x tp bounds every layout of the
  shape; times the smallest (m + (pp - 1) / v) / m the shape's schedules and batches allow.
* **stage** (vpp fixed; the search's stages_lb): as the shape bound, with the bottleneck stage's
  forward + backward x pp (>= the whole model's) instead of the whole model's, each stage's time per
  token only falling as the micro-batch grows (its pieces' do), and the smallest bubble of that vpp.
* **group** (schedule, micro-batch, recompute fixed): (f, b) of each candidate stage
  without the ZeRO-2/3 term and with sequence parallel on where allowed (it only lowers
  memory-bound work and the ep all-to-all). A stage's (f, b) is linear in its dense and
  MoE layers and its first/last extras, so they are built from cached per-layer pieces.
  The bottleneck stage's f + b is at least the largest of these; with the p2p term above
  that bounds the step.
* **layout**: the group's span + the step's ZeRO-2/3 traffic that cannot hide behind it
  (max(m x per-micro-batch traffic - 0.9 x span, one unit's)): the model's makespan M is at least
  the span and M + max(Z - 0.9 M, t) only grows with M; then + the exposed gradient reduce and
  parameter gather of the step (max(total - window, last bucket)), the optimizer step and the
  offload traffic that cannot overlap (host-to-device parameters, CPU Adam, NVMe), each the
  minimum over stages.
* **memory**: for each candidate stage, (weights + gradients + master + optimizer states
  + activations in flight + logits) x (1 + fragmentation) + CUDA context + NCCL buffers;
  the bound is the maximum over stages (the cost model reports the largest stage). The
  group bound takes the smallest model states over the group's sharding/offload choices.

Step-time bounds are multiplied by ``SAFETY`` (0.998) to absorb the cost model's rounding
of pipeline ratios to 3 significant digits.
"""
from __future__ import annotations

from typing import Iterable

from compiler.costmodel import parts as cm
from compiler.costmodel.parts import Setup, StageLayers
from compiler.layout import Layout
from compiler.problem import Problem
from compiler.solver.candidates import Shape, Sharding

SAFETY = 0.998
_HUGE_MB = 1 << 20  # the micro-batch of the shape bound's limit (sat(M) ~ 1)


def coarse_micro_batch(mb: int) -> int:
    """A micro-batch at least ``mb`` from a short list (1-8, then powers of two): the shape bound at it still
    bounds every micro-batch up to ``mb`` (per token the time only falls as the micro-batch grows), and the
    thousands of shapes of a large space then share a few dozen whole-model costings instead of one per
    largest micro-batch their dp allows. Above 8 sequences of 2K+ tokens the GEMMs are saturated, so the
    bound loosens little."""
    return mb if mb <= 8 else 1 << (mb - 1).bit_length()


def pipeline_units_lb(schedule: str, pp: int, m: int, vpp: int) -> float:
    """The schedule's makespan without p2p, in units of one micro-batch's forward + backward on the
    bottleneck stage: m + (pp - 1) for GPipe and 1F1B, m + (pp - 1) / vpp interleaved (Narayanan et
    al. 2021, sec. 2.2). The cost model's simulation reproduces these exactly (its tests and ours)."""
    if pp == 1:
        return float(m)
    if schedule == "interleaved_1f1b" and vpp > 1:
        return m + (pp - 1) / vpp
    return float(m + pp - 1)


class Bounds:
    def __init__(self, problem: Problem):
        self.problem = problem
        # the first framework target (the layout's estimate is its slowest target's, never below this one's),
        # with the host launches that overlap GPU work left out (parts.bound_efficiency: what remains is linear in
        # a stage's pieces)
        self.target = cm.bound_target(problem)
        self.eff = cm.bound_efficiency(problem.profile)
        self.usable = [float(int(o.spec.hbm_bytes * (1.0 - problem.memory_headroom))) for o in problem.gpu_options]
        self._per_token: dict[tuple, float] = {}
        self._stage_fb: dict[tuple, tuple[float, float]] = {}
        self._stage_sum: dict[tuple, tuple[float, float]] = {}
        self._group_fb: dict[tuple, tuple[tuple[float, float, StageLayers], ...]] = {}
        self._worst_fb: dict[tuple, float] = {}
        self._family_memory: dict[tuple, FamilyMemory] = {}
        self._family_inflight: dict[tuple, float] = {}
        self._compositions: dict[tuple[int, int], tuple[tuple[int, int, bool, bool], ...]] = {}
        self._fixed_bytes: dict[tuple, float] = {}
        self._act_mb: dict[tuple, dict[tuple[int, str], float]] = {}
        self._domain: dict[int, int] = {}
        self._straggler: dict[int, float] = {}
        self._states_setup: dict[tuple[int, bool], Setup] = {}
        self._least: dict[int, tuple[tuple, tuple[Sharding, ...], tuple[bool, ...]]] = {}  # _options_summary
        self._stages: dict[tuple[int, int], tuple[StageLayers, ...]] = {}
        self._distinct: dict[tuple[int, int], tuple[StageLayers, ...]] = {}
        self._sparams: dict[tuple, object] = {}
        self._act: dict[tuple, float] = {}
        self._group_mem: dict[tuple, float] = {}
        self._dp: dict[tuple, tuple] = {}
        self._p2p: dict[tuple, float] = {}
        self._states: dict[tuple, float] = {}

    # ------------------------------------------------------------------ helpers
    def setup(self, option: int, layout: Layout) -> Setup:
        return cm.setup_for(self.problem, layout, self.problem.gpu_options[option],
                            stages=self.stages(layout.pp, layout.vpp), target=self.target, efficiency=self.eff)

    def stages(self, pp: int, vpp: int) -> tuple[StageLayers, ...]:
        got = self._stages.get((pp, vpp))
        if got is None:
            got = self._stages[(pp, vpp)] = cm.stages_of(self.problem, pp, vpp)
        return got

    def distinct(self, pp: int, vpp: int) -> tuple[StageLayers, ...]:
        """The stages whose maximum is the maximum over all (cm.distinct_stages)."""
        got = self._distinct.get((pp, vpp))
        if got is None:
            got = self._distinct[(pp, vpp)] = cm.distinct_stages(self.stages(pp, vpp))
        return got

    def _probe(self, shape: Shape, *, pp: int = 1, vpp: int = 1, sched: str = "1f1b", mb: int = 1, ga: int = 1,
               rc: str = "none", sp: bool = False, sh: Sharding | None = None) -> Layout:
        sh = sh or Sharding(0, 1)
        return Layout(gpu=shape.gpu, gpus_per_node=shape.gpus_per_node, tp=shape.tp, pp=pp, cp=shape.cp, ep=shape.ep,
                      etp=shape.etp, dp_replicate=shape.dp // sh.dp_shard, dp_shard=sh.dp_shard, zero_stage=sh.zero_stage,
                      micro_batch=mb, grad_accum=ga, vpp=vpp, schedule=sched, recompute=rc,  # type: ignore[arg-type]
                      sequence_parallel=sp, offload_optimizer=sh.offload_optimizer,  # type: ignore[arg-type]
                      offload_params=sh.offload_params)  # type: ignore[arg-type]

    def _stage_params(self, shape: Shape, pp: int, vpp: int, sl: StageLayers):
        key = (shape.tp, shape.experts, pp > 1, pp, sl.dense, sl.moe, sl.first, sl.last)
        got = self._sparams.get(key)
        if got is None:
            got = self._sparams[key] = cm.stage_params_of(self.problem, sl, tp=shape.tp, ep=shape.ep, pp=pp,
                                                                            etp=shape.etp)
        return got

    def _unit_fb(self, shape: Shape, mb: int, sp: bool, rc: str, kind: str) -> tuple[float, float]:
        """(forward, backward) of one piece of a stage: one dense layer, one MoE layer, or the extras of
        the first / last stage (embedding, final norm and logits). A stage's time without ZeRO-2/3
        traffic is linear in these (compiler/costmodel/compute.stage_compute, step.stage_time)."""
        key = (shape.option, shape.tp, shape.cp, shape.experts, mb, sp, rc, kind)
        got = self._stage_fb.get(key)
        if got is None:
            probe = self._probe(Shape(shape.option, shape.gpu, shape.gpus_per_node, shape.tp, 1, shape.cp, shape.ep,
                                      shape.ep, shape.etp), mb=mb, rc=rc, sp=sp)
            setup = self.setup(shape.option, probe)
            sl = cm.unit_stage(kind)
            got = self._stage_fb[key] = cm.stage_forward_backward_s(setup, sl,
                                                                    self._stage_params(shape, 1, 1, setup.stages[0]))
        return got

    def stage_fb(self, shape: Shape, sl: StageLayers, mb: int, sp: bool, rc: str) -> tuple[float, float]:
        key = (shape.option, shape.tp, shape.cp, shape.experts, mb, sp, rc, sl.dense, sl.moe, sl.first, sl.last)
        got = self._stage_sum.get(key)
        if got is None:
            f = b = 0.0
            for kind, n in (("dense", sl.dense), ("moe", sl.moe), ("first", sl.first), ("last", sl.last)):
                if n:
                    uf, ub = self._unit_fb(shape, mb, sp, rc, kind)
                    f += n * uf
                    b += n * ub
            got = self._stage_sum[key] = (f, b)
        return got

    @staticmethod
    def _sp_min(shape: Shape, sps: Iterable[bool]) -> bool:
        return shape.tp > 1 and True in tuple(sps)

    @classmethod
    def _sp_least_memory(cls, shape: Shape, sps: tuple[bool, ...], recompute: str) -> tuple[bool, ...]:
        """The sequence-parallel settings among ``sps`` whose activations may be the least: sequence parallel
        shards every saved tensor it touches, except under selective recompute, where PyTorch's op-level SAC
        keeps each row-parallel matmul's output whole beside its reduce-scatter shard (at tp=2 more than
        without it: activations.row_parallel_outputs_kept); there both are tried."""
        if recompute == "selective" and shape.tp > 1 and len(set(sps)) == 2:
            return (True, False)
        return (cls._sp_min(shape, sps),)

    # ------------------------------------------------------------------ time
    def gpu_s_per_token_lb(self, shape: Shape, sps: Iterable[bool] = (False, True), mb_cap: int = _HUGE_MB) -> float:
        """GPU-seconds per token of every layout of ``shape`` whose micro-batch is at most ``mb_cap``: the whole
        model's forward + backward per token at micro-batch ``mb_cap`` (per token it only falls as the
        micro-batch grows), x tp, with the straggler wait of the shape's world size."""
        sp = self._sp_min(shape, sps)
        key = (shape.option, shape.tp, shape.cp, shape.experts, sp, mb_cap)
        got = self._per_token.get(key)
        if got is None:
            whole = self.stages(1, 1)[0]
            f, b = self.stage_fb(shape, whole, mb_cap, sp, "none")
            tokens = mb_cap * self.problem.seq_len // shape.cp
            got = self._per_token[key] = (f + b) * shape.tp / tokens
        return SAFETY * got * self.straggler_stretch(shape.world)

    def stage_gpu_s_per_token_lb(self, shape: Shape, vpp: int, sps: Iterable[bool] = (False, True),
                                 mb_cap: int = _HUGE_MB, recompute: str = "none") -> float:
        """GPU-seconds per token of every layout of ``shape`` with ``vpp`` and a micro-batch at most ``mb_cap``,
        before the pipeline bubble: the bottleneck stage's forward + backward (group_worst_fb, at least the
        mean over the pp stages, so never below gpu_s_per_token_lb's) per token at ``mb_cap`` x pp x tp, with
        the straggler wait. Per token each stage's time only falls as the micro-batch grows (its pieces' do,
        tests/unit/solver/test_solver_bounds.py), so the largest stage's does too; a group's step is at least
        (makespan units) x that stage's time, and a step of m micro-batches holds m x mb x seq / cp tokens per
        pipeline: times the smallest (makespan units / m) of the schedules with ``vpp`` it bounds the layouts."""
        return self.stage_per_token_busy_lb(shape, vpp, sps, mb_cap, recompute) * self.straggler_stretch(shape.world)

    def stage_per_token_busy_lb(self, shape: Shape, vpp: int, sps: Iterable[bool] = (False, True),
                                mb_cap: int = _HUGE_MB, recompute: str = "none") -> float:
        """stage_gpu_s_per_token_lb before the straggler wait: it reads dp only through mb_cap."""
        worst = self.group_worst_fb(shape, vpp, mb_cap, recompute, sps)
        tokens = mb_cap * self.problem.seq_len // shape.cp
        return SAFETY * worst * shape.pp * shape.tp / tokens

    def straggler_stretch(self, world: int) -> float:
        """1 + the straggler wait per second of busy time of a step on ``world`` GPUs."""
        return 1.0 + self._straggler_per_s(world)

    def step_overhead_per_token_lb(self, shape: Shape, max_batch: int) -> float:
        """GPU-seconds per token of the fixed time every step adds (sync_lb), over the shape's largest batch
        (``max_batch`` sequences per step): a step of b sequences costs world x fixed GPU-seconds, so per token
        at least world x fixed / (max_batch x seq_len). Added to gpu_s_per_token_lb, which bounds the busy part."""
        _, fixed = cm.sync_overhead_s(shape.world, 0.0, self.eff)
        return SAFETY * fixed * shape.world / (max_batch * self.problem.seq_len)

    def group_stage_fb(self, shape: Shape, vpp: int, mb: int, recompute: str,
                       sps: Iterable[bool] = (False, True)) -> tuple[tuple[float, float, StageLayers], ...]:
        """(forward, backward, stage) of each candidate stage, without ZeRO-2/3 traffic, sp at its best."""
        sp = self._sp_min(shape, sps)
        key = (shape.option, shape.tp, shape.cp, shape.experts, shape.pp, vpp, mb, recompute, sp)  # not dp: shared
        got = self._group_fb.get(key)
        if got is None:
            out = []
            for sl in self.distinct(shape.pp, vpp):
                f, b = self.stage_fb(shape, sl, mb, sp, recompute)
                out.append((f, b, sl))
            got = self._group_fb[key] = tuple(out)
        return got

    def p2p_s(self, shape: Shape, mb: int) -> float:
        """Seconds of one pipeline send (activations of a micro-batch to the next stage)."""
        if shape.pp == 1:
            return 0.0
        # dp enters only through where the pipeline neighbours sit (comm.pp_link: inside the NVLink domain or
        # not), so the cache is shared by the dps on the same side (test_p2p_cache_matches_the_cost_model)
        intra = shape.tp * shape.cp * shape.dp * shape.pp <= self._nvlink_domain(shape)
        key = (shape.option, shape.tp, shape.cp, shape.pp, mb, intra)
        got = self._p2p.get(key)
        if got is None:
            setup = self.setup(shape.option, self._probe(shape, pp=shape.pp, mb=mb))
            got = self._p2p[key] = cm.pipeline_send_s(setup)
        return got

    def _nvlink_domain(self, shape: Shape) -> int:
        got = self._domain.get(shape.option)
        if got is None:
            got = self._domain[shape.option] = self.setup(shape.option, self._probe(shape)).nvlink_domain_gpus
        return got

    def _straggler_per_s(self, world: int) -> float:
        """The straggler wait per second of busy time of a step on ``world`` GPUs (cm.sync_overhead_s)."""
        got = self._straggler.get(world)
        if got is None:
            got = self._straggler[world] = cm.sync_overhead_s(world, 1.0, self.eff)[0]
        return got

    def sync_lb(self, shape: Shape, busy_s: float) -> float:
        """``busy_s`` plus what a synchronous step adds to it (compiler/costmodel/step.py sync_overhead_s: the
        wait for the slowest rank grows with the busy time, the fixed time does not): the model's busy time
        is never below the bound's, so neither is its wait."""
        straggler, fixed = cm.sync_overhead_s(shape.world, busy_s, self.eff)
        return busy_s + straggler + fixed

    def span_lb(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, worst_fb: float) -> float:
        """The pipeline makespan: the schedule's closed form + the p2p transfers on its critical path,
        2 (pp x vpp - 1) of them (the first micro-batch's forward down and backward up; the cost model's
        simulation is never shorter, tests/unit/solver/test_solver_bounds.py)."""
        span = pipeline_units_lb(sched, shape.pp, ga, vpp) * worst_fb
        if shape.pp > 1:
            span += 2 * (shape.pp * vpp - 1) * self.p2p_s(shape, mb)
        return span

    def group_step_lb(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, recompute: str,
                      sps: Iterable[bool] = (False, True), fbs=None) -> float:
        worst = max(f + b for f, b, _ in fbs) if fbs else self.group_worst_fb(shape, vpp, mb, recompute, sps)
        return SAFETY * self.sync_lb(shape, self.span_lb(shape, sched, vpp, mb, ga, worst))

    def group_worst_fb(self, shape: Shape, vpp: int, mb: int, recompute: str,
                       sps: Iterable[bool] = (False, True)) -> float:
        """The largest forward + backward of group_stage_fb's stages (what the group step bound reads of them)."""
        sp = self._sp_min(shape, sps)
        key = (shape.option, shape.tp, shape.cp, shape.experts, shape.pp, vpp, mb, recompute, sp)
        got = self._worst_fb.get(key)
        if got is None:
            got = self._worst_fb[key] = max(f + b for f, b, _ in self.group_stage_fb(shape, vpp, mb, recompute, sps))
        return got

    def shape_bubble_factor(self, shape: Shape, pipeline: Iterable[tuple[str, int]],
                            batches: Iterable[tuple[int, int]]) -> float:
        """The smallest (makespan units / m) over the shape's schedules and micro-batch counts (>= 1)."""
        if shape.pp == 1:
            return 1.0
        gas = sorted({ga for _, ga in batches}, reverse=True)
        best = float("inf")
        deepest: dict[str, int] = {}  # the makespan only falls with vpp: the largest of each schedule decides
        for sched, vpp in pipeline:
            deepest[sched] = max(vpp, deepest.get(sched, 0))
        for sched, vpp in deepest.items():
            for ga in gas:
                if sched == "interleaved_1f1b" and ga % shape.pp:
                    continue
                best = min(best, pipeline_units_lb(sched, shape.pp, ga, vpp) / ga)
                break  # the largest valid m is the best for this schedule
        return best if best < float("inf") else 1.0

    def _dp_pieces(self, shape: Shape, vpp: int, sl: StageLayers, sh: Sharding, make_layout) -> tuple[float, ...]:
        """Per stage: (forward, backward) ZeRO-2/3 seconds per micro-batch; (total, tail) of the step's
        gradient reduction and of the parameter gather; optimizer step + offload that cannot overlap."""
        key = (shape.option, shape.tp, shape.pp, shape.cp, shape.experts, shape.dp, sl.dense, sl.moe, sl.first, sl.last, sh)
        got = self._dp.get(key)
        if got is None:
            layout = make_layout()
            setup = self.setup(shape.option, layout)
            spp = self._stage_params(shape, shape.pp, vpp, sl)
            z = cm.zero_traffic(setup, spp, units=sl.layers + int(sl.first or sl.last))
            got = self._dp[key] = (z.forward_s, z.backward_s, z.grad_total_s, z.grad_tail_s, z.param_total_s,
                                   z.param_tail_s, cm.step_extras_s(setup, spp, sl.stage))
        return got

    def layout_step_lb(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, sh: Sharding, fbs,
                       make_layout) -> float:
        """The group bound with this layout's sharding/offload terms (see the module docstring).

        ``fbs``: group_stage_fb of the group; ``make_layout()`` builds the layout (only on a cache miss)."""
        w = cm.dp_overlap_window()
        span = self.span_lb(shape, sched, vpp, mb, ga, max(f + b for f, b, _ in fbs))
        zero = step_extra = float("inf")
        for f, b, sl in fbs:
            fwd, bwd, g_tot, g_tail, p_tot, p_tail, extra = self._dp_pieces(shape, vpp, sl, sh, make_layout)
            units = max(1, sl.layers)
            total = ga * (fwd + bwd)  # the step's ZeRO-2/3 traffic, hidden behind the step's busy time
            zero = min(zero, max(total - w * span, min(total, (fwd + bwd) / units)) if total else 0.0)
            exposed = (max(g_tot - w * b, g_tail) if g_tot else 0.0) + (max(p_tot - w * f, p_tail) if p_tot else 0.0)
            step_extra = min(step_extra, exposed + extra)
        return SAFETY * (self.sync_lb(shape, span + zero) + step_extra)

    # ------------------------------------------------------------------ memory
    def usable_bytes(self, shape: Shape) -> float:
        return self.usable[shape.option]

    def _activations(self, shape: Shape, setup: Setup | None, sl: StageLayers, sched: str, vpp: int, mb: int,
                     ga: int, rc: str, sp: bool, make_setup=None) -> float:
        """activations_in_flight_bytes of ``sl`` under the layout (``setup``, or ``make_setup()`` built only on a
        cache miss): it reads the schedule and the micro-batch count only through the stage's in-flight count and
        whether the schedule is GPipe (parts.inflight_microbatches), so it is cached by those."""
        inflight = cm.inflight_microbatches(sched, sl.stage, shape.pp, ga, vpp)
        key = (shape.option, shape.tp, shape.etp, shape.cp, shape.pp, vpp, sched == "gpipe", inflight, mb, rc, sp,
               sl.dense, sl.moe, sl.first, sl.last)  # (etp: an MoE layer keeps the expert TP group's gather)
        got = self._act.get(key)
        if got is None:
            if setup is None:
                setup = make_setup()
            # one micro-batch's activations do not depend on the schedule, pp, vpp or the micro-batch count
            table = self._pm_table(shape, sp, sl)
            pm = table.get((mb, rc))
            if pm is None:
                pm = table[(mb, rc)] = cm.stage_activation_bytes(setup, sl)
            got = self._act[key] = cm.activations_in_flight_bytes(setup, sl, per_microbatch=pm)
        return got

    def _model_states(self, shape: Shape, vpp: int, sl: StageLayers, sh: Sharding) -> float:
        # dp only for hybrid ZeRO-3: the model states read the shard group (dp_shard x cp), not the replicas, except
        # under ZeRO++ hpZ, which partitions them over all dp ranks (memory.py model_state_bytes_per_gpu,
        # state_sharding; test_model_states_cache_matches_the_cost_model), so the other dps share them
        hybrid = shape.dp if sh.zero_stage >= 3 and shape.dp > sh.dp_shard else 0
        key = (shape.option, shape.tp, shape.pp, shape.cp, shape.experts, hybrid, sl.dense, sl.moe, sl.first, sl.last, sh)
        got = self._states.get(key)
        if got is None:
            view = cm.ShardingView(shape.tp, shape.cp, shape.ep, sh.dp_shard, shape.dp // sh.dp_shard, sh.zero_stage,
                                   sh.offload_optimizer, sh.offload_params, shape.etp)
            spp = self._stage_params(shape, shape.pp, vpp, sl)
            # of the setup the states read the recipe (which the ZeRO stage can change, make_setup) and the target's
            # bookkeeping, not its layout: one setup per (GPU, ZeRO >= 1) serves every sharding (the same test)
            skey = (shape.option, sh.zero_stage >= 1)
            setup = self._states_setup.get(skey)
            if setup is None:
                setup = self._states_setup[skey] = self.setup(shape.option, self._probe(shape, pp=shape.pp, sh=sh))
            got = self._states[key] = cm.model_state_bytes(setup, spp, view)
        return got

    def _min_states(self, shape: Shape, vpp: int, sl: StageLayers, options: tuple) -> float:
        key = (shape.option, shape.tp, shape.pp, shape.cp, shape.experts, shape.dp, sl.dense, sl.moe, sl.first, sl.last,
               id(options))
        got = self._states.get(key)
        if got is None:
            got = self._states[key] = min(self._model_states(shape, vpp, sl, sh) for sh in self._least_states(options))
        return got

    def _least_states(self, options: tuple) -> tuple[Sharding, ...]:
        """The shardings of ``options`` that can hold the fewest model states: per (ZeRO stage, offloads), the
        widest shard group. Within one such class the states only fall as dp_shard grows (each sharded part is
        divided by it: memory.params_after_sharding; test_model_states_fall_with_the_shard_group), so the
        minimum over ``options`` is the minimum over these, the same value."""
        return self._options_summary(options)[1]

    def _options_summary(self, options: tuple) -> tuple[tuple, tuple[Sharding, ...], tuple[bool, ...]]:
        """(``options``, _least_states' shardings, the sequence-parallel settings among them), kept by identity."""
        got = self._least.get(id(options))
        if got is None or got[0] is not options:
            widest: dict[tuple[int, str, str], Sharding] = {}
            for _, sh in options:
                cls = (sh.zero_stage, sh.offload_optimizer, sh.offload_params)
                known = widest.get(cls)
                if known is None or sh.dp_shard > known.dp_shard:
                    widest[cls] = sh
            got = self._least[id(options)] = (options, tuple(widest.values()), tuple(sorted({o[0] for o in options})))
        return got

    def _fixed(self, layout: Layout) -> float:
        return cm.fixed_bytes(layout)

    def group_memory_lb(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, recompute: str,
                        options: tuple) -> float:
        """Bytes per GPU every (sequence parallel, sharding) option of this group needs at least.

        ``options`` must be a long-lived tuple (the search caches them): it is keyed by identity."""
        sps = self._options_summary(options)[2]
        return min(self._stages_memory_lb(shape, sched, vpp, mb, ga, recompute, sp, None,
                                          lambda sl: self._min_states(shape, vpp, sl, options))
                   for sp in self._sp_least_memory(shape, sps, recompute))

    def _stages_memory_lb(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, recompute: str, sp: bool,
                          sh: Sharding | None, states_of) -> float:
        """The largest candidate stage's (model states (``states_of(stage)``) + activations in flight) x (1 +
        fragmentation), + the fixed bytes (which read the degrees only)."""
        stages = self.distinct(shape.pp, vpp)
        acts = self._stage_activations(shape, sched, vpp, mb, ga, recompute, sp, sh)
        return self._memory_sum(shape, [states_of(sl) for sl in stages], acts)

    def _stage_activations(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, recompute: str, sp: bool,
                           sh: Sharding | None) -> list[float]:
        """Each candidate stage's activations in flight (_activations). The probe layout (sharding ``sh``, None:
        none) and its setup are built only when an activation total is not cached."""
        made: list[Setup] = []

        def make_setup() -> Setup:
            if not made:
                probe = self._probe(shape, pp=shape.pp, vpp=vpp, sched=sched, mb=mb, ga=ga, rc=recompute, sp=sp, sh=sh)
                made.append(self.setup(shape.option, probe))
            return made[0]

        return [self._activations(shape, None, sl, sched, vpp, mb, ga, recompute, sp, make_setup)
                for sl in self.distinct(shape.pp, vpp)]

    def _memory_sum(self, shape: Shape, states: list[float], acts: list[float]) -> float:
        """The largest stage's (model states + activations) x (1 + fragmentation), + the fixed bytes."""
        frag = cm.fragmentation_factor()
        best = 0.0
        for st, act in zip(states, acts):
            best = max(best, frag * (st + act))
        return _mem_safe(best + self._shape_fixed(shape))

    def _pm_table(self, shape: Shape, sp: bool, sl: StageLayers) -> dict[tuple[int, str], float]:
        """One micro-batch's activations of ``sl`` by (micro-batch, recompute), for the shape's GPU, tp, etp and cp."""
        key = (shape.option, shape.tp, shape.etp, shape.cp, sp, sl.dense, sl.moe, sl.first, sl.last)
        got = self._act_mb.get(key)
        if got is None:
            got = self._act_mb[key] = {}
        return got

    def family_memory(self, shape: Shape, vpp: int, pipes: tuple[tuple[str, tuple], ...]) -> "FamilyMemory":
        """family_memory_lb of one family (shape, vpp, schedules), its per-family parts looked up once: the search
        asks it for many micro-batches, grad_accums and recompute modes. Kept per the vpp's stage compositions, not
        the vpp: the model states read a stage's layers, and one micro-batch's activations neither the vpp nor the
        schedule (the _pm_table caches have neither in their keys); the in-flight counts, which read both, are
        the caller's (family_inflight). The vpps of a pp whose splits put the same layers on each GPU share one."""
        key = (shape, self.compositions(shape.pp, vpp), tuple(id(opts) for _, opts in pipes))
        got = self._family_memory.get(key)
        if got is None:
            got = self._family_memory[key] = FamilyMemory(self, shape, vpp, pipes)
        return got

    def family_memory_lb(self, shape: Shape, vpp: int, pipes: tuple[tuple[str, tuple], ...], mb: int,
                         gas: tuple[int, ...], recompute: str) -> float:
        """Bytes per GPU every layout of ``shape`` with this vpp, micro-batch and recompute needs at least, over
        its schedules (``pipes``: (schedule, its options as group_memory_lb takes them)) and grad_accums
        ``gas``: per stage, the smallest model states over the options plus one micro-batch's activations x
        the smallest in-flight count over the schedules and grad_accums (logits left out); the largest stage."""
        return self.family_memory(shape, vpp, pipes).lb(mb, gas, recompute,
                                                        self.family_inflight(shape, vpp, pipes, gas))

    def compositions(self, pp: int, vpp: int) -> tuple[tuple[int, int, bool, bool], ...]:
        """(dense, MoE, first, last) of each candidate stage (distinct): what the model states read of a split."""
        got = self._compositions.get((pp, vpp))
        if got is None:
            got = self._compositions[(pp, vpp)] = tuple((sl.dense, sl.moe, sl.first, sl.last)
                                                         for sl in self.distinct(pp, vpp))
        return got

    def family_states_lb(self, shape: Shape, vpp: int, pipes: tuple[tuple[str, tuple], ...]) -> float:
        """family_memory_lb without the activations, so at most its value for every micro-batch, grad_accum and
        recompute mode: the largest candidate stage's smallest model states over the options, plus the fixed bytes.
        The states read a stage's layers, not vpp (_stage_params): vpps with the same compositions() have the same
        value (a caller may keep it by them)."""
        return self.family_memory(shape, vpp, pipes).states_lb()

    def _family_states(self, shape: Shape, vpp: int, sl: StageLayers, pipes: tuple[tuple[str, tuple], ...]) -> float:
        """Stage ``sl``'s smallest model states over the options of every schedule of the family."""
        return min(self._min_states(shape, vpp, sl, opts) for _, opts in pipes)

    def family_inflight(self, shape: Shape, vpp: int, pipes: tuple[tuple[str, tuple], ...],
                        gas: tuple[int, ...]) -> tuple[float, ...]:
        """Per candidate stage, the smallest in-flight micro-batch count over the schedules and grad_accums."""
        scheds = tuple(sched for sched, _ in pipes)
        out = []
        for sl in self.distinct(shape.pp, vpp):
            ikey = (scheds, sl.stage, shape.pp, gas, vpp)
            inflight = self._family_inflight.get(ikey)
            if inflight is None:
                inflight = self._family_inflight[ikey] = min(
                    cm.inflight_microbatches(sched, sl.stage, shape.pp, ga, vpp) for sched in scheds for ga in gas)
            out.append(inflight)
        return tuple(out)

    def _shape_fixed(self, shape: Shape) -> float:
        """_fixed of any layout of the shape (CUDA context + NCCL buffers per process group: the degrees only)."""
        key = (shape.tp, shape.pp, shape.cp, shape.experts, shape.dp)
        got = self._fixed_bytes.get(key)
        if got is None:
            got = self._fixed_bytes[key] = self._fixed(self._probe(shape, pp=shape.pp))
        return got

    def option_memory_lb(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, recompute: str, sp: bool,
                         sh: Sharding) -> float:
        """Bytes per GPU of the layout (shape, schedule, vpp, micro-batch, grad_accum, recompute, sequence parallel,
        sharding) at least (_stages_memory_lb with its sharding's model states), without building the layout
        unless an activation total is not cached."""
        return self.options_memory_lb(shape, sched, vpp, mb, ga, recompute, ((sp, sh),))[0]

    def options_memory_lb(self, shape: Shape, sched: str, vpp: int, mb: int, ga: int, recompute: str,
                          options: Iterable[tuple[bool, Sharding]]) -> list[float]:
        """option_memory_lb of each (sequence parallel, sharding) of ``options`` (the options of one group: the
        search asks them all), each stage's activations looked up once per sequence-parallel setting: they do not
        read the sharding (_activations' cache has no sharding in its key)."""
        stages = self.distinct(shape.pp, vpp)
        acts: dict[bool, list[float]] = {}
        out = []
        for sp, sh in options:
            act = acts.get(sp)
            if act is None:
                act = acts[sp] = self._stage_activations(shape, sched, vpp, mb, ga, recompute, sp, sh)
            out.append(self._memory_sum(shape, [self._model_states(shape, vpp, sl, sh) for sl in stages], act))
        return out


class FamilyMemory:
    """Bounds.family_memory_lb of one family: per candidate stage, its smallest model states over the options
    and its table of one micro-batch's activations."""

    __slots__ = ("bounds", "shape", "vpp", "sched", "sps", "sp", "stages", "base", "frag", "_least_sps", "_pms")

    def __init__(self, bounds: Bounds, shape: Shape, vpp: int, pipes: tuple[tuple[str, tuple], ...]):
        self.bounds, self.shape, self.vpp, self.sched = bounds, shape, vpp, pipes[0][0]
        self.sps = tuple(o[0] for _, opts in pipes for o in opts)
        self.sp = sp = bounds._sp_min(shape, self.sps)
        self.stages = tuple((bounds._family_states(shape, vpp, sl, pipes), bounds._pm_table(shape, sp, sl),
                             bounds._pm_table(shape, not sp, sl), sl) for sl in bounds.distinct(shape.pp, vpp))
        self.base = bounds._shape_fixed(shape)
        self.frag = cm.fragmentation_factor()
        self._least_sps: dict[str, tuple[bool, ...]] = {}  # recompute -> Bounds._sp_least_memory
        self._pms: dict[tuple[int, str], tuple[float, ...]] = {}  # (mb, recompute) -> _least_pms

    def states_lb(self) -> float:
        """Bounds.family_states_lb: the largest stage's smallest model states, with the fixed bytes."""
        return _mem_safe(self.frag * max(stage[0] for stage in self.stages) + self.base)

    def lb(self, mb: int, gas: tuple[int, ...], recompute: str, inflight: tuple[float, ...]) -> float:
        """``inflight``: Bounds.family_inflight of ``gas`` (the caller asks many micro-batches with the same; the
        search's bisections ask this hundreds of thousands of times on a large cheapest spec)."""
        pms = self._least_pms(mb, recompute, gas[0])
        best = 0.0
        for (states, _, _, _), pm, k in zip(self.stages, pms, inflight):
            v = states + pm * k
            if v > best:
                best = v
        return _mem_safe(self.frag * best + self.base)

    def linear_fit(self, room: float, gas: tuple[int, ...], recompute: str, inflight: tuple[float, ...]) -> float:
        """The largest micro-batch (a real number) at which ``lb`` would stay within ``room`` bytes were one
        micro-batch's activations exactly proportional to the micro-batch (per stage: mb x its bytes at mb = 1):
        a guess where ``lb``'s fit ends, which a caller checks with ``lb`` itself (the cost model's activations
        are proportional in the cases measured, tests/unit/solver/test_solver_bounds.py, but nothing relies on
        it). inf: no stage's activations grow."""
        pms = self._least_pms(1, recompute, gas[0])
        # lb <= room  <=>  frag x max over stages (states + pm x k) + base <= (room + 1) / (1 - 1e-9) (_mem_safe)
        budget = ((room + 1.0) / (1 - 1e-9) - self.base) / self.frag
        best = float("inf")
        for (states, _, _, _), per_one, k in zip(self.stages, pms, inflight):
            if states > budget:
                return 0.0
            if per_one * k > 0:
                best = min(best, (budget - states) / (per_one * k))
        return best

    def _least_pms(self, mb: int, recompute: str, ga: int) -> tuple[float, ...]:
        """Per stage, one micro-batch's activations at the least over the sequence-parallel settings that may hold
        the fewest (Bounds._sp_least_memory), kept per (micro-batch, recompute)."""
        key = (mb, recompute)
        got_all = self._pms.get(key)
        if got_all is not None:
            return got_all
        sps = self._least_sps.get(recompute)
        if sps is None:
            sps = self._least_sps[recompute] = self.bounds._sp_least_memory(self.shape, self.sps, recompute)
        setups: dict[bool, Setup] = {}
        out = []
        for _, table, other, sl in self.stages:
            pm = float("inf")
            for sp in sps:
                t = table if sp == self.sp else other
                got = t.get(key)
                if got is None:
                    got = self._per_mb(t, sl, sp, mb, ga, recompute, setups)
                if got < pm:
                    pm = got
            out.append(pm)
        got_all = self._pms[key] = tuple(out)
        return got_all

    def _per_mb(self, table: dict, sl: StageLayers, sp: bool, mb: int, ga: int, recompute: str,
                setups: dict[bool, Setup]) -> float:
        pm = table.get((mb, recompute))
        if pm is None:
            setup = setups.get(sp)
            if setup is None:
                shape = self.shape
                probe = self.bounds._probe(shape, pp=shape.pp, vpp=self.vpp, sched=self.sched, mb=mb, ga=ga,
                                           rc=recompute, sp=sp)
                setup = setups[sp] = self.bounds.setup(shape.option, probe)
            pm = table[(mb, recompute)] = cm.stage_activation_bytes(setup, sl)
        return pm


def _mem_safe(x: float) -> float:
    """The cost model truncates its total to whole bytes and sums the items in another order."""
    return x * (1 - 1e-9) - 1.0

