"""SmokeReport: what each target did, measured against the cost model; text, JSON and smoke.json.

``smoke.json`` is written next to the artifacts (atomically) so that a later compile can
show measured vs predicted memory. It is an extra file, not an artifact: it carries the
sha256 of the plan.json it was measured against, so a reader can tell whether it still
applies to the folder's plan.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compiler.units import format_bytes, format_seconds

SMOKE_FILE = "smoke.json"
SMOKE_SCHEMA_VERSION = 1
STATUSES = ("passed", "failed", "skipped")


@dataclass
class RankMeasure:
    """One rank's measured memory (bytes; None where the target does not measure it)."""

    rank: int
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optimizer_bytes: int | None = None  # optimizer states (+ fp32 master copies where separate)
    activation_bytes: int | None = None  # peak bytes autograd saved for backward
    peak_bytes: int | None = None  # GPU: torch.cuda.max_memory_allocated; CPU: the sum of the above
    rss_bytes: int | None = None  # CPU: the process's peak resident set (includes torch itself)


@dataclass
class Comparison:
    """Measured (max over ranks) vs the cost model's prediction for the same reduced model and world."""

    name: str  # model_states, activations, total
    measured_bytes: int | None
    predicted_bytes: int | None
    predicted_items: tuple[str, ...] = ()
    band: tuple[float, float] | None = None  # the ratios that pass (compiler.smoke.predict.BANDS); None: not judged

    @property
    def ratio(self) -> float | None:
        if not self.measured_bytes or not self.predicted_bytes:
            return None
        return self.measured_bytes / self.predicted_bytes

    @property
    def out_of_band(self) -> bool:
        r = self.ratio
        return self.band is not None and r is not None and not self.band[0] <= r <= self.band[1]

    def verdict(self) -> str:
        """'x1.52 outside 0.80-1.25 (line items: activations, logits_loss)', for a failed check."""
        assert self.band is not None and self.ratio is not None
        items = f" (line items: {', '.join(self.predicted_items)})" if self.predicted_items else ""
        return (f"{self.name} measured/predicted x{self.ratio:.2f} is outside the band "
                f"{self.band[0]:.2f}-{self.band[1]:.2f}{items}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "measured_bytes": self.measured_bytes, "predicted_bytes": self.predicted_bytes,
                "ratio": None if self.ratio is None else round(self.ratio, 4),
                "predicted_items": list(self.predicted_items),
                "band": None if self.band is None else list(self.band), "out_of_band": self.out_of_band}


@dataclass
class TargetResult:
    target: str  # fsdp, deepspeed, megatron
    status: str  # passed, failed, skipped
    reason: str = ""  # why it failed or was skipped
    launched: bool = False
    command: str = ""
    steps_done: int = 0
    steps_requested: int = 0
    losses: list[float] = field(default_factory=list)
    step_time_s: float | None = None  # mean over the steps after the first
    wall_s: float | None = None
    ranks: list[RankMeasure] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    prediction_note: str = ""
    changes: list[dict[str, Any]] = field(default_factory=list)  # target-specific rewrites (ds_config ...)
    notes: list[str] = field(default_factory=list)
    error_rank: int | None = None
    error: str | None = None
    error_tail: str = ""
    jit_ops: list[str] = field(default_factory=list)
    jit_build_s: float | None = None
    slurm: dict[str, Any] | None = None
    model_shape: dict[str, Any] | None = None  # the shape the target built, where it differs from the setup's
    preemption: dict[str, Any] | None = None  # --preempt-at: compiler.smoke.preempt.PreemptionResult

    @property
    def first_loss(self) -> float | None:
        return self.losses[0] if self.losses else None

    @property
    def last_loss(self) -> float | None:
        return self.losses[-1] if self.losses else None

    @property
    def loss_fell(self) -> bool:
        return len(self.losses) >= 2 and self.losses[-1] < self.losses[0]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["comparisons"] = [c.to_dict() for c in self.comparisons]
        d.update(first_loss=self.first_loss, last_loss=self.last_loss, loss_fell=self.loss_fell)
        return d


@dataclass
class SmokeReport:
    generated_dir: str
    plan_name: str
    plan_layout: str
    plan_sha256: str
    setup: dict[str, Any]
    targets: list[TargetResult] = field(default_factory=list)
    explicit: bool = False  # targets were named (not "all")
    warnings: list[str] = field(default_factory=list)  # edits run with --allow-edited, each named

    @property
    def ok(self) -> bool:
        """Every requested target passed. With "all", targets that cannot run here (skipped) do not
        fail the run, but at least one must have passed."""
        if any(t.status == "failed" for t in self.targets):
            return False
        if self.explicit:
            return all(t.status == "passed" for t in self.targets)
        return any(t.status == "passed" for t in self.targets)

    def counts(self) -> dict[str, int]:
        return {s: sum(t.status == s for t in self.targets) for s in STATUSES}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SMOKE_SCHEMA_VERSION,
            "generated_dir": self.generated_dir,
            "plan": self.plan_name,
            "plan_layout": self.plan_layout,
            "plan_sha256": self.plan_sha256,
            "ok": self.ok,
            "counts": self.counts(),
            "setup": self.setup,
            "targets": [t.to_dict() for t in self.targets],
            "warnings": list(self.warnings),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def plan_sha256(plan_text: str) -> str:
    return hashlib.sha256(plan_text.encode("utf-8")).hexdigest()


def write_smoke_json(report: SmokeReport, generated_dir: Path) -> Path:
    """Write ``generated_dir/smoke.json`` atomically (temp file + rename)."""
    path = Path(generated_dir) / SMOKE_FILE
    fd, tmp = tempfile.mkstemp(prefix=".smoke-", suffix=".json", dir=generated_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(report.to_json())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# ------------------------------------------------------------------------------------------- text
def _b(x: int | None) -> str:
    return "-" if x is None else format_bytes(x)


def _s(x: int | None) -> str:  # a step time comparison holds microseconds
    return "-" if x is None else format_seconds(x / 1e6)


def format_setup(setup: dict[str, Any]) -> list[str]:
    s, d = setup["shape"], setup["degrees"]
    mesh = " x ".join(f"{k}={d[k]}" for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    if d.get("vpp", 1) > 1:
        mesh += f" (vpp={d['vpp']})"
    ratio = s["num_attention_heads"] // max(1, s["num_kv_heads"])
    moe = f", MoE {s['moe']['num_experts']} experts top-{s['moe']['top_k']}" if s.get("moe") else ""
    lines = [
        f"  world    {setup['world_size']} x {setup['device']} ({setup['backend']}): {mesh}",
        f"  model    {s['num_layers']} layers, hidden {s['hidden_size']}, {s['num_attention_heads']} heads / "
        f"{s['num_kv_heads']} kv (GQA {ratio}), {s['mlp']} ffn {s['ffn_hidden_size']}, {s['norm']}, "
        f"vocab {s['vocab_size']}, seq {setup['seq_len']}{moe}",
        f"  batch    micro {setup['micro_batch']} x accum {setup['grad_accum']} x dp "
        f"{d['dp_replicate'] * d['dp_shard']} = {setup['global_batch']} sequences per step; "
        f"{setup['precision']}; {setup['steps']} steps",
        f"  kept     {', '.join(setup['kept'])}",
    ]
    changes = setup.get("changes") or []
    for i, c in enumerate(changes):
        head = "  scaled   " if i == 0 else "           "
        lines.append(f"{head}{c['what']} {c['plan']} -> {c['smoke']}: {c['why']}")
    return lines


def format_target(t: TargetResult) -> list[str]:
    head = f"{t.target:<10} {t.status:<8}"
    if t.status == "skipped":
        return [f"{head} {t.reason}"]
    bits = [f"{t.steps_done}/{t.steps_requested} steps"]
    if t.losses:
        bits.append(f"loss {t.first_loss:.4f} -> {t.last_loss:.4f}" + ("" if t.loss_fell else " (did not fall)"))
    if t.step_time_s is not None:
        bits.append(f"step {t.step_time_s:.2f} s")
    if t.wall_s is not None:
        bits.append(f"wall {t.wall_s:.0f} s")
    if t.jit_ops:
        bits.append(f"JIT {', '.join(t.jit_ops)}" + (f" ({t.jit_build_s:.0f} s)" if t.jit_build_s else ""))
    lines = [f"{head} {'  '.join(bits)}"]
    if t.status == "failed":
        lines.append(f"  why      {t.reason}")
        if t.error:
            lines.append(f"  rank {t.error_rank if t.error_rank is not None else '?'}   {t.error}")
        if t.error_tail and not t.error:
            lines += ["  | " + row for row in t.error_tail.splitlines()[-12:]]
    for c in t.changes:
        lines.append(f"  config   {c['what']}: {c['plan']} -> {c['smoke']} ({c['why']})")
    if t.ranks:
        lines.append("  memory   per rank: " + "; ".join(
            f"r{r.rank} params {_b(r.param_bytes)} grads {_b(r.grad_bytes)} optim {_b(r.optimizer_bytes)} "
            f"act {_b(r.activation_bytes)}" for r in t.ranks[:4]) + (" ..." if len(t.ranks) > 4 else ""))
    for cmp in t.comparisons:
        ratio = "-" if cmp.ratio is None else f"x{cmp.ratio:.2f}"
        band = "" if cmp.band is None else f"  band {cmp.band[0]:.2f}-{cmp.band[1]:.2f}" + (
            " OUT" if cmp.out_of_band else "")
        fmt = _s if cmp.name == "step_time" else _b
        lines.append(f"  {cmp.name:<16} measured {fmt(cmp.measured_bytes):>10}  predicted {fmt(cmp.predicted_bytes):>10}"
                     f"  ratio {ratio}{band}")
    if t.preemption is not None:
        pre = t.preemption
        diff = "-" if pre["max_abs_diff"] is None else f"{pre['max_abs_diff']:.2g}"
        lines.append(f"  preempt  SIGUSR1 during step {pre['requested_at']}: stopped after step "
                     f"{pre['stopped_after_step']}, resumed from step {pre['resumed_from_step']}; steps "
                     f"{pre['compared_steps']} match the uninterrupted run: {pre['losses_match']} (max diff {diff})")
    if t.prediction_note:
        lines.append(f"  note     {t.prediction_note}")
    for n in t.notes:
        lines.append(f"  note     {n}")
    if t.slurm:
        lines.append(f"  slurm    job {t.slurm.get('job_id')} {t.slurm.get('state')} exit {t.slurm.get('exit_code')}")
        if t.status == "failed" and t.slurm.get("log_tail"):
            lines += ["  | " + row for row in str(t.slurm["log_tail"]).splitlines()[-15:]]
    return lines


def format_report(report: SmokeReport) -> str:
    lines = [f"dtc smoke {report.generated_dir} (plan {report.plan_name}, layout {report.plan_layout})"]
    lines += format_setup(report.setup)
    lines += [f"  warning: {w}" for w in report.warnings]
    for t in report.targets:
        lines += format_target(t)
    c = report.counts()
    lines.append(f"Smoke: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
                 + ("." if report.ok else " -- FAILED."))
    return "\n".join(lines) + "\n"
