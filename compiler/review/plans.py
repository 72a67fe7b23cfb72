"""What a config change does: two sides (Plan + ArtifactSet) -> an ``ArtifactDiff`` (pure, no disk).

A side is one version of a run: a spec compiled in memory (from disk or from git),
or a generated folder read back with its plan.json. ``diff_sides(old, new)``
compares two the way a reviewer reads a change (Terraform's differ, apart from
its renderers):

1. the semantic summary from the two Plans: layout fields, memory per GPU, step
   time, MFU, time to train, GPU-hours and cost, each old -> new with the delta,
   and the warnings a reviewer needs (memory now within 3% of usable HBM, cost up
   20% or more, a target dropped, the new spec infeasible, ...);
2. one ``FileChange`` per artifact (compiler.review.files): JSON key paths old -> new,
   shell flags, ``#SBATCH`` directives and exported variables, Python constants,
   line counts and the unified diff for everything.

``format_diff`` (compiler.review.format) turns diffs into text, Markdown or JSON; it imports this
module, never the other way round.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from compiler.artifacts import MANIFEST, ArtifactSet
from compiler.review.files import FileChange, KeyChange, compare_file, explain_plan_json, file_changes, key_changes
from compiler.plan import BudgetSection, Plan
from compiler import uncertainty
from compiler.units import format_bytes, format_count, format_money, format_seconds, format_seconds_range

# Warning thresholds (relative changes unless noted).
HBM_MARGIN = 0.03  # memory within 3% of usable HBM
COST_UP = 0.20
TIME_UP = 0.20
MFU_DOWN = 0.10  # relative: 40% -> 36% is down 10%
BUDGET_MARGIN = 0.05  # cost within 5% of budget.max_cost

# Summary rows that restate the spec's inputs; the others are what the solver made of them.
INPUT_ROWS = frozenset({"model", "tokens", "budget", "targets"})


@dataclass(frozen=True)
class Side:
    """One version of a run: its Plan (None when absent or it failed) and its artifacts.

    ``error`` says why a side that should exist has no plan ("infeasible: ..."); a side
    with no plan, no artifacts and no error does not exist (a spec added or removed).
    """

    label: str
    plan: Plan | None = None
    artifacts: ArtifactSet = field(default_factory=ArtifactSet)
    error: str = ""
    notes: tuple[str, ...] = ()  # caveats shown as warnings, e.g. "plan.json unreadable: ..."
    inputs: Any = None  # a spec side: {dotted key: value as written} (spec_inputs); None for a generated folder

    @property
    def exists(self) -> bool:
        return self.plan is not None or bool(self.artifacts.files) or bool(self.error)


@dataclass(frozen=True)
class SummaryChange:
    """One row of the semantic summary; ``old``/``new`` are display strings (None: that side has no plan)."""

    key: str  # stable id: model, tokens, gpus, budget, targets, layout, global_batch, memory, ...
    label: str
    old: str | None
    new: str | None
    change: str  # "-8.8%", "tp 8 -> 4, zero 1 -> 3", "+1.2 pts"; "" when there is nothing to add
    changed: bool
    old_value: Any = None
    new_value: Any = None


@dataclass(frozen=True)
class InputChange:
    """One value of the spec that differs between the sides, as written (None: not given on that side)."""

    key: str  # dotted, e.g. cluster.gpu
    old: str | None
    new: str | None


def spec_inputs(loaded: Any) -> dict[str, str]:
    """What a spec gives, key by key (dotted paths), each value as the file writes it ('15T', not 1.5e13)."""
    data = loaded.spec.model_dump(mode="json", exclude_unset=True)
    src = loaded.source
    out: dict[str, str] = {}

    def walk(node: Any, path: tuple) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, path + (key,))
            return
        out[".".join(map(str, path))] = _as_written(src, path, node)

    walk(data, ())
    return out


def _as_written(src: Any, path: tuple, value: Any) -> str:
    import json

    where = src.values.get(path)
    if where is not None and not isinstance(value, (dict, list)):
        row = src.line(where[0]) or ""
        end = src.locate(path).end_column or len(row) + 1
        text = row[where[1] - 1:end - 1].strip().rstrip(",}]").strip()
        if text:
            return text
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def input_changes(old: Side, new: Side) -> tuple[InputChange, ...]:
    if old.inputs is None or new.inputs is None:
        return ()
    keys = sorted(set(old.inputs) | set(new.inputs))
    return tuple(InputChange(k, old.inputs.get(k), new.inputs.get(k)) for k in keys
                 if old.inputs.get(k) != new.inputs.get(k))


@dataclass(frozen=True)
class ArtifactDiff:
    title: str
    old_label: str
    new_label: str
    old_name: str | None
    new_name: str | None
    status: str  # same, changed, added, removed
    old_error: str = ""
    new_error: str = ""
    layout_changes: tuple[KeyChange, ...] = ()
    summary: tuple[SummaryChange, ...] = ()
    warnings: tuple[str, ...] = ()
    files: tuple[FileChange, ...] = ()
    inputs: tuple[InputChange, ...] = ()  # what the spec change was (two spec sides)

    @property
    def changed(self) -> bool:
        return self.status != "same"

    @property
    def name(self) -> str:
        old, new = self.old_name, self.new_name
        if old and new and old != new:
            return f"{old} -> {new}"
        return new or old or "?"

    @property
    def plan_changed(self) -> bool:
        """Did the solved plan change: layout, GPUs, batch or any estimate (not only inputs like the budget)?"""
        return any(row.changed for row in self.summary if row.key not in INPUT_ROWS)

    def counts(self) -> dict[str, int]:
        out = {"add": 0, "change": 0, "remove": 0, "same": 0}
        for f in self.files:
            out[f.action] += 1
        return out

    def to_dict(self, *, unified: bool = False) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for f, fd in zip(self.files, data["files"], strict=True):
            fd["key_changes"] = [dict(k, op=kc.op) for k, kc in zip(fd["key_changes"], f.key_changes, strict=True)]
            if not unified:
                fd.pop("unified")
        data["layout_changes"] = [dict(k, op=kc.op)
                                  for k, kc in zip(data["layout_changes"], self.layout_changes, strict=True)]
        data["name"] = self.name
        data["counts"] = self.counts()
        return data


# --------------------------------------------------------------------------- the entry point


def diff_sides(old: Side, new: Side, *, title: str | None = None, context: int = 3) -> ArtifactDiff:
    """Compare two versions of a run; pure."""
    assert old.exists or new.exists, "diff_sides needs at least one side that exists"
    if title is None:
        title = old.label if old.label == new.label else f"{old.label} -> {new.label}"
    one_failed = bool(old.error or new.error)
    files = () if one_failed else tuple(file_changes(old.artifacts, new.artifacts, context))
    summary = tuple(summary_rows(old.plan, new.plan))
    if not any(row.changed for row in summary):
        files = tuple(explain_plan_json(f, old.artifacts, new.artifacts) for f in files)
    layout_changes = _layout_changes(old.plan, new.plan)
    if not old.exists:
        status = "added"
    elif not new.exists:
        status = "removed"
    elif any(f.action != "same" for f in files) or old.error != new.error:
        status = "changed"
    else:
        status = "same"
    return ArtifactDiff(
        title=title, old_label=old.label, new_label=new.label,
        old_name=_name(old), new_name=_name(new), status=status,
        old_error=old.error, new_error=new.error,
        layout_changes=layout_changes, summary=summary,
        warnings=tuple(warnings_for(old, new, summary)) if status != "same" else (),
        files=files, inputs=input_changes(old, new))


def _name(side: Side) -> str | None:
    return side.plan.name if side.plan is not None else None


# --------------------------------------------------------------------------- the semantic summary

_LAYOUT_FIELDS = (("tp", "tp"), ("pp", "pp"), ("vpp", "vpp"), ("cp", "cp"), ("ep", "ep"), ("expert_tp", "etp"),
                  ("dp", "dp"), ("dp_replicate", "dp_replicate"), ("dp_shard", "dp_shard"), ("zero_stage", "zero"),
                  ("micro_batch", "micro_batch"), ("grad_accum", "grad_accum"), ("recompute", "recompute"),
                  ("sequence_parallel", "sp"), ("schedule", "schedule"),
                  ("offload_optimizer", "offload_optimizer"), ("offload_params", "offload_params"))


def _layout_changes(old: Plan | None, new: Plan | None) -> tuple[KeyChange, ...]:
    if old is None or new is None:
        return ()
    a, b = old.layout, new.layout
    hsdp = a.is_hsdp or b.is_hsdp
    out = []
    for attr, label in _LAYOUT_FIELDS:
        if attr in ("dp_replicate", "dp_shard") and not hsdp:
            continue
        if attr == "schedule" and a.pp == 1 and b.pp == 1:
            continue
        if attr == "expert_tp" and a.etp is None and b.etp is None:  # follows tp (shown there)
            continue
        va, vb = getattr(a, attr), getattr(b, attr)
        if va != vb:
            out.append(KeyChange(label, _show(va), _show(vb)))
    return tuple(out)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _rel(old: float | None, new: float | None) -> float | None:
    if old is None or new is None or old == 0:
        return None
    return (new - old) / abs(old)


def _pct(old: float | None, new: float | None) -> str:
    rel = _rel(old, new)
    if rel is None or old == new:
        return ""
    return f"{rel * 100:+.1f}%"


def _budget_text(b: BudgetSection) -> str:
    parts = [f"max {format_money(b.max_cost_usd)}"] if b.max_cost_usd is not None else []
    if b.deadline_s is not None:
        parts.append(f"deadline {format_seconds(b.deadline_s)}")
    return ", ".join(parts + [b.objective if b.confidence == "p80" else f"{b.objective} at {b.confidence}"])


def _memory_value(p: Plan) -> tuple[int, int]:
    return p.estimate.memory.total_bytes_per_gpu, p.estimate.memory.usable_bytes_per_gpu


def _host_value(p: Plan) -> list[int | None]:
    m = p.estimate.memory
    return [m.cpu_bytes_per_node, m.usable_cpu_bytes_per_node, p.cluster.host_memory_bytes_per_node]


def _host_text(p: Plan) -> str:
    """The offloaded states per node against the usable host memory ('none offloaded to the CPU' without)."""
    m = p.estimate.memory
    if not m.cpu_bytes_per_node:
        return "none offloaded to the CPU"
    if m.usable_cpu_bytes_per_node is None:
        return f"{format_bytes(m.cpu_bytes_per_node)} offloaded (host memory not known)"
    return f"{format_bytes(m.cpu_bytes_per_node)} offloaded of {format_bytes(m.usable_cpu_bytes_per_node)}"


def _facts(p: Plan) -> dict[str, tuple[str, Any, str, float | None]]:
    """Summary key -> (label, raw value compared and kept in JSON, text, number whose change is shown in %)."""
    e, c, t, m = p.estimate, p.cluster, p.training, p.model
    total, usable = _memory_value(p)
    nodes = f"{c.num_nodes} node{'s' if c.num_nodes != 1 else ''}"
    return {
        "model": ("model", [m.name, m.params_total], f"{m.name} ({format_count(m.params_total)} params)",
                  m.params_total),
        "tokens": ("tokens", t.tokens, format_count(t.tokens), t.tokens),
        "gpus": ("GPUs", [c.num_gpus, c.gpu, c.num_nodes], f"{c.num_gpus} x {c.gpu} ({nodes})",
                 c.num_gpus),
        "budget": ("budget", [p.budget.max_cost_usd, p.budget.deadline_s, p.budget.objective, p.budget.confidence],
                   _budget_text(p.budget), p.budget.max_cost_usd),
        "targets": ("targets", list(p.targets), ", ".join(p.targets), None),
        "layout": ("layout", p.layout.describe(), p.layout.describe(), None),
        "global_batch": ("global batch", [t.global_batch, t.seq_len],
                         f"{t.global_batch:,} x {t.seq_len:,} tokens", t.global_batch * t.seq_len),
        "memory": ("memory/GPU", [total, usable], f"{format_bytes(total)} of {format_bytes(usable)}", total),
        "host_memory": ("host memory/node", _host_value(p), _host_text(p), e.memory.cpu_bytes_per_node or None),
        "step_time": ("step time", [e.step_time_s, *e.step_time_band_s], _with_band(e.step_time_s, e.step_time_band_s),
                      e.step_time_s),
        "throughput": ("tokens/s/GPU", e.tokens_per_s_per_gpu, f"{e.tokens_per_s_per_gpu:,.0f}",
                       e.tokens_per_s_per_gpu),
        "mfu": ("MFU", e.mfu, f"{e.mfu * 100:.1f}%", None),
        "time_to_train": ("time to train", [e.time_to_train_s, *e.time_to_train_band_s],
                          _with_band(e.time_to_train_s, e.time_to_train_band_s), e.time_to_train_s),
        "band": ("80% band", None if e.band is None else [e.band.runs, e.band.regime, e.band.calibrated],
                 uncertainty.band_source(e), None),
        "gpu_hours": ("GPU-hours", e.gpu_hours, f"{e.gpu_hours:,.0f}", e.gpu_hours),
        "cost": ("cost", e.cost_usd, format_money(e.cost_usd), e.cost_usd),
    }


def _with_band(seconds: float, band: tuple[float, float]) -> str:
    """'13.98 s (80% band 11.36-15.27 s)'."""
    if band[0] == band[1]:
        return format_seconds(seconds)
    return f"{format_seconds(seconds)} (80% band {format_seconds_range(*band)})"


def _change(key: str, a: Plan, b: Plan, num_a: float | None, num_b: float | None) -> str:
    if key == "layout":
        return ", ".join(f"{k.key} {k.old} -> {k.new}" for k in _layout_changes(a, b))
    if key == "targets":
        return ", ".join([f"+{t}" for t in b.targets if t not in a.targets] +
                         [f"-{t}" for t in a.targets if t not in b.targets])
    if key == "mfu":
        return f"{(b.estimate.mfu - a.estimate.mfu) * 100:+.1f} pts"
    if key == "band":
        ra = a.estimate.band.runs if a.estimate.band is not None else 0
        rb = b.estimate.band.runs if b.estimate.band is not None else 0
        return f"{ra} -> {rb} published runs" if ra != rb else "another regime"
    return _pct(num_a, num_b)


def summary_rows(old: Plan | None, new: Plan | None) -> list[SummaryChange]:
    """Every row of the semantic summary, old -> new (a side without a plan shows None)."""
    fa = _facts(old) if old is not None else {}
    fb = _facts(new) if new is not None else {}
    rows = []
    for key in (fb or fa):
        label = (fb or fa)[key][0]
        _, va, ta, na = fa.get(key, (label, None, None, None))
        _, vb, tb, nb = fb.get(key, (label, None, None, None))
        if key == "host_memory" and not (va and va[0]) and not (vb and vb[0]):
            continue  # neither plan offloads to the CPU
        change = _change(key, old, new, na, nb) if old is not None and new is not None and va != vb else ""
        rows.append(SummaryChange(key=key, label=label, old=ta, new=tb, change=change, changed=va != vb,
                                  old_value=va, new_value=vb))
    return rows


# --------------------------------------------------------------------------- warnings


def warnings_for(old: Side, new: Side, summary: Sequence[SummaryChange]) -> list[str]:
    """What a reviewer must not miss; thresholds are the module constants."""
    out: list[str] = [*old.notes, *new.notes]
    if new.error:
        out.append(f"the new version does not compile: {new.error}")
    if old.error and not new.error:
        out.append(f"the old version did not compile: {old.error}")
    a, b = old.plan, new.plan
    if b is not None:
        total, usable = _memory_value(b)
        near = total >= (1 - HBM_MARGIN) * usable
        was_near = a is not None and _memory_value(a)[0] >= (1 - HBM_MARGIN) * _memory_value(a)[1]
        if near and not was_near:
            out.append(f"memory is {'now ' if a is not None else ''}within {HBM_MARGIN:.0%} of usable HBM "
                       f"({total / 2**30:.1f} of {usable / 2**30:.1f} GiB per GPU)")
        limit = b.budget.max_cost_usd
        if limit is not None and _near_budget(b) and not (a is not None and _near_budget(a)):
            out.append(f"cost is {'now ' if a is not None else ''}within {BUDGET_MARGIN:.0%} of the budget "
                       f"({format_money(b.estimate.cost_usd)} of {format_money(limit)})")
    if a is None or b is None:
        return out
    ea, eb = a.estimate, b.estimate
    rel = _rel(ea.cost_usd, eb.cost_usd)
    if rel is not None and rel >= COST_UP:
        out.append(f"cost up {rel:.0%} ({format_money(ea.cost_usd)} -> {format_money(eb.cost_usd)})")
    rel = _rel(ea.time_to_train_s, eb.time_to_train_s)
    if rel is not None and rel >= TIME_UP:
        out.append(f"time to train up {rel:.0%} ({format_seconds(ea.time_to_train_s)} -> "
                   f"{format_seconds(eb.time_to_train_s)})")
    rel = _rel(ea.mfu, eb.mfu)
    if rel is not None and -rel >= MFU_DOWN:
        out.append(f"MFU down {-rel:.0%} relative ({ea.mfu * 100:.1f}% -> {eb.mfu * 100:.1f}%)")
    ta, tb = ea.band, eb.band
    if tb is not None and tb.thin and not (ta is not None and ta.thin):
        out.append(f"the new plan lies in a thin regime ({tb.describe()}): its 80% band is wide; PLAN.md names the "
                   "best well-calibrated alternative")
    for target in a.targets:
        if target not in b.targets:
            gone = sorted(p for p in old.artifacts.files if p not in new.artifacts.files and p != MANIFEST)
            what = f": {', '.join(gone)} no longer generated" if gone else ""
            out.append(f"target {target} dropped{what}")
    ga, gb = a.training.global_batch, b.training.global_batch
    if ga != gb:
        out.append(f"global batch {ga:,} -> {gb:,} sequences: this changes the training itself "
                   f"(learning-rate schedule, convergence), not only its speed")
    return out


def _near_budget(p: Plan) -> bool:
    limit = p.budget.max_cost_usd
    return limit is not None and p.estimate.cost_usd >= (1 - BUDGET_MARGIN) * limit


__all__ = ["ArtifactDiff", "FileChange", "KeyChange", "Side", "SummaryChange", "compare_file", "diff_sides",
           "key_changes", "summary_rows", "warnings_for"]
