"""The "Layout" section of PLAN.md in words: one line per degree, the batch arithmetic, why this layout won.

Pure functions of the Plan (no Spec, no Problem); numbers are formatted with the
fixed-precision helpers of compiler.units and report_text.
"""
from __future__ import annotations

from compiler.plan import Plan
from compiler.render import report_text as txt
from compiler.units import format_bytes, format_money, format_seconds

_OBJECTIVE = {"fastest": "the shortest time to train within the budget",
              "cheapest": "the lowest cost within the deadline",
              "throughput": "the most tokens/s per GPU"}
_ZERO = {0: "every data-parallel rank keeps full weights, gradients and optimizer states (DDP); "
            "gradients are all-reduced",
         1: "optimizer states are sharded over the {group} (Megatron distributed optimizer)",
         2: "optimizer states and gradients are sharded over the {group}",
         3: "optimizer states, gradients and weights are sharded over the {group} "
            "(FSDP full shard); weights are all-gathered per layer"}
_RECOMPUTE = {"none": "no recomputation: every activation is kept for the backward pass",
              "selective": "the attention core is recomputed in the backward pass (Korthikanti et al. 2022)",
              "full": "each layer's forward is recomputed in the backward pass; only layer inputs are kept"}


def layout_whys(plan: Plan) -> list[str]:
    """One line per degree: what it does here and why it is there."""
    lay, shape, c = plan.layout, plan.model.shape, plan.cluster
    mem = plan.estimate.memory.items
    gpn = c.gpus_per_node
    out = []
    if lay.tp == 1:
        out.append("**tp=1**: no tensor parallelism; each GPU holds whole layers, so no per-layer all-reduce.")
    else:
        heads, kv = shape.num_attention_heads, shape.num_kv_heads
        where = (f"inside one node ({gpn} GPUs per node, {txt.bandwidth(c.intra_node_bandwidth_bytes_per_s)} "
                 f"per direction)" if lay.tp <= gpn else
                 f"across nodes ({txt.bandwidth(c.inter_node_bandwidth_bytes_per_s)} per direction)")
        per_kv = kv // lay.tp
        kv_note = (f"{per_kv} KV head{'s' if per_kv != 1 else ''}" if kv % lay.tp == 0
                   else f"the {kv} KV heads replicated")
        sp = "; sequence parallel also shards norm and dropout activations" if lay.sequence_parallel else ""
        heads_note = (f"{heads} attention heads divide evenly ({heads // lay.tp} per GPU, {kv_note})"
                      if heads % lay.tp == 0 else f"{heads} attention heads do not divide by {lay.tp}")
        out.append(f"**tp={lay.tp}**: each layer's matrices are split over {lay.tp} GPUs {where}; {heads_note}{sp}.")
    layers = shape.num_layers
    if lay.pp == 1:
        out.append("**pp=1**: no pipeline parallelism, so no pipeline bubble.")
    else:
        built = plan.layer_split()
        parts = lay.pp * lay.vpp
        lo, hi = min(built.chunk_layers), max(built.chunk_layers)
        per = f"{lo}" if lo == hi else f"{lo}-{hi}"
        ranks = txt.grouped_counts(built.rank_layers)
        split = (f"{lay.pp} stages x {lay.vpp} interleaved chunks = {parts} model chunks of {per} layers "
                 f"({ranks} per stage)" if lay.vpp > 1 else f"{lay.pp} stages of {ranks} layers")
        how = "" if built.split.mechanism == "even" else f", Megatron's split {built.split.describe()}"
        out.append(f"**pp={lay.pp}**: the {layers} layers run as {split}{how}; "
                   f"schedule {lay.schedule} with {lay.grad_accum} microbatches per step leaves a bubble of "
                   f"{txt.percent(plan.estimate.pipeline_bubble_fraction)}.")
    if lay.cp > 1:
        seq = plan.training.seq_len
        out.append(f"**cp={lay.cp}**: each {seq}-token sequence is split over {lay.cp} GPUs "
                   f"({seq // lay.cp} tokens each), dividing activation memory.")
    if lay.ep > 1:
        n = shape.moe.num_experts if shape.moe else 0
        out.append(f"**ep={lay.ep}**: the {n} experts are spread over {lay.ep} GPUs ({n // lay.ep} per GPU), "
                   f"carved out of {'dp x cp' if lay.etp is None else 'tp x dp x cp'}; tokens reach them by "
                   f"all-to-all.")
    if lay.etp is not None:
        how = ("each GPU runs its experts whole on its own sequence-parallel shard of the tokens" if lay.etp == 1
               else f"each expert is split over {lay.etp} GPUs, which gather their sequence-parallel shards")
        out.append(f"**etp={lay.etp}**: the expert layers re-fold each stage's tp x dp x cp GPUs as etp {lay.etp} "
                   f"x ep {lay.ep} x expert-dp {lay.expert_dp} (--expert-tensor-parallel-size); {how}, where "
                   f"tp={lay.tp} would split every expert.")
    hsdp = f" ({lay.dp_replicate} replicas x {lay.dp_shard}-way sharded, HSDP)" if lay.is_hsdp else ""
    if lay.dp == 1:
        out.append(f"**dp=1**: tp x pp x cp uses all {lay.world_size} GPUs; there is one model replica.")
    else:
        out.append(f"**dp={lay.dp}**: the remaining {lay.world_size} / (tp {lay.tp} x pp {lay.pp} x cp {lay.cp}) "
                   f"= {lay.dp} model replicas each train on a different slice of the batch{hsdp}.")
    group = f"{lay.dp_shard * lay.cp} ranks of dp_shard x cp" if lay.cp > 1 else f"{lay.dp_shard} ranks of dp_shard"
    zero = _ZERO[lay.zero_stage].format(group=group)
    opt = [i for i in mem if i.name in ("optimizer_states", "master_weights")]
    if opt:
        what = " and ".join(i.name.replace("_", " ") for i in opt)
        zero += f"; {what} take {format_bytes(sum(i.value for i in opt))} per GPU"
    out.append(f"**zero={lay.zero_stage}**: {zero}.")
    out.append(f"**micro_batch={lay.micro_batch}**: sequences per GPU per forward pass; "
               f"{lay.grad_accum} of them are accumulated per optimizer step.")
    act = next((i for i in mem if i.name == "activations"), None)
    rec = _RECOMPUTE[lay.recompute] + (f"; activations take {format_bytes(act.value)} per GPU" if act else "")
    out.append(f"**recompute={lay.recompute}**: {rec}.")
    for key, what, where in (("optimizer", "optimizer states", lay.offload_optimizer),
                             ("params", "parameters", lay.offload_params)):
        if where != "none":
            out.append(f"**offload_{key}={where}**: {what} live in {where.upper()} memory and are "
                       f"streamed to the GPU.")
    return out


def run_vs_time_limit(plan: Plan) -> str:
    """The run's length against the job's time limit: how many jobs it takes (PLAN.md, `dtc plan`)."""
    import math

    run_s, limit = plan.estimate.time_to_train_s, plan.slurm.time_limit
    if "slurm" not in plan.targets:
        return ""
    if limit is None:
        return (f"The run takes {format_seconds(run_s)}; no slurm.time_limit is set, so the partition's default "
                "limit applies: set it to know how many jobs the run needs.")
    jobs = math.ceil(run_s / limit)
    if jobs <= 1:
        return (f"The run takes {format_seconds(run_s)}, within slurm.time_limit ({format_seconds(limit)}): "
                "one job.")
    return (f"The run takes {format_seconds(run_s)}, longer than slurm.time_limit ({format_seconds(limit)}): it "
            f"needs at least {jobs:,} jobs one after another, each resuming from the last checkpoint (PLAN.md's "
            f"checkpoint table counts the segments with the signal lead and the restart).")


def batch_arithmetic(plan: Plan) -> str:
    lay, t = plan.layout, plan.training
    line = (f"global batch {lay.global_batch} = micro {lay.micro_batch} x accumulation {lay.grad_accum} "
            f"x dp {lay.dp}; {lay.global_batch} x {t.seq_len} = {txt.thousands(t.tokens_per_step)} "
            f"tokens per step")
    if t.requested_global_batch != lay.global_batch:
        line += f" (requested {t.requested_global_batch}: {t.batch_note})"
    elif " tokens / " in t.batch_note:  # a token batch: how its sequence count was chosen
        line += f" ({t.batch_note})"
    return line


def choice(plan: Plan) -> str:
    objective = plan.budget.objective
    why = _OBJECTIVE.get(objective, objective)
    limit = {"fastest": "max_cost_usd", "cheapest": "deadline_s"}.get(objective)
    if limit and getattr(plan.budget, limit) is None:
        why = why.split(" within ")[0]  # no budget (deadline) given: nothing to be within
    if objective == "cheapest":
        from compiler.solver.objective import CHEAPEST_TIE

        why += f"; costs within {CHEAPEST_TIE:.0%} of the cheapest are ties, and the fastest of them wins"
    if plan.budget.confidence != "expected":
        why += (f"; ranked at {plan.budget.confidence}, the step time {'8' if plan.budget.confidence == 'p80' else '9'}"
                " runs in 10 beat (from each layout's error band: `budget.confidence`)")
    s = plan.search
    text = (f"Chosen for objective `{objective}` ({why}) among {txt.thousands(s.num_considered)} layouts considered: "
            f"{txt.thousands(s.num_evaluated)} costed by the model ({txt.thousands(s.num_feasible)} of them feasible), "
            f"{txt.thousands(s.num_pruned_by_bound)} pruned by bound (they could not beat the layouts kept), the rest "
            f"rejected (below).")
    others = [a for a in plan.alternatives if a.layout != plan.layout]
    if others:
        r = min(others, key=lambda a: (a.rank, a.layout.tag))
        delta = _relative(r.estimate.time_to_train_s, plan.estimate.time_to_train_s)
        text += (f" The runner-up `{r.layout.describe()}` takes {format_seconds(r.estimate.time_to_train_s)} "
                 f"({delta}) and costs {format_money(r.estimate.cost_usd)}"
                 + (f": {' '.join(r.why_lost.split())}." if r.why_lost else "."))
    return text


def _relative(other: float, base: float) -> str:
    if base <= 0:
        return "n/a"
    d = (other - base) / base
    return f"{'+' if d >= 0 else '-'}{abs(d) * 100:.1f}%"

