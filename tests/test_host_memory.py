"""States offloaded to the CPU must fit in the node's host memory: the catalog's reference system (DGX
datasheets) or cluster.host_memory. ZeRO-Offload of a 70B model needs more than a DGX A100 320GB's 1 TiB."""
from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

from compiler.costmodel.evaluation import evaluate
from compiler.estimate import Estimate, Rejection
from compiler.plan import Plan
from compiler.problem import lower
from compiler.spec.load import load_spec_text
from helpers import run_cli

SPEC = textwrap.dedent("""
    name: offload-70b
    model:
      preset: llama3-70b
    training:
      tokens: 1B
      sequence_length: 4096
      global_batch: 1M tokens
    cluster:
      gpu: {gpu}
      num_gpus: 8
    {extra}
    budget:
      objective: fastest
    targets: [deepspeed]
""")


def _problem(gpu: str = "a100-40gb", extra: str = ""):
    return lower(load_spec_text(SPEC.format(gpu=gpu, extra=extra), "offload-70b.yaml"))


def _offload_layout(problem):
    from compiler.layout import Layout

    option = problem.gpu_options[0]
    return Layout(gpu=option.name, gpus_per_node=option.gpus_per_node, tp=1, pp=1, cp=1, ep=1, dp_replicate=1,
                  dp_shard=8, zero_stage=3, micro_batch=1, grad_accum=problem.global_batch // 8, recompute="full",
                  offload_optimizer="cpu", offload_params="cpu")


def test_host_memory_comes_from_the_catalog_scaled_to_the_node_or_from_the_spec() -> None:
    assert _problem().gpu_options[0].host_memory_bytes_per_node == 2**40  # DGX A100 320GB: 1 TB
    half = _problem("h100-sxm", "  gpus_per_node: 4").gpu_options[0]
    assert half.host_memory_bytes_per_node == 2**40  # DGX H100's 2 TB for 8 GPUs, nodes of 4
    given = _problem(extra="  host_memory: 3TiB").gpu_options[0]
    assert given.host_memory_bytes_per_node == 3 * 2**40
    assert _problem("l40s").gpu_options[0].host_memory_bytes_per_node == 0  # not known


def test_offloaded_states_over_host_memory_are_rejected() -> None:
    p = _problem()
    lay = _offload_layout(p)
    got = evaluate(p, lay, target="deepspeed")
    assert isinstance(got, Rejection) and got.code == "host_out_of_memory", got
    assert got.details["needed_bytes"] > got.details["usable_bytes"] == int(2**40 * 0.95)
    assert "cluster.host_memory" in got.fix and "keep the parameters on the GPUs" in got.fix
    # fp32 master + Adam moments + fp32 gradients (DeepSpeed CPU Adam keeps them with the optimizer), plus the
    # 16-bit parameters: 18 bytes per parameter on the one node
    est = evaluate(p, lay, target="deepspeed", check_memory=False)
    assert isinstance(est, Estimate)
    assert abs(est.memory.cpu_bytes_per_node / (p.params.total * 18) - 1) < 0.01
    # the same states fit a node with more memory, and the estimate says so
    roomy = dataclasses.replace(p, gpu_options=(dataclasses.replace(p.gpu_options[0],
                                                                    host_memory_bytes_per_node=4 * 2**40),))
    ok = evaluate(roomy, lay, target="deepspeed")
    assert isinstance(ok, Estimate) and ok.memory.usable_cpu_bytes_per_node == int(4 * 2**40 * 0.95)
    assert ok.memory.host_lines()[0].endswith("usable host memory: fits.")


def test_unknown_host_memory_is_not_checked_and_the_plan_says_so() -> None:
    p = _problem()
    unknown = dataclasses.replace(p, gpu_options=(dataclasses.replace(p.gpu_options[0],
                                                                      host_memory_bytes_per_node=0),))
    est = evaluate(unknown, _offload_layout(unknown), target="deepspeed")
    assert isinstance(est, Estimate) and est.memory.usable_cpu_bytes_per_node is None
    assert "not checked; give cluster.host_memory" in est.memory.host_lines()[0]
    assert any("is not known, so the" in a for a in est.assumptions)


def test_the_solver_keeps_offloaded_states_within_host_memory(tmp_path: Path) -> None:
    spec = tmp_path / "offload-70b.yaml"
    spec.write_text(SPEC.format(gpu="a100-40gb", extra=""))
    out = run_cli(["plan", str(spec)]).stdout
    assert "host_out_of_memory" in out  # layouts that offload everything to the CPU were refused
    run_cli(["compile", str(spec), "--out", str(tmp_path)])
    out_dir = tmp_path / "offload-70b"
    plan = Plan.from_json((out_dir / "plan.json").read_text())
    mem = plan.estimate.memory
    assert mem.cpu_bytes_per_node <= (mem.usable_cpu_bytes_per_node or 0)
    assert plan.cluster.host_memory_bytes_per_node == 2**40
    assert "usable host memory: fits." in (out_dir / "PLAN.md").read_text()
    # re-costed from plan.json alone: the same host limit, the same numbers
    again = json.loads(run_cli(["estimate", "--plan", str(out_dir / "plan.json"), "--json"]).stdout)
    assert again["reproduces_plan"] is True
    assert again["memory"]["usable_cpu_bytes_per_node"] == mem.usable_cpu_bytes_per_node


def test_dtc_diff_shows_the_host_memory_a_change_frees(tmp_path: Path) -> None:
    """A reviewer sees why the layout moved: more host memory per node lets the optimizer leave NVMe."""
    for side, extra in (("a", ""), ("b", "  host_memory: 4TiB")):
        spec = tmp_path / side / "offload-70b.yaml"
        spec.parent.mkdir()
        spec.write_text(SPEC.format(gpu="a100-40gb", extra=extra))
        run_cli(["compile", str(spec), "--out", str(tmp_path / side / "out")])
    out = run_cli(["diff", str(tmp_path / "a/out/offload-70b"), str(tmp_path / "b/out/offload-70b")], exit_code=1).stdout  # (1: they differ)
    row = next(line for line in out.splitlines() if "host memory/node" in line)
    assert "of 972.8 GiB ->" in row and "of 3.8 TiB" in row, out
    assert "offload_optimizer nvme -> cpu" in out
