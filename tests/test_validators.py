"""Tests for tools/validators: DeepSpeed config and Megatron flag validation with the real libraries.

Each validator runs once, as a subprocess, through its --batch CLI (importing deepspeed /
megatron-core costs seconds; many configs share one process). megatron-core is not a package
dependency: when it is missing the Megatron tests FAIL and say to run tools/validators/install.sh.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test runs DeepSpeed's or Megatron's own validator in a process

ROOT = Path(__file__).resolve().parents[1]
VALIDATORS = ROOT / "tools" / "validators"
PROCESS_TIMEOUT_S = 180  # a validator process takes ~3-10 s; generous for loaded CI machines

# ----------------------------------------------------------------------------- DeepSpeed
DP = 8
MICRO, GAS = 2, 4
GOOD_DS = {
    "train_batch_size": MICRO * GAS * DP,
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": GAS,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 500_000_000,
        "stage3_prefetch_bucket_size": 50_000_000,
        "stage3_param_persistence_threshold": 100_000,
        "stage3_max_live_parameters": 1_000_000_000,
        "sub_group_size": 1_000_000_000,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    },
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"total_num_steps": 1000, "warmup_max_lr": 3e-4, "warmup_num_steps": 100}},
    "steps_per_print": 10,
}


def _run_batch(script: str, jobs: list[dict], tmp: Path) -> tuple[subprocess.CompletedProcess, dict, float]:
    batch = tmp / f"{Path(script).stem}.jsonl"
    batch.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(VALIDATORS / script), "--batch", str(batch)],
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, cwd=ROOT)
    elapsed = time.monotonic() - t0
    results = {}
    for line in proc.stdout.splitlines():
        rec = json.loads(line)  # stdout must be JSON lines only
        results[rec["path"]] = rec
    return proc, results, elapsed


@pytest.fixture(scope="module")
def ds_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds")
    cases = {
        "good": GOOD_DS,
        "batch_mismatch": {**GOOD_DS, "train_batch_size": MICRO * GAS * DP - 4},
        "unknown_key": {**GOOD_DS, "zero_optimisation": {"stage": 2}},
        "unknown_zero_key": {**GOOD_DS, "zero_optimization": {**GOOD_DS["zero_optimization"], "stage3_bogus": 1}},
    }
    jobs = []
    for name, cfg in cases.items():
        p = tmp / f"{name}.json"
        p.write_text(json.dumps(cfg))
        jobs.append({"path": str(p), "dp": DP})
    proc, results, elapsed = _run_batch("deepspeed_check.py", jobs, tmp)
    by_name = {Path(k).stem: v for k, v in results.items() if k}
    return proc, by_name, results, elapsed


def test_ds_good_config_accepted(ds_results):
    proc, res, _, _ = ds_results
    assert res["good"]["ok"], (res["good"], proc.stderr[-3000:])
    assert res["good"]["errors"] == []


def test_ds_batch_mismatch_reported(ds_results):
    _, res, _, _ = ds_results
    r = res["batch_mismatch"]
    assert not r["ok"]
    assert any("train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size" in e
               and f"60 != {MICRO} * {GAS} * {DP}" in e for e in r["errors"]), r["errors"]


def test_ds_unknown_top_level_key_reported(ds_results):
    _, res, _, _ = ds_results
    r = res["unknown_key"]
    assert not r["ok"]
    assert r["errors"] == ["unknown top-level key 'zero_optimisation' (DeepSpeed 0.19.8 ignores it silently)"]


def test_ds_unknown_zero_key_rejected_by_pydantic(ds_results):
    _, res, _, _ = ds_results
    errs = res["unknown_zero_key"]["errors"]
    assert any("stage3_bogus" in e and "Extra inputs are not permitted" in e for e in errs), errs


def test_ds_process_exit_code_and_no_jit(ds_results):
    proc, _, results, elapsed = ds_results
    assert proc.returncode == 1, proc.stderr[-3000:]  # some configs are bad on purpose
    assert None not in results, results.get(None)  # the JIT-artifact line
    assert len(results) == 4
    print(f"deepspeed_check.py: 4 configs in {elapsed:.1f} s")


# ----------------------------------------------------------------------------- Megatron
BASE_FLAGS = [
    "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
    "--seq-length", "128", "--max-position-embeddings", "128",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
    "--bf16", "--micro-batch-size", "2", "--global-batch-size", "16",
    "--lr", "1e-4", "--train-iters", "10",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024",
]


def _megatron_installed() -> bool:
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('megatron.training') is None)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


INSTALL_MSG = (f"megatron-core 0.19.2 is not installed in {sys.executable}: "
               "run tools/validators/install.sh (in the activated venv)")


@pytest.fixture(scope="module")
def mg_results(tmp_path_factory):
    """Runs the Megatron batch once; returns None when megatron-core is missing (each test then
    FAILS with the install hint - it must never be skipped)."""
    if not _megatron_installed():
        return None
    tmp = tmp_path_factory.mktemp("mg")
    flags_file = tmp / "good_args.txt"
    # one flag (with its value) per line, the way a generated args file looks
    lines, i = [], 0
    while i < len(BASE_FLAGS):
        if i + 1 < len(BASE_FLAGS) and not BASE_FLAGS[i + 1].startswith("--"):
            lines.append(f"{BASE_FLAGS[i]} {BASE_FLAGS[i + 1]}")
            i += 2
        else:
            lines.append(BASE_FLAGS[i])
            i += 1
    flags_file.write_text("\n".join(lines) + "\n")
    jobs = [
        {"path": str(flags_file), "world_size": 8, "name": "good_ws8"},
        {"path": str(flags_file), "world_size": 6, "name": "good_ws6"},
        {"flags": BASE_FLAGS + ["--no-such-flag"], "world_size": 8, "name": "unknown_flag"},
        {"flags": BASE_FLAGS + ["--hidden-size", "250"], "world_size": 8, "name": "bare_assert"},
        # a Transformer Engine version this machine lacks is not checkable; what follows it still is
        {"flags": BASE_FLAGS + ["--fp4-format", "e2m1", "--fp4-param-gather"], "world_size": 8, "name": "fp4"},
        {"flags": BASE_FLAGS + ["--fp4-format", "e2m1", "--fp8-format", "e4m3"], "world_size": 8, "name": "fp4_fp8"},
        {"flags": BASE_FLAGS + ["--fp4-format", "e2m1"], "world_size": 6, "name": "fp4_ws6"},
    ]
    return _run_batch("megatron_check.py", jobs, tmp)


def _require(mg_run):
    """Called in each test body (not in a fixture) so a missing install is a FAIL, not an ERROR."""
    if mg_run is None:
        pytest.fail(INSTALL_MSG, pytrace=False)
    proc = mg_run[0]
    if proc.returncode == 3:
        pytest.fail(f"megatron_check.py could not load megatron-core: {proc.stdout}{proc.stderr[-2000:]}\n"
                    + INSTALL_MSG, pytrace=False)
    return mg_run


def test_megatron_good_flags_accepted(mg_results):
    proc, res, _ = _require(mg_results)
    r = res["good_ws8"]
    assert r["ok"], (r, proc.stderr[-3000:])
    assert r["derived"]["data_parallel_size"] == 2
    assert r["derived"]["num_microbatches"] == 4


def test_megatron_world_size_not_divisible_rejected(mg_results):
    _, res, _ = _require(mg_results)
    r = res["good_ws6"]
    assert not r["ok"]
    assert any("world size (6) is not divisible by total_model_size" in e for e in r["errors"]), r["errors"]


def test_megatron_unknown_flag_and_bare_assert(mg_results):
    _, res, _ = _require(mg_results)
    assert res["unknown_flag"]["errors"] == ["argparse: unrecognized arguments: --no-such-flag"]
    errs = res["bare_assert"]["errors"]
    assert any("assert args.hidden_size % args.num_attention_heads == 0" in e and "arguments.py:" in e
               for e in errs), errs


def test_megatron_te_version_is_not_checkable_but_the_rest_is(mg_results):
    _, res, _ = _require(mg_results)
    r = res["fp4"]
    assert r["ok"], r
    assert any(w.startswith("not checkable here: ValueError: --fp4-format requires Transformer Engine") for w in
               r["warnings"]), r["warnings"]
    assert any("cannot be used simultaneously" in e for e in res["fp4_fp8"]["errors"]), res["fp4_fp8"]
    assert any("is not divisible by total_model_size" in e for e in res["fp4_ws6"]["errors"]), res["fp4_ws6"]


def test_megatron_process_exit_code(mg_results):
    proc, results, elapsed = _require(mg_results)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(results) == 7
    print(f"megatron_check.py: 4 flag lists in {elapsed:.1f} s")
