"""SLURM renderer: sbatch scripts over a matrix of plans, checked by their real consumers.

Every generated script passes ``bash -n`` and ``shellcheck -S style`` with no finding, and
``sbatch --test-only`` on a private slurmctld + slurmd (tests/slurm_cluster.py, one cluster
for this module, 128 fake 8-GPU nodes) accepts it. Hostile environment values render
inert: the script's environment section runs under bash next to a canary. Missing
slurm or shellcheck FAIL these tests (run .ci/install-system-deps.sh); they never skip.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from compiler.errors import RenderError
from compiler.targets.slurm.render import format_time, primary_target, render_slurm, slurm_context
from plan_fixtures import layout_for, plan_for, problem_for
from helpers import slurm_test_cluster
from slurm_cluster import INSTALL_HINT

SPEC = """
name: slurm-test
model:
  preset: {preset}
training:
  tokens: 1T
  sequence_length: 4096
  global_batch: {gbs}
cluster:
  gpu: {gpu}
  num_gpus: {num_gpus}
targets: [{targets}]
{slurm}
"""

FULL_SLURM = """
slurm:
  job_name: llama-run.v2
  partition: gpu
  account: proj-123
  qos: high
  time_limit: 36h
  cpus_per_task: 12
  container_image: "nvcr.io#nvidia/pytorch:24.05-py3"
  container_mounts: ["/data:/data", "/scratch/ckpt:/ckpt"]
  modules: [cuda/12.4, nccl/2.21+cuda12]
  environment: {NCCL_DEBUG: WARN, NCCL_IB_HCA: "mlx5_0,mlx5_1", HF_HOME: "/scratch/hf cache"}
  workdir: /scratch/run
  rdzv_port: 29511
  signal_seconds_before_end: 300
  output_dir: logs
"""

HOSTILE = {
    "SUBST": "$(touch CANARY)",
    "BACKTICK": "`touch CANARY`",
    "SEMI": "x; touch CANARY; rm -rf .",
    "QUOTE": "it's \"quoted\" $HOME \\ ${PATH} && touch CANARY",
    "AMP": "a & touch CANARY &",
    "NEWLINE_LIKE": "a\\ntouch CANARY",
}

ALL = "deepspeed, fsdp, megatron, slurm"


def make_plan(*, slurm: str = "", targets: str = ALL, gpu: str = "h100-sxm", num_gpus: int = 16,
              preset: str = "llama3-8b", gbs: int = 64, **layout: Any):
    problem = problem_for(SPEC.format(preset=preset, gpu=gpu, num_gpus=num_gpus, targets=targets, gbs=gbs,
                                      slurm=slurm))
    return plan_for(problem, layout_for(problem, **layout), real_estimate=False)


def _slurm(**fields: str) -> str:
    return "slurm:\n" + "".join(f"  {k}: {v}\n" for k, v in fields.items())


# name -> (plan kwargs); every plan renders every script it has
MATRIX: dict[str, dict[str, Any]] = {
    "defaults_zero1_tp": dict(tp=2, dp_shard=8, zero_stage=1, targets="deepspeed, megatron, slurm"),
    "defaults_fsdp_zero3": dict(tp=2, dp_shard=8, zero_stage=3, targets="fsdp, megatron, slurm"),
    "full_section": dict(tp=2, dp_shard=8, zero_stage=1, targets="deepspeed, megatron, slurm", slurm=FULL_SLURM),
    "fsdp_full_section": dict(tp=2, dp_shard=8, zero_stage=3, targets="fsdp, slurm", slurm=FULL_SLURM),
    "partition_only": dict(dp_shard=16, zero_stage=2, targets="fsdp, slurm", slurm=_slurm(partition="gpu")),
    "account_qos": dict(dp_shard=16, zero_stage=1, targets="deepspeed, slurm",
                        slurm=_slurm(account="acct", qos="normal")),
    "container_no_mounts": dict(pp=2, dp_shard=8, zero_stage=1, targets="megatron, slurm",
                                slurm=_slurm(container_image="pytorch/pytorch:2.5.1")),
    "modules_env": dict(dp_shard=16, zero_stage=3, targets=ALL,
                        slurm=_slurm(modules="[cuda, gcc/13]", environment='{A: "1", B: "two words"}')),
    "no_requeue_no_signal_not_exclusive": dict(
        dp_shard=16, zero_stage=3, targets="fsdp, slurm",
        slurm=_slurm(requeue="false", signal_seconds_before_end="0", exclusive="false", time_limit="90m")),
    "own_train_script": dict(dp_shard=16, zero_stage=2, targets="fsdp, deepspeed, slurm",
                             slurm=_slurm(train_script="scripts/train.py", launcher="torchrun")),
    "megatron_launcher": dict(tp=4, pp=2, dp_shard=2, zero_stage=1, targets=ALL, slurm=_slurm(launcher="srun")),
    "blackwell_tp": dict(tp=2, dp_shard=8, zero_stage=1, gpu="b200", targets="megatron, slurm"),
    "hostile_env": dict(dp_shard=16, zero_stage=3, targets=ALL,
                        slurm=f"slurm:\n  environment: {json.dumps(HOSTILE)}\n"),
    "big_128x8": dict(preset="llama3-70b", num_gpus=1024, gbs=1024, tp=8, pp=4, dp_shard=32, zero_stage=1,
                      targets="deepspeed, megatron, fsdp, slurm"),
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, tuple[Any, Path]]:
    """{case: (plan, folder)} with every case's scripts written."""
    out: dict[str, tuple[Any, Path]] = {}
    for case, kwargs in MATRIX.items():
        plan = make_plan(**kwargs)
        folder = tmp_path_factory.mktemp(case)
        for name, text in render_slurm(plan).items():
            (folder / name).write_text(text)
        out[case] = (plan, folder)
    return out


def _scripts(rendered) -> list[Path]:
    return sorted(p for _, folder in rendered.values() for p in folder.glob("*.sbatch"))


# ------------------------------------------------------------------------------ context as data
def test_format_time() -> None:
    assert format_time(36 * 3600) == "1-12:00:00"
    assert format_time(90 * 60) == "0-01:30:00"
    assert format_time(59.2) == "0-00:01:00"
    assert format_time(7 * 86400 + 1) == "7-00:00:01"


def test_directives_as_data() -> None:
    plan = make_plan(tp=2, dp_shard=8, zero_stage=1, targets="deepspeed, megatron, slurm", slurm=FULL_SLURM)
    ctx = slurm_context(plan)
    assert ctx["primary"] == "deepspeed" and set(ctx["scripts"]) == {"deepspeed", "megatron"}
    ds, mg = ctx["scripts"]["deepspeed"], ctx["scripts"]["megatron"]
    assert ds["directives"] == [
        "--job-name=llama-run.v2", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=96",
        "--time=1-12:00:00", "--partition=gpu", "--account=proj-123", "--qos=high", "--exclusive",
        "--output=logs/%x-%j.out", "--error=logs/%x-%j.err", "--requeue", "--signal=B:USR1@300"]
    assert "--ntasks-per-node=8" in mg["directives"] and "--cpus-per-task=12" in mg["directives"]
    assert mg["env_exports"] == [{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]
    assert ds["env_exports"] == []


def test_defaults_without_slurm_section() -> None:
    ctx = slurm_context(make_plan(dp_shard=16, zero_stage=3, targets=ALL))
    fsdp, mg = ctx["scripts"]["fsdp"], ctx["scripts"]["megatron"]
    assert fsdp["cpus_per_task"] == 12 * 8 and mg["cpus_per_task"] == 12  # 96 cores / 8 GPUs
    assert fsdp["time"] is None and not any(d.startswith("--time") for d in fsdp["directives"])
    assert not any(d.startswith(("--partition", "--account", "--qos")) for d in fsdp["directives"])
    assert ctx["primary"] == "deepspeed"  # the first target
    assert mg["env_unsets"] == ["CUDA_DEVICE_MAX_CONNECTIONS"]  # Megatron-FSDP (zero 3) wants it unset


def test_cuda_device_max_connections_rule() -> None:
    hopper = slurm_context(make_plan(tp=2, dp_shard=8, zero_stage=1, targets="megatron, slurm"))
    blackwell = slurm_context(make_plan(tp=2, dp_shard=8, zero_stage=1, gpu="b200", targets="megatron, slurm"))
    no_tp = slurm_context(make_plan(dp_shard=16, zero_stage=1, targets="megatron, slurm"))
    assert hopper["scripts"]["megatron"]["env_exports"] == [{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]
    assert blackwell["scripts"]["megatron"]["env_exports"] == []
    assert no_tp["scripts"]["megatron"]["env_exports"] == []


def test_primary_follows_launcher() -> None:
    srun = make_plan(dp_shard=16, zero_stage=1, targets=ALL, slurm=_slurm(launcher="srun"))
    torchrun = make_plan(dp_shard=16, zero_stage=3, targets=ALL, slurm=_slurm(launcher="torchrun"))
    assert (primary_target(srun), primary_target(torchrun)) == ("megatron", "fsdp")
    files = render_slurm(make_plan(dp_shard=16, zero_stage=3, targets="megatron, fsdp, slurm"))
    assert set(files) == {"train.sbatch", "train_fsdp.sbatch", "train_megatron.sbatch"}
    assert files["train.sbatch"] == files["train_megatron.sbatch"]
    with pytest.raises(RenderError, match="launches none"):
        render_slurm(make_plan(dp_shard=16, zero_stage=1, targets="megatron, slurm",
                               slurm=_slurm(launcher="deepspeed")))


def test_defaults_fit_real_nodes_and_the_checkpoint() -> None:
    """Without slurm settings: CPUs are NODE_CORES split over the node's GPUs (never more than a node has),
    SIGUSR1 comes the checkpoint policy's lead before the limit, logs go to the submit folder (which exists)."""
    from compiler.checkpointing import plan_policy
    from compiler.targets.slurm.render import NODE_CORES

    plan = make_plan(tp=2, dp_shard=8, zero_stage=1, targets="deepspeed, megatron, slurm")
    ctx = slurm_context(plan)
    for target, sc in ctx["scripts"].items():
        per_node = int(sc["cpus_per_task"]) * int(sc["tasks_per_node"])
        assert per_node == NODE_CORES // 8 * 8 <= NODE_CORES
        lead = plan_policy(plan, target).signal_lead_s
        assert f"--signal=B:USR1@{lead}" in sc["directives"] and lead > 60
        assert "--output=%x-%j.out" in sc["directives"]
    assert plan_policy(plan, "deepspeed").checkpoint_bytes == plan.model.params_total * 14


def test_stated_storage_bandwidth_sizes_the_signal_lead() -> None:
    """slurm.checkpoint_write_bandwidth replaces the Llama 3 default: 5x slower storage, 5x the write time."""
    from compiler.checkpointing import plan_policy

    default = make_plan(tp=2, dp_shard=8, zero_stage=1, targets="megatron, slurm")
    slow = make_plan(tp=2, dp_shard=8, zero_stage=1, targets="megatron, slurm",
                     slurm=_slurm(checkpoint_write_bandwidth="200MB/s"))
    fast, slow_p = plan_policy(default, "megatron"), plan_policy(slow, "megatron")
    assert slow_p.save_s == pytest.approx(fast.save_s * (2e12 / 2048) / 200e6)
    assert f"--signal=B:USR1@{slow_p.signal_lead_s}" in slurm_context(slow)["scripts"]["megatron"]["directives"]
    assert slow_p.signal_lead_s > fast.signal_lead_s


def test_container_mounts_cover_data_and_init() -> None:
    """With a container image the data, tokenizer and model.init folders are mounted at their own paths."""
    extra = ("data:\n  tokenizer: /data/tok/tokenizer.json\n  datasets:\n"
             "    - {path: /data/web/web_text_document, weight: 2}\n    - {path: rel/books_text_document, weight: 1}\n"
             "slurm:\n  container_image: pytorch/pytorch:2.5.1\n")
    plan = make_plan(dp_shard=16, zero_stage=1, targets="megatron, slurm", slurm=extra)
    mg = render_slurm(plan)["train_megatron.sbatch"]
    assert "CONTAINER_MOUNTS+=,/data/web:/data/web,/data/tok:/data/tok\n" in mg


def test_launch_lines() -> None:
    files = render_slurm(make_plan(tp=2, dp_shard=8, zero_stage=1, targets=ALL.replace("fsdp, ", ""),
                                   slurm=FULL_SLURM))
    ds = files["train_deepspeed.sbatch"]
    assert 'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES"' in ds
    assert '--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID"' in ds
    assert '"$ARTIFACT_DIR/ds_train.py" --ds-config "$ARTIFACT_DIR/ds_config.json" &' in ds
    # the generated folder and the job's folder (checkpoints) are always mounted, then the spec's own mounts
    assert 'CONTAINER_MOUNTS="$ARTIFACT_DIR:$ARTIFACT_DIR,$PWD:$PWD"' in ds
    assert "CONTAINER_MOUNTS+=,/data:/data,/scratch/ckpt:/ckpt" in ds
    assert ("--container-image='nvcr.io#nvidia/pytorch:24.05-py3' "
            '--container-mounts="$CONTAINER_MOUNTS"') in ds
    assert "module load cuda/12.4 nccl/2.21+cuda12" in ds
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in ds and "export NCCL_ASYNC_ERROR_HANDLING" not in ds
    assert "export HF_HOME='/scratch/hf cache'" in ds and "MASTER_PORT=29511" in ds
    assert "cd -- /scratch/run" in ds and "--shutdown-timeout=290" in ds
    mg = files["train_megatron.sbatch"]
    assert 'source "$ARTIFACT_DIR/megatron_args.sh"' in mg
    assert 'RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"' in mg
    assert '"$MEGATRON_DIR" "${MEGATRON_ARGS[@]}" &' in mg and 'if [[ ! -f "$1/pretrain_gpt.py" ]]' in mg
    assert 'megatron_dir_default=/opt/Megatron-LM\nMEGATRON_DIR="${MEGATRON_DIR:-$megatron_dir_default}"' in mg
    assert 'NPROC_PER_NODE="${DTC_NPROC_PER_NODE:-8}"' in mg
    # dtc sweep's benchmark override, checked as a plain number before use (tests/test_injection.py runs it)
    assert 'if [[ ! "$DTC_BENCH_STEPS" =~ ^[1-9][0-9]{0,6}$ ]]; then' in mg
    assert '--save|--load|--pretrained-checkpoint|--data-path) dropping=1 ;;' in mg
    assert ('MEGATRON_ARGS=("${bench_args[@]}" --train-iters "$DTC_BENCH_STEPS" --mock-data --eval-iters 0 '
            '--log-interval 1)') in mg
    assert "DTC_BENCH_STEPS" not in files["train_deepspeed.sbatch"]


@pytest.mark.parametrize("field,value", [
    ("partition", "gpu\n#SBATCH --wrap=id"), ("account", "a b"), ("job_name", "x;id"),
    ("output_dir", "logs\n"), ("qos", "$(id)"), ("workdir", "/tmp/`id`"),
    ("container_image", "img'$(id)"), ("rdzv_port", "29500; id"),
])
def test_tampered_plan_values_are_refused(field: str, value: str) -> None:
    """A Plan read back from an edited plan.json is checked again; spec patterns apply in full."""
    plan = make_plan(dp_shard=16, zero_stage=3, targets="fsdp, slurm")
    bad = dataclasses.replace(plan, slurm=plan.slurm.model_copy(update={field: value}))
    with pytest.raises(RenderError):
        render_slurm(bad)


def test_uneven_nodes_are_refused() -> None:
    with pytest.raises(RenderError, match="does not split evenly over 3 nodes"):
        plan = make_plan(dp_shard=16, zero_stage=3, targets="fsdp, slurm")  # the spec refuses 20 GPUs itself
        render_slurm(dataclasses.replace(plan, layout=plan.layout.with_(dp_shard=20)))


def test_tampered_environment_name_is_refused() -> None:
    plan = make_plan(dp_shard=16, zero_stage=3, targets="fsdp, slurm")
    bad = dataclasses.replace(plan, slurm=plan.slurm.model_copy(update={"environment": {"A=1; touch x; B": "v"}}))
    with pytest.raises(RenderError, match="environment"):
        render_slurm(bad)


def test_hostile_environment_values_are_inert(rendered, tmp_path: Path) -> None:
    """Run the environment section of the rendered script under bash next to a canary."""
    plan, folder = rendered["hostile_env"]
    assert plan.slurm.environment == HOSTILE
    for script in sorted(folder.glob("*.sbatch")):
        text = script.read_text()
        section = re.search(r"^# >>> dtc: spec environment.*?^# <<< dtc: spec environment$", text, re.S | re.M)
        assert section, script.name
        probe = section.group(0) + "\n" + "".join(f'printf "%s\\0" "${k}"\n' for k in sorted(HOSTILE))
        work = tmp_path / script.stem
        work.mkdir()
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", probe], cwd=work, capture_output=True,
                              timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert not (work / "CANARY").exists() and not list(work.iterdir()), script.name
        values = proc.stdout.decode().split("\0")[:-1]
        assert values == [HOSTILE[k] for k in sorted(HOSTILE)]  # exactly the spec's strings


# ------------------------------------------------------------------------------ bash -n and shellcheck
def test_bash_n(rendered) -> None:
    for script in _scripts(rendered):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"


def test_shellcheck_no_findings(rendered) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail(f"shellcheck not installed: run .ci/install-system-deps.sh ({INSTALL_HINT})", pytrace=False)
    scripts = _scripts(rendered)
    proc = subprocess.run([shellcheck, "-S", "style", "-f", "gcc", *map(str, scripts)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
    # every directive in the templates carries its reason on the line above
    for script in scripts:
        lines = script.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith("# shellcheck "):
                assert lines[i - 1].lstrip().startswith("#") and "shellcheck" not in lines[i - 1], \
                    f"{script.name}:{i + 1}: directive without a justification comment"


# ------------------------------------------------------------------------------ sbatch --test-only
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from slurm_test_cluster(tmp_path_factory.mktemp("slurmctl"), fake_gpu_nodes=128, gpus_per_node=8)


@pytest.mark.slow
def test_sbatch_test_only_accepts_every_script(rendered, cluster) -> None:
    failures = []
    for case, (plan, folder) in sorted(rendered.items()):
        # Without a partition in the spec the job goes to the cluster's default partition; the test
        # cluster's default holds only the GPU-less real node, so point it at the fake GPU nodes.
        extra = [] if plan.slurm.partition else ["--partition=gpu"]
        for script in sorted(folder.glob("*.sbatch")):
            proc = cluster.test_only(script, extra_args=extra)
            if proc.returncode != 0 or "to start at" not in proc.stderr:
                failures.append(f"{case}/{script.name}: rc={proc.returncode} {proc.stderr.strip()}")
            elif case == "big_128x8":
                assert "gpu[001-128]" in proc.stderr, proc.stderr
    assert not failures, "\n".join(failures)
