"""dtc calibrate (issue #12): log parsing in the frameworks' exact formats, the profile fit (bounds,
shrinkage, leave-one-out), the profile file (round trip, errors with positions) and its use by a spec."""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compiler.calibration import logs as L
from compiler.calibration.fit import predict
from compiler.calibration.measured import load_measured, run_of_log
from compiler.calibration.profile import ALL_PARAMETERS, HUBER_CHOICES, MIN_INFORMATION_RUNS, PARAMS, PRIOR_CHOICES, \
    PRIOR_RUNS, load_profile, parse_profile
from compiler.calibration.profile_fit import fit_profile, informed_constants, told_apart
from compiler.calibration.runs import load_runs
from compiler.costmodel.efficiency import load_efficiency
from compiler.errors import DtcError
from compiler.plan import Plan

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"
PLAN = ROOT / "generated" / "tinyllama-1b" / "plan.json"  # global batch 1024 x 2048, 16 x a100-80gb


# --- Megatron-LM / megatron-core 0.19 ---------------------------------------------------------------------

def megatron_line(it: int, total: int, ms: float, gbs: int, *, prefix: str = "") -> str:
    """training.py training_log's line, built with its own format strings (megatron-core 0.19.2,
    megatron/training/training.py:2844-2897), log_throughput on, as print_rank_last prints it."""
    s = " [2026-11-30 10:00:{:02d}.123456]".format(it % 60)
    s += ' iteration {:8d}/{:8d} |'.format(it, total)
    s += ' consumed samples: {:12d} |'.format(it * gbs)
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(ms)
    s += f' throughput per GPU (TFLOP/s/GPU): {123.4:.1f} |'
    s += f' learning rate: {3e-4:.6E} |'
    s += f' global batch size: {gbs:5d} |'
    s += ' {}: {:.6E} |'.format("lm loss", 7.5)
    s += f' loss scale: {1.0:.1f} |'
    s += f' grad norm: {1.234:.3f} |'
    s += ' number of skipped iterations: {:3d} |'.format(0)
    s += ' number of nan iterations: {:3d} |'.format(0)
    return prefix + s


def test_megatron_real_smoke_lines():
    # lines of a real megatron-core 0.19.2 CPU run (tests/test_smoke_megatron.py), srun's rank prefix kept
    text = "\n".join([
        "[1]: [2026-12-01 11:58:25.240786] iteration        1/       4 | consumed samples:            4 | "
        "elapsed time per iteration (ms): 97.7 | learning rate: 1.000000E-03 | global batch size:     4 | "
        "lm loss: 5.575032E+00 | loss scale: 1.0 | grad norm: 0.920 |",
        "[0]:[Rank 0] (after 1 iterations) memory (MB) | allocated: 543.08 | max allocated: 542.80 | reserved: 5",
        "[1]: [2026-12-01 11:58:25.276639] iteration        2/       4 | consumed samples:            8 | "
        "elapsed time per iteration (ms): 66.7 | learning rate: 1.000000E-03 | global batch size:     4 | "
        "lm loss: 5.403772E+00 | loss scale: 1.0 | grad norm: 0.9 |",
        "[1]: [2026-12-01 11:58:25.310000] iteration        3/       4 | consumed samples:           12 | "
        "elapsed time per iteration (ms): 30.0 | learning rate: 1.000000E-03 | global batch size:     4 | "
        "lm loss: 5.3 | loss scale: 1.0 | grad norm: 0.9 |",
    ])
    log = L.parse_log(text, "run.log")
    assert log.format == "megatron" and log.date == "2026-12-01"
    assert [s.step for s in log.steps] == [1, 2, 3] and [s.line for s in log.steps] == [1, 3, 4]
    # iteration 1 is warm-up; iteration 2's line is the mean of 1 and 2 (Megatron issue 6237): 2 x 66.7 - 97.7
    assert [s.value for s in log.timed] == pytest.approx([0.0357, 0.030])
    assert log.steady_value == pytest.approx((0.0357 + 0.030) / 2)
    assert log.steps[0].global_batch == 4


def test_megatron_format_from_source_with_interval():
    lines = [megatron_line(i, 100, ms, 1024, prefix="0: ") for i, ms in ((10, 9000.0), (20, 5000.0), (30, 4000.0),
                                                                         (40, 4200.0))]
    log = L.parse_log("\n".join(lines), "m.log")
    # log_interval 10: the second line mixes the first window in and cannot be recovered: left out too
    assert [s.step for s in log.timed] == [30, 40] and log.steady_value == pytest.approx(4.1)


def test_megatron_log_of_another_plan_is_refused():
    plan = Plan.from_json(PLAN.read_text())
    log = L.parse_log("\n".join(megatron_line(i, 10, 1000.0, 512) for i in (1, 2, 3)), "other.log")
    with pytest.raises(DtcError) as exc:
        run_of_log(log, plan, str(PLAN))
    d = exc.value.diagnostics[0]
    assert "global batch size 512 is not the plan's 1024" in d.summary and d.location.line == 1


def test_megatron_log_gives_tokens_per_gpu():
    plan = Plan.from_json(PLAN.read_text())
    log = L.parse_log("\n".join(megatron_line(i, 10, ms, 1024) for i, ms in ((1, 9000.0), (2, 5000.0), (3, 4000.0),
                                                                              (4, 4000.0))), "m.log")
    run = run_of_log(log, plan, str(PLAN))
    # 1024 x 2048 tokens per 4.0 s step (iteration 2 unaveraged to 1.0 s is left in: median of 1.0, 4.0, 4.0)
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(1024 * 2048 / 4.0 / 16)
    assert run.framework.name == "megatron" and run.layout == plan.layout


# --- DeepSpeed 0.19: its own ThroughputTimer writes the lines -------------------------------------------

def deepspeed_lines(batch: int, seconds: float, steps: int = 6) -> str:
    from deepspeed.utils import logger
    from deepspeed.utils.timer import ThroughputTimer

    class Config:
        enabled, synchronized = True, False

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logger.handlers[0].formatter)  # DeepSpeed's own "[time] [LEVEL] [file:line:func] msg"
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        timer = ThroughputTimer(Config(), batch_size=batch, start_step=2, steps_per_output=1)
        for _ in range(steps):
            timer.start()
            time.sleep(seconds)
            timer.stop(global_step=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return buf.getvalue()


def test_deepspeed_throughput_timer_lines():
    text = deepspeed_lines(32, 0.05)
    assert "CurrSamplesPerSec=" in text
    log = L.parse_log("some other line\n" + text, "ds.log")
    assert log.format == "deepspeed" and log.unit == "samples/s" and len(log.timed) >= 2
    assert 32 / log.steady_value == pytest.approx(0.05, rel=0.5)  # a sleep of 50 ms per step (a loaded machine)


# --- torchtitan ---------------------------------------------------------------------------------------------

class Color:  # torchtitan/tools/utils.py Color
    red, green, orange, turquoise = "\033[31m", "\033[32m", "\033[38;2;180;60;0m", "\033[38;2;54;234;195m"
    blue, cyan, magenta, reset = "\033[34m", "\033[36m", "\033[35m", "\033[39m"


def torchtitan_line(step: int, tps: float) -> str:
    """torchtitan/components/metrics.py MetricsProcessor.log, through its logger
    '[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s'."""
    color = Color
    msg = (f"{color.red}step: {step:2}  "
           f"{color.green}loss: {7.1234:8.5f}  "
           f"{color.orange}grad_norm: {1.2345:7.4f}  "
           f"{color.turquoise}memory: {30.12:5.2f}GiB"
           f"({38.05:.2f}%)  "
           f"{color.blue}tps: {round(tps):,}  "
           f"{color.cyan}tflops: {56.78:,.2f}  "
           f"{color.magenta}mfu: {5.74:.2f}%{color.reset}")
    return f"[titan] 2026-11-29 08:00:{step:02d},123 - root - INFO - {msg}"


def test_torchtitan_lines():
    text = "\n".join(torchtitan_line(s, t) for s, t in ((1, 200.0), (10, 3210.0), (20, 3190.0), (30, 3300.0)))
    log = L.parse_log(text, "tt.log")
    assert log.format == "torchtitan" and log.date == "2026-11-29"
    assert log.steady_value == 3210.0  # tokens/s per GPU, thousands separators read; step 1 left out


# --- dtc's own trainers -------------------------------------------------------------------------------------

def test_dtc_trainer_lines():
    fsdp = "\n".join(f"step {s}/10 loss {5.0:.4f} lr {1e-4:.3e} grad_norm {0.5:.4f} time {t:.3f}s tokens/s {99:.0f}"
                     for s, t in ((1, 3.0), (2, 1.0), (3, 1.2)))  # compiler/runtime/fsdp_train.py
    log = L.parse_log(fsdp, "f.log")
    assert log.format == "dtc-fsdp" and log.steady_value == pytest.approx(1.1) and log.date is None
    ds = "\n".join(f"[ds_train] step {s}/10 loss {5.0:.4f} lr {1e-4:.3e} time {t:.2f}s tokens/s {99:.0f}"
                   for s, t in ((1, 3.0), (2, 2.0)))  # compiler/runtime/deepspeed_train.py log()
    log = L.parse_log(ds, "d.log")
    assert log.format == "dtc-deepspeed" and log.steady_value == 2.0


def test_log_errors_carry_locations():
    with pytest.raises(DtcError) as exc:
        L.parse_log("hello\nworld\n", "x.log")
    assert "no per-step training line" in exc.value.diagnostics[0].summary
    with pytest.raises(DtcError) as exc:
        L.parse_log("x\n" + torchtitan_line(1, 10.0), "one.log")
    d = exc.value.diagnostics[0]
    assert "warm-up" in d.summary and (d.location.path, d.location.line) == ("one.log", 2)
    with pytest.raises(DtcError) as exc:
        L.parse_log(torchtitan_line(1, 10.0) + "\n" + megatron_line(1, 2, 10.0, 4), "mixed.log")
    assert "mixes" in exc.value.diagnostics[0].summary and exc.value.diagnostics[0].location.line == 2


# --- the fit ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    rows = list(csv.DictReader(CSV.open(newline="", encoding="utf-8")))
    keep = [r for r in rows if r["source_id"] == "mosaic_llmfoundry" and r["gpu_type"].lower().startswith("h100")][:6]
    path = tmp_path_factory.mktemp("csv") / "h100.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    runs, _ = load_runs(path)
    assert len(runs) >= 4
    return path, runs


def test_profile_stays_in_physical_ranges_and_reports_loo(small_runs):
    _, runs = small_runs
    base = load_efficiency()
    # a cluster three times faster than anything physical: the constants stop at their ranges
    fast = [dataclasses.replace(r, measured_tokens_per_s_per_gpu=3 * predict(r, base).tokens_per_s_per_gpu)
            for r in runs]
    profile = fit_profile(fast, name="fast", base=base)
    for name, c in profile.constants.items():
        assert PARAMS[name].lower <= c.value <= PARAMS[name].upper, name
    assert profile.constants["compute_scale"].value == PARAMS["compute_scale"].upper
    assert profile.summary("after")["median_abs_error"] > 0.3  # the rest stays unexplained, and says so
    assert len(profile.runs) == len(runs) and all(math.isfinite(r.error_loo) for r in profile.runs)


def test_profile_shrinks_towards_the_global_fit(small_runs):
    _, runs = small_runs
    base = load_efficiency()
    slow = [dataclasses.replace(r, measured_tokens_per_s_per_gpu=0.8 * predict(r, base).tokens_per_s_per_gpu)
            for r in runs]
    few = fit_profile(slow[:2], name="few", base=base)
    many = fit_profile(slow, name="many", base=base)
    rigid = fit_profile(slow, name="rigid", base=base, prior_runs=1e6)
    g = base.fitted["compute_scale"]
    # more runs move compute_scale further from the global fit towards what they say (slower)
    assert many.constants["compute_scale"].value < few.constants["compute_scale"].value <= g
    assert many.constants["compute_scale"].data_weight > few.constants["compute_scale"].data_weight
    assert rigid.values == pytest.approx({p.name: (base.fitted.get(p.name, 1.0)) for p in ALL_PARAMETERS}, rel=2e-3)
    # a constant the runs cannot see (straggler spread on these few nodes) stays at the global value
    assert not many.constants["straggler_cv"].identified
    assert many.summary("after")["median_abs_error"] < many.summary("before")["median_abs_error"]
    assert PRIOR_RUNS == 0.5


def test_profile_yaml_round_trip_and_determinism(small_runs, tmp_path):
    path, runs = small_runs
    base = load_efficiency()
    a = fit_profile(runs, name="h100", base=base, date="2026-11-30")
    b = fit_profile(runs, name="h100", base=base, date="2026-11-30")
    assert a.to_yaml() == b.to_yaml()
    back = parse_profile(a.to_yaml(), "p.yaml")
    assert back.values == a.values and back.date == "2026-11-30" and back.runs == a.runs
    # what the fit chose and which constants it held travel with the file
    assert back.prior_runs == a.prior_runs in PRIOR_CHOICES and back.huber_delta == a.huber_delta in HUBER_CHOICES
    assert {k: c.fitted for k, c in back.constants.items()} == {k: c.fitted for k, c in a.constants.items()}
    eff = back.efficiency(base)
    assert eff.fitted["compute_scale"] == a.values["compute_scale"] and eff.left_out("mosaic_llmfoundry") is eff


def test_a_constant_the_runs_cannot_tell_apart_is_held_at_the_global_fit(small_runs):
    _, runs = small_runs
    base = load_efficiency()
    # llm-foundry's bf16 runs on one H100 cluster: no fp8 GEMM, no MoE dispatch, nothing across nodes to speak of
    informed = informed_constants(runs, base)
    assert informed["compute_scale"] >= MIN_INFORMATION_RUNS and "compute_scale" in told_apart(informed)
    assert not {"fp8_gemm_scale", "grouped_gemm_scale", "all_to_all_scale"} & set(informed)
    profile = fit_profile(runs, name="h100", base=base)
    for name in ("fp8_gemm_scale", "grouped_gemm_scale", "all_to_all_scale"):
        c = profile.constants[name]
        assert not c.fitted and c.value == c.global_value and c.data_weight == 0.0 and not c.identified
    # fp8 runs alone: fp8_gemm_scale moves their GEMMs as compute_scale does, so they cannot tell it apart
    fp8 = [dataclasses.replace(r, problem=dataclasses.replace(r.problem, precision="fp8", fp8_recipe="fp8_tensorwise_current"))
           for r in runs[:2]]
    assert "fp8_gemm_scale" not in told_apart(informed_constants(fp8, base))
    assert "fp8_gemm_scale" in told_apart(informed_constants(fp8 + list(runs), base))  # bf16 runs beside them
    # a profile of fp8 runs alone never calls fp8_gemm_scale identified, fitted or not, and the file keeps why
    alone = fit_profile(fp8 * 2, name="fp8", base=base)
    c = alone.constants["fp8_gemm_scale"]
    assert not c.told_apart and not c.identified and c.information is not None
    back = parse_profile(alone.to_yaml(), "p.yaml").constants["fp8_gemm_scale"]
    assert back.information == c.information and not back.identified


def profile_text(small_runs) -> str:
    _, runs = small_runs
    return fit_profile(runs[:3], name="h100", base=load_efficiency(), date="2026-11-30").to_yaml()


def test_profile_errors_have_positions(small_runs):
    text = profile_text(small_runs)
    bad = text.replace("  compute_scale:\n    value: ", "  compute_scale:\n    value: 7 #", 1)
    with pytest.raises(DtcError) as exc:
        parse_profile(bad, "p.yaml")
    d = exc.value.diagnostics[0]
    old_value = text.split("  compute_scale:\n    value: ", 1)[1].split("\n")[0]
    line = bad.splitlines().index("    value: 7 #" + old_value) + 1
    assert "outside its physical range [0.6, 1.15]" in d.summary and (d.location.line, d.location.column) == (line, 5)
    with pytest.raises(DtcError) as exc:
        parse_profile(text.replace("  straggler_cv:", "  straggler_cvv:"), "p.yaml")
    assert "unknown constant 'straggler_cvv'" in exc.value.diagnostics[0].summary
    with pytest.raises(DtcError) as exc:
        parse_profile(text.replace("kind: dtc-cluster-profile", "kind: other"), "p.yaml")
    assert exc.value.diagnostics[0].location.line is not None
    with pytest.raises(DtcError) as exc:
        parse_profile("a: [1,\n", "p.yaml")
    assert "not YAML" in exc.value.diagnostics[0].summary


# --- the command and a spec that uses the profile ----------------------------------------------------------

def dtc(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_calibrate_command_and_spec_use(small_runs, tmp_path):
    path, _ = small_runs
    out = tmp_path / "profiles" / "h100.yaml"
    r = dtc("calibrate", str(path), "-o", str(out), "--date", "2026-11-30")
    assert r.returncode == 0, r.stderr
    assert "Calibrate: wrote" in r.stdout and "leave-one-out" in r.stdout
    assert "fewer than 8: specs using it keep the published runs' 80% bands" in r.stdout  # 6 runs
    profile, sha = load_profile(out)
    assert profile.date == "2026-11-30" and profile.inputs[0]["kind"] == "csv"
    spec = (ROOT / "specs" / "1b-fsdp.yaml").read_text().replace("gpu: a100-80gb", "gpu: h100-sxm")
    (tmp_path / "specs").mkdir()
    plain = tmp_path / "specs" / "plain.yaml"
    plain.write_text(spec)
    used = tmp_path / "specs" / "used.yaml"
    used.write_text(spec.replace("  num_gpus: 16\n", "  num_gpus: 16\n  profile: ../profiles/h100.yaml\n"))
    from compiler.pipeline import plan_spec

    _, p0 = plan_spec(plain)
    problem, p1 = plan_spec(used)
    assert problem.profile is not None and problem.profile.sha256 == sha
    assert p1.cluster.profile.constants == profile.values and p1.cluster.profile.path == "../profiles/h100.yaml"
    assert "profile" in p1.to_dict()["cluster"] and "profile" not in p0.to_dict()["cluster"]
    assert Plan.from_json(p1.to_json()).cluster.profile == p1.cluster.profile
    from compiler.recost import recost
    from compiler.plan import as_in_plan, plan_data

    _, again = recost(p1.normalized())  # plan.json alone re-costs with the profile's constants
    assert plan_data(as_in_plan(again)) == plan_data(p1.normalized().estimate)
    if p0.layout == p1.layout:
        assert p1.estimate.step_time_s != p0.estimate.step_time_s
    # a profile of other GPUs, or a broken one: exit 2 at cluster.profile
    bad = tmp_path / "specs" / "bad.yaml"
    bad.write_text(spec.replace("gpu: h100-sxm", "gpu: a100-80gb").replace(
        "  num_gpus: 16\n", "  num_gpus: 16\n  profile: ../profiles/h100.yaml\n"))
    r = dtc("validate", str(bad))
    assert r.returncode == 2 and "calibrated on h100-sxm" in r.stderr and "bad.yaml:" in r.stderr
    out.write_text(out.read_text().replace("kind: dtc-cluster-profile", "kind: nope"))
    r = dtc("validate", str(used))
    assert r.returncode == 2 and "cluster.profile: not a dtc cluster profile" in r.stderr


def test_calibrate_bad_inputs_exit_2(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("\n".join(megatron_line(i, 10, 1000.0, 1024) for i in (1, 2, 3)))
    r = dtc("calibrate", str(log), "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 2 and "a log needs the plan.json it ran" in r.stderr
    junk = tmp_path / "junk.log"
    junk.write_text("nothing here\n")
    r = dtc("calibrate", f"{junk}:{PLAN}", "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 2 and "junk.log" in r.stderr and "no per-step training line" in r.stderr
    r = dtc("calibrate", f"{log}:{tmp_path / 'missing.json'}", "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 2 and "no such file" in r.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_calibrate_from_log_and_plan_folder(tmp_path):
    folder = tmp_path / "run1"
    folder.mkdir()
    (folder / "plan.json").write_text(PLAN.read_text())
    (folder / "train.log").write_text("\n".join(megatron_line(i, 10, ms, 1024) for i, ms in
                                                ((1, 30000.0), (2, 20000.0), (3, 20000.0), (4, 20400.0))))
    measured = load_measured([str(folder)])
    assert len(measured.runs) == 1 and measured.date == "2026-11-30"
    assert {i.kind for i in measured.inputs} == {"log", "plan"}
    r = dtc("calibrate", str(folder), "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 0, r.stderr
    data = (tmp_path / "p.yaml").read_text()
    assert "date: '2026-11-30'" in data and "megatron-log" in data


def test_accuracy_with_profile(small_runs, tmp_path):
    path, runs = small_runs
    out = tmp_path / "p.yaml"
    out.write_text(fit_profile(runs, name="h100", base=load_efficiency()).to_yaml())
    r = subprocess.run([sys.executable, "benchmarks/accuracy.py", str(path), "--profile", str(out), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["loso_from"] == f"profile {out}" and data["overall"]["rows"] == len(runs)
    out.write_text("kind: x\n")
    r = subprocess.run([sys.executable, "benchmarks/accuracy.py", str(path), "--profile", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "not a dtc cluster profile" in r.stderr


# --- dtc sweep: the folder and its job array (the real array runs in tests/test_sweep_slurm.py) -----------

SWEEP_SPEC = """\
name: sweep-tiny
model:
  num_layers: 4
  hidden_size: 256
  ffn_hidden_size: 512
  num_attention_heads: 4
  num_kv_heads: 2
  vocab_size: 1024
training:
  tokens: 1B
  sequence_length: 1024
  global_batch: 32
  precision: bf16
cluster:
  gpu: a100-80gb
  num_gpus: 8
targets: [fsdp, slurm]
"""


def test_sweep_folder_and_array_script(tmp_path):
    import shutil

    from compiler.sweep import family, render_sweep

    spec = tmp_path / "s.yaml"
    spec.write_text(SWEEP_SPEC)
    out = tmp_path / "sw"
    m = render_sweep(spec, out, top=3, steps=3, local_cpu=True)
    ids = [c["id"] for c in m["candidates"]]
    assert ids == ["00", "01", "02"] and m["candidates"][0]["why"] == "the pick"
    fams = [tuple(c["family"]) for c in m["candidates"]]
    assert fams[1] != fams[0]  # another layout family before more of the pick's own
    for cid in ids:
        plan = Plan.from_json((out / "candidates" / cid / "plan.json").read_text())
        assert plan.layout.describe() == next(c["layout"] for c in m["candidates"] if c["id"] == cid)
        env = (out / "tasks" / f"{cid}.env").read_text()
        assert "DTC_SMOKE_STEPS=4\n" in env and "DTC_SMOKE_NO_SAVE_AT_END=1" in env and "DTC_SMOKE_SYNTHETIC=1" in env
        assert (out / "candidates" / cid / "train_fsdp.sbatch").is_file()
    script = (out / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-2%1" in script and 'candidates/$id/train_fsdp.sbatch' in script
    r = subprocess.run([shutil.which("shellcheck") or "shellcheck", str(out / "sweep.sbatch")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout
    pick = Plan.from_json((out / "candidates" / "00" / "plan.json").read_text()).layout
    assert list(map(str, family(pick))) == m["candidates"][0]["family"]
    # the array has not run: ingesting says so, exit 2
    r = dtc("calibrate", "--sweep", str(out))
    assert r.returncode == 2 and "has not finished" in r.stderr
    r = dtc("calibrate", "--sweep", str(tmp_path))
    assert r.returncode == 2 and "not a dtc sweep folder" in r.stderr


def test_sweep_needs_a_slurm_launcher(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SWEEP_SPEC.replace("targets: [fsdp, slurm]", "targets: [fsdp]"))
    r = dtc("sweep", str(spec), "-o", str(tmp_path / "sw"))
    assert r.returncode == 2 and "needs the slurm target" in r.stderr


def test_smoke_report_is_an_input(tmp_path):
    from compiler.smoke.report import SmokeReport, TargetResult
    from compiler.smoke.scale import scale_plan

    plan = Plan.from_json(PLAN.read_text())
    setup = scale_plan(plan, device="cpu", max_ranks=2)
    report = SmokeReport(generated_dir="g", plan_name=plan.name, plan_layout=plan.layout.describe(), plan_sha256="x",
                         setup=setup.to_dict(),
                         targets=[TargetResult("fsdp", "passed", step_time_s=0.25),
                                  TargetResult("deepspeed", "failed", reason="x")])
    path = tmp_path / "smoke.json"
    path.write_text(report.to_json())
    measured = load_measured([str(path)])
    assert len(measured.runs) == 1 and measured.devices == {"cpu"}
    run = measured.runs[0]
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(setup.global_batch * setup.seq_len / 0.25 / 2)
    assert run.layout == setup.layout and run.framework.name == "fsdp"
    path.write_text(json.dumps({"setup": {}, "targets": []}))
    with pytest.raises(DtcError) as exc:
        load_measured([str(path)])
    assert "not a `dtc smoke --json` report" in exc.value.diagnostics[0].summary


def test_csv_without_the_calibration_columns(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("row_id,model\n1,x\n")
    with pytest.raises(DtcError) as exc:
        load_measured([str(path)])
    d = exc.value.diagnostics[0]
    assert "missing columns" in d.summary and (d.location.line, d.location.column) == (1, 1)
