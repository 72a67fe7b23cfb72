"""Megatron-Bridge rows read with their recipe's launch settings (compiler/calibration/bridge_recipes.py)."""
from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.calibration import bridge_recipes as B
from compiler.calibration import runs as R
from compiler.calibration.fit import predict
from compiler.costmodel.efficiency import load_efficiency

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"
sys.path.insert(0, str(ROOT / "benchmarks"))

import bridge_recipes as generator  # noqa: E402


def csv_row(row_id: str) -> dict:
    with open(CSV, newline="", encoding="utf-8") as fh:
        return next(r for r in csv.DictReader(fh) if r["row_id"] == row_id)


def test_container_gpu_precision_and_model_are_read_as_the_recipe_names_spell_them():
    assert B.container_of("NeMo 26.04.01 container (Megatron-Bridge + Megatron-Core)") == "26.04.01"
    assert B.container_of("NeMo 26.06 container") == "26.06"
    assert B.container_of("NeMo 24.07 (launcher)") == "24.07"
    assert B.container_of("torchtitan 0.1") == ""
    assert B.gpu_token("GB200 (NVL72)") == "GB200" and B.gpu_token("B200 (DGX-B200)") == "B200"
    assert B.gpu_token("H100-SXM-80GB") == "H100"
    assert B.precision_token("fp8", "mxfp8") == "FP8_MX" and B.precision_token("bf16", "") == "BF16"
    assert B.precision_token("fp8", "fp8_tensorwise_current") == "FP8_CS"
    assert B.precision_token("fp8", "fp8_blockwise") == "FP8_SC"
    assert B.model_key("Qwen3 30B-A3B") == B.model_key("QWEN3_30B_A3B") == "QWEN330BA3B"
    assert B.model_key("Llama 3.1 405B") == "LLAMA31405B"


def test_full_iteration_cuda_graph_is_bridges_own_rule():
    def recipe(impl: str, scope: str) -> B.BridgeRecipe:
        return B.BridgeRecipe("26.06", "v0.5.0", "X", impl, scope, False)
    assert recipe("full_iteration", "[]").full_iteration_cuda_graph
    assert recipe("local", "full_iteration").full_iteration_cuda_graph
    assert not recipe("local", "attn").full_iteration_cuda_graph
    assert not recipe("transformer_engine", "attn moe_router moe_preprocess").full_iteration_cuda_graph
    assert not recipe("", "").full_iteration_cuda_graph


def test_the_26_06_qwen3_30b_mxfp8_row_ran_full_iteration_graphs_and_the_26_04_one_did_not():
    # Megatron-Bridge 0.5.0 (NeMo 26.06) changed QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1 to
    # cuda_graph_impl="full_iteration", moe_a2a_overlap=True; 0.4.0 (26.04) graphed the router only
    new = R.parse_row(csv_row("334"))  # 26.06, GB200, MXFP8, mb 4
    old = R.parse_row(csv_row("430"))  # 26.04, same layout
    assert new.layout.describe() == old.layout.describe()
    assert new.framework.cuda_graphs == "full_iteration" and new.framework.ep_overlap
    assert "QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1" in new.framework.source
    assert old.framework.cuda_graphs == "none" and not old.framework.ep_overlap
    assert old.framework.name == "megatron_bridge" and new.framework.name.startswith("megatron_bridge+")
    assert new.features["framework"] == old.features["framework"] == "megatron_bridge"


def test_a_recipe_is_taken_only_when_its_layout_is_the_rows():
    r = csv_row("334")
    kw = dict(software_version=r["software_version"], model=r["model"], gpu_type=r["gpu_type"], precision="fp8",
              fp8_recipe="mxfp8", num_gpus=8, tp=1, pp=1, vp=1, cp=1, ep=8, micro_batch=4)
    found = B.recipe_for(**kw)
    assert found is not None and found.megatron_bridge == "v0.5.0" and found.moe_a2a_overlap
    assert B.recipe_for(**{**kw, "micro_batch": 2}) is None
    old = B.recipe_for(**{**kw, "software_version": "NeMo 25.09 container"})  # its own release's recipe
    assert old is not None and old.megatron_bridge == "v0.1.0rc3" and not old.moe_a2a_overlap
    assert not old.full_iteration_cuda_graph
    assert B.recipe_for(**{**kw, "software_version": "torchtitan"}) is None
    bf16 = B.recipe_for(**{**kw, "precision": "bf16", "fp8_recipe": ""})
    assert bf16 is not None and not bf16.full_iteration_cuda_graph


def test_rows_of_other_frameworks_never_take_a_recipe():
    r = R.parse_row(csv_row("92"))  # NeMo 24.07 (nemo_2407 profile)
    assert r.framework.cuda_graphs == "none" and "launch settings" not in r.framework.source


def test_full_iteration_graphs_remove_the_launch_bound_time_and_nothing_else():
    run = R.resolve(R.parse_row(csv_row("430")))  # a launch-bound MoE layer (hidden 2048, 16 local experts)
    eff = load_efficiency()
    eager = predict(run, eff)
    graphed = predict(replace(run, framework=replace(run.framework, cuda_graphs="full_iteration")), eff)

    def parts(est) -> str:
        return next(i.formula for i in est.time.items if i.name == "forward_compute")
    assert "launch_bound" in parts(eager) and "launch_bound" not in parts(graphed)
    assert graphed.step_time_s < eager.step_time_s
    for name in ("ep_comm", "optimizer_step", "dp_comm"):
        assert next(i.value for i in graphed.time.items if i.name == name) == pytest.approx(
            next(i.value for i in eager.time.items if i.name == name))


def test_committed_table_has_the_generators_columns_and_covers_each_container():
    with open(ROOT / "compiler" / "data" / B.RECIPES_FILE, newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert tuple(table[0].keys()) == generator.COLUMNS
    assert {r["container"] for r in table} == set(generator.CONTAINERS)
    for container, tags in generator.CONTAINERS.items():
        assert {r["megatron_bridge"] for r in table if r["container"] == container} == set(tags)


def _commit_and_tag(repo: Path, tag: str) -> None:
    """Make the files under ``repo`` one commit of a fresh git repository, tagged ``tag`` (a release stand-in)."""
    import subprocess
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    subprocess.run(git + ["tag", tag], check=True)


def test_generator_reads_a_workload_file_against_its_own_utils(tmp_path):
    """A two-commit Megatron-Bridge stand-in: the generator executes the tag's files, not dtc's guesses."""
    repo = tmp_path / "mb"
    (repo / "scripts/performance/utils").mkdir(parents=True)
    (repo / "scripts/performance/configs/qwen").mkdir(parents=True)
    (repo / "scripts/performance/utils/utils.py").write_text(
        "from dataclasses import dataclass\nfrom typing import Optional\n@dataclass\nclass WorkloadBaseConfig:\n"
        "    num_gpus: int = 1\n    tensor_model_parallel_size: int = 1\n    micro_batch_size: int = 1\n"
        "    cuda_graph_impl: Optional[str] = None\n    cuda_graph_scope: Optional[list] = None\n"
        "    moe_a2a_overlap: Optional[bool] = False\n")
    (repo / "scripts/performance/configs/qwen/qwen3_workload_base_configs.py").write_text(
        "from dataclasses import replace\nfrom utils.utils import WorkloadBaseConfig\n"
        "BASE = WorkloadBaseConfig(num_gpus=8)\n"
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1 = replace(BASE, micro_batch_size=4, "
        "cuda_graph_impl='full_iteration', cuda_graph_scope=[], moe_a2a_overlap=True)\n")
    _commit_and_tag(repo, "v0.5.0")
    configs = generator.tag_configs(repo, "v0.5.0")
    assert configs["QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1"]["cuda_graph_impl"] == "full_iteration"
    assert "BASE" not in configs


def test_generator_reads_060_recipe_functions_statically(tmp_path):
    """A stand-in of Megatron-Bridge 0.6.0's perf_recipes package: recipe functions set fields of ``cfg`` and call
    the package's helpers (keyword defaults and literal arguments bound, ``if``s on them decided), one recipe
    starts from another through a wrapper, and a field given anything but a literal is unknown (blank)."""
    repo = tmp_path / "mb"
    pkg = repo / "src/megatron/bridge/perf_recipes"
    (pkg / "qwen/gb300").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_common.py").write_text(
        "def _with_global_batch_size(cfg, gbs):\n    cfg.train.global_batch_size = gbs\n    return cfg\n")
    (pkg / "qwen/common.py").write_text(
        "from megatron.bridge.training.config import CommOverlapConfig\n"
        "def _full_iteration(cfg, overlap=True):\n"
        "    cfg.model.cuda_graph_impl = 'full_iteration'\n    cfg.model.cuda_graph_scope = []\n"
        "    if overlap:\n        cfg.comm_overlap = CommOverlapConfig(overlap_moe_expert_parallel_comm=True)\n"
        "    if cfg.model.something:\n        cfg.model.cuda_graph_impl = 'none'\n")
    (pkg / "qwen/gb300/qwen3_moe.py").write_text(
        "from megatron.bridge.perf_recipes._common import _with_global_batch_size\n"
        "from megatron.bridge.perf_recipes.qwen.common import _full_iteration\n"
        "from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config\n"
        "def qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config():\n"
        "    cfg = qwen3_30b_a3b_pretrain_config()\n"
        "    cfg.model.tensor_model_parallel_size = 1\n    cfg.model.pipeline_model_parallel_size = 1\n"
        "    cfg.model.context_parallel_size = 1\n    cfg.model.expert_model_parallel_size = 8\n"
        "    cfg.train.micro_batch_size = 8\n    cfg.train.global_batch_size = 512\n"
        "    cfg.model.moe_flex_dispatcher_backend = 'hybridep'\n"
        "    cfg.model.recompute_modules = some_list()\n"
        "    _full_iteration(cfg)\n    return cfg\n"
        "def qwen3_30b_a3b_pretrain_8gpu_gb300_bf16_config():\n"
        "    cfg = qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config()\n"
        "    _full_iteration(cfg, overlap=False)\n    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=True)\n"
        "    return cfg\n"
        "def qwen3_30b_a3b_pretrain_4gpu_gb300_fp8mx_config():\n"
        "    cfg = _with_global_batch_size(qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config(), 128)\n"
        "    return cfg\n")
    _commit_and_tag(repo, "v0.6.0")
    configs = generator.py_tag_configs(repo, "v0.6.0")
    fp8 = configs["qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config"]
    assert (fp8["num_gpus"], fp8["expert_model_parallel_size"], fp8["micro_batch_size"]) == (8, 8, 8)
    assert fp8["cuda_graph_impl"] == "full_iteration" and fp8["cuda_graph_scope"] == []  # the 'if' on cfg: not taken
    assert fp8["moe_a2a_overlap"] is True and fp8["moe_flex_dispatcher_backend"] == "hybridep"
    assert fp8["recompute_modules"] is None  # not a literal
    bf16 = configs["qwen3_30b_a3b_pretrain_8gpu_gb300_bf16_config"]
    assert bf16["micro_batch_size"] == 8 and bf16["cuda_graph_impl"] == "full_iteration"
    assert bf16["moe_a2a_overlap"] is None  # a new CommOverlapConfig without it
    assert configs["qwen3_30b_a3b_pretrain_4gpu_gb300_fp8mx_config"]["global_batch_size"] == 128
    table = [r for r in generator.rows(repo, containers={"26.08": ("v0.6.0",)})]
    assert {(r["model"], r["gpu"], r["precision"]) for r in table} == {
        ("QWEN330BA3B", "GB300", "FP8_MX"), ("QWEN330BA3B", "GB300", "BF16")}


def test_the_recipe_variant_that_ran_the_published_global_batch_wins():
    """26.06's DeepSeek-V3 GB200 MXFP8 recipes share one layout: LARGE_SCALE (global batch 256) with partial TE graphs,
    V1 / V2 (2048 / 4096) with full-iteration graphs. The published run used 4096."""
    kw = dict(software_version="NeMo 26.06 container", model="DeepSeek-V3", gpu_type="GB200 (NVL72)", precision="fp8",
              fp8_recipe="mxfp8", num_gpus=256, tp=1, pp=4, vp=4, cp=1, ep=64, micro_batch=1)
    v2 = B.recipe_for(**kw, global_batch=4096)
    assert v2 is not None and v2.config.endswith("FP8_MX_V2") and v2.full_iteration_cuda_graph
    large = B.recipe_for(**kw, global_batch=256)
    assert large is not None and large.config.endswith("LARGE_SCALE") and not large.full_iteration_cuda_graph
    assert B.recipe_for(**kw, global_batch=1234) is not None  # no variant ran it: the first of the layout's
    run = R.parse_row(csv_row("328"))
    assert run.framework.cuda_graphs == "full_iteration" and "FP8_MX_V2" in run.framework.source


def test_a_config_that_leaves_its_layout_to_its_base_recipe_is_never_matched():
    row = {"container": "26.08", "megatron_bridge": "v0.6.0", "config": "x", "model": "QWEN330BA3B", "gpu": "GB300",
           "precision": "FP8_MX", "num_gpus": "8", "tp": "", "pp": "1", "vp": "", "cp": "1", "ep": "8",
           "micro_batch": "8"}
    assert B._layout(row) is None
    assert B._layout({**row, "tp": "1"}) == (8, 1, 1, 1, 1, 8, 8)


def test_the_26_08_rows_take_their_060_recipes():
    """NeMo 26.08 ships Megatron-Bridge 0.6.0 (its docs/versions1.json: '0.6.0 (latest) · 26.08'), whose MXFP8
    Qwen3 and DeepSeek-V3 recipes on GB200/GB300 replay the iteration as one graph and overlap the all-to-all."""
    for row_id in ("287", "288", "293", "294", "295", "296"):
        run = R.parse_row(csv_row(row_id))
        assert "26.08" in csv_row(row_id)["software_version"]
        assert run.framework.cuda_graphs == "full_iteration" and run.framework.ep_overlap, row_id
        assert "v0.6.0" in run.framework.source


def test_provenance_names_the_committed_tables_digest():
    import hashlib
    digest = hashlib.sha256((ROOT / "compiler" / "data" / B.RECIPES_FILE).read_bytes()).hexdigest()
    assert digest in (ROOT / "benchmarks" / "data" / "PROVENANCE.md").read_text()


def test_a_moe_layer_forward_waits_for_the_launches_after_its_token_count_sync():
    """Megatron-Core's dispatchers synchronise the host on the token counts in every MoE layer's forward
    (token_dispatcher.py cuda_sync_point 'before_ep_alltoall'; HybridEP's num_permuted_tokens): the GPU has drained,
    so the MoE block's launches add to the forward even when the GPU work is far longer than all launches. The
    backward keeps the counts and overlaps its launches; a full-iteration CUDA graph has neither."""
    from compiler.costmodel import compute
    from compiler.costmodel.context import make_setup
    from compiler.costmodel.parts import bound_efficiency
    run = R.resolve(R.parse_row(csv_row("510")))  # Qwen3-30B-A3B, 8 x GB300, micro-batch 8: GPU-bound
    assert run.framework.cuda_graphs == "none"
    eff = load_efficiency()
    setup = make_setup(run.problem, run.layout, run.gpu, target=run.framework, eff=eff)
    lt = compute.layer_time(setup, True)
    fw, op_s = run.framework, eff.fit("cpu_op_s")
    moe_block = fw.ops_per_moe_layer - fw.ops_per_dense_layer + fw.ops_per_local_expert * 128 / run.layout.ep
    assert lt.sync_wait_f == pytest.approx(moe_block * op_s)
    assert lt.forward_s > lt.launch_f and lt.backward_s > 2 * lt.launch_f  # the GPU work alone outlasts the launches
    sc = compute.stage_compute(setup, setup.stages[0])
    waited = {name: (f, b) for name, f, b in sc.parts}["launch_bound"]
    assert waited == pytest.approx((48 * lt.sync_wait_f, 0.0))
    graphed = make_setup(run.problem, run.layout, run.gpu, eff=eff,
                         target=replace(fw, cuda_graphs="full_iteration"))
    assert "launch_bound" not in {name for name, _, _ in compute.stage_compute(graphed, graphed.stages[0]).parts}
    # the solver's bound leaves out the overlapped launches but keeps this wait, and stays below the estimate
    bound = make_setup(run.problem, run.layout, run.gpu, target=fw, eff=bound_efficiency())
    sb = compute.stage_compute(bound, bound.stages[0])
    assert {name: (f, b) for name, f, b in sb.parts}["launch_bound"] == pytest.approx(waited)
    assert sb.forward_s <= sc.forward_s and sb.backward_s <= sc.backward_s


def test_generator_reads_010_yaml_perf_matrices(tmp_path):
    """A stand-in of Megatron-Bridge 0.1.0rc3: each precision block is merged over its GPU's ``common`` block (as its
    utils/helpers.py apply_perf_matrix_overrides does), ``cuda_graphs: true`` is the per-layer 'local' graph, and
    the DeepSeek-V3 settings run_script.py decides in code (DeepEP, the 1F1B all-to-all overlap) come on H100 only."""
    repo = tmp_path / "mb"
    (repo / "scripts/performance/configs/deepseek").mkdir(parents=True)
    (repo / "scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml").write_text(
        "ConfigContainer:\n  model:\n    moe_router_fusion: true\n"
        "perf_matrix:\n"
        "  h100:\n    num_gpus_1024:\n      common: {mbs: 1, gbs: 8192, cuda_graphs: false, tp: 2, pp: 8, vp: 4, "
        "ep: 64, etp: 1}\n      bf16:\n      fp8_ss:\n"
        "  b200:\n    num_gpus_256:\n      common: {mbs: 1, gbs: 2048, tp: 2, pp: 16, vp: null, ep: 8, etp: 1}\n"
        "      bf16: {cuda_graphs: false}\n      fp8_mx: {cuda_graphs: true, mbs: 2}\n")
    _commit_and_tag(repo, "v0.1.0rc3")
    table = {r["config"]: r for r in generator.rows(repo, {"25.09": ("v0.1.0rc3",)})}
    h100 = table["deepseek_v3_llm_pretrain.yaml:h100:num_gpus_1024:fp8_ss"]
    assert (h100["model"], h100["gpu"], h100["precision"]) == ("DEEPSEEKV3", "H100", "FP8_SC")
    assert (h100["tp"], h100["pp"], h100["vp"], h100["ep"], h100["etp"], h100["micro_batch"]) == ("2", "8", "4", "64",
                                                                                                  "1", "1")
    assert (h100["moe_flex_dispatcher_backend"], h100["moe_a2a_overlap"], h100["cuda_graph_impl"]) == \
        ("deepep", "true", "")
    mx = table["deepseek_v3_llm_pretrain.yaml:b200:num_gpus_256:fp8_mx"]
    assert (mx["micro_batch"], mx["vp"], mx["cuda_graph_impl"], mx["moe_a2a_overlap"]) == ("2", "", "local", "false")
    assert mx["moe_flex_dispatcher_backend"] == ""
    assert table["deepseek_v3_llm_pretrain.yaml:b200:num_gpus_256:bf16"]["micro_batch"] == "1"
    assert not B._recipe(mx).full_iteration_cuda_graph  # a per-layer graph still launches every kernel of the rest


def test_the_25_09_deepseek_v3_h100_rows_take_their_recipe():
    """NeMo 25.09 shipped Megatron-Bridge 0.1.0rc3 (docs/releases/software-versions.md); its DeepSeek-V3 H100 perf
    matrix runs the published layout with expert tensor parallelism 1, DeepEP and the 1F1B all-to-all overlap. The
    table leaves etp out; the default (etp = tp = 2) is not what ran."""
    for row_id in ("576", "577"):
        assert "25.09" in csv_row(row_id)["software_version"]
        run = R.parse_row(csv_row(row_id))
        assert run.layout.etp == 1 and run.layout.tp == 2, row_id
        assert run.framework.ep_overlap and run.framework.hierarchical_all_to_all, row_id
        assert "v0.1.0rc3" in run.framework.source
