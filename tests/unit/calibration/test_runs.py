"""The published-run parser (compiler/calibration/runs.py): every rule on rows shaped like the ones that broke it."""
from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from compiler.calibration import runs as R
from compiler.model import count_params

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "benchmarks" / "data" / "published_runs_dev.csv"


def row(**kw) -> dict:
    base = {c: "" for c in R.CSV_COLUMNS}
    base.update(row_id="1", source_id="test", workload="pretrain (benchmark)", value_kind="measured",
                model="Llama 3 8B", num_layers="32", hidden_size="4096", ffn_hidden_size="14336",
                num_attention_heads="32", num_kv_heads="8", vocab_size="128256", seq_len="8192",
                gpu_type="H100-SXM-80GB", num_gpus="8", tp="1", pp="1", micro_batch_size="1",
                global_batch_size="64", precision="bf16", tokens_per_sec_per_gpu="1000",
                software_version="NeMo 24.07 container")
    base.update({k: str(v) for k, v in kw.items()})
    return base


def test_non_causal_convention_is_not_read_as_causal():
    shape = R.shape_of(row(), R.load_catalog())
    causal = R.convention_flops_per_token(row(flop_convention="Megatron-Bridge 25.09+: causal attention at s/2"), shape)
    full = R.convention_flops_per_token(
        row(flop_convention="NeMo 2.0 flops_formulas.py: full (non-causal-discounted) attention"), shape)
    assert full > causal
    from compiler.costmodel.compute import attention_core_flops_per_token_forward
    assert full - causal == pytest.approx(3 * attention_core_flops_per_token_forward(shape, 8192))


@pytest.mark.parametrize("model,notes,kind", [
    ("Nemotron-340B", "Arch from NeMo Nemotron4Config340B (squared-ReLU MLP, not gated).", "gelu"),
    ("GPT3-175B", "", "gelu"),
    ("BLOOM-176B", "", "gelu"),
    ("Llama 3 70B", "", "swiglu"),
    ("Some model", "GELU MLP", "gelu"),
])
def test_mlp_kind_follows_notes_then_name(model, notes, kind):
    assert R.mlp_kind(row(model=model, notes=notes)) == kind


def test_two_matrix_mlps_count_two_matrices():
    r = row(model="Nemotron-340B", num_layers="96", hidden_size="18432", ffn_hidden_size="73728",
            num_attention_heads="96", num_kv_heads="8", vocab_size="256000", notes="squared-ReLU MLP, not gated")
    shape = R.shape_of(r, R.load_catalog())
    assert shape.mlp == "gelu"
    pc = count_params(shape)
    assert pc.dense_mlp_per_layer == 2 * 18432 * 73728  # not SwiGLU's three matrices
    assert 330e9 < pc.total < 350e9  # Nemotron-4 340B


def test_torchtitan_local_batch_is_not_the_micro_batch_under_pipeline_parallelism():
    r = row(source_id="torchtitan_h100", software_version="torchtitan (2025), FSDP2", model="Llama 3.1 405B",
            num_gpus="512", tp="8", pp="8", micro_batch_size="16", global_batch_size="128", num_layers="126",
            hidden_size="16384", ffn_hidden_size="53248", num_attention_heads="128", num_kv_heads="8")
    run = R.parse_row(r)
    assert run.framework.name == "torchtitan"
    assert run.layout.micro_batch == 1 and run.layout.grad_accum == 16  # local batch 16 -> 16 micro-batches of 1
    no_pp = R.parse_row(row(source_id="torchtitan_a100", software_version="torchtitan (mid-2024), FSDP2",
                            num_gpus="64", micro_batch_size="2", global_batch_size="128"))
    assert no_pp.layout.micro_batch == 2


@pytest.mark.parametrize("text,dp,stage,shard", [
    ("ZeRO-1 (DeepSpeed), no tensor/pipeline parallelism", 64, 1, 64),
    ("ZeRO-3 (DeepSpeed), no tensor/pipeline parallelism", 64, 3, 64),
    ("DDP (doc: FSDP=0 -> DDP; Megatron distributed optimizer is the recipe default)", 64, 1, 64),
    ("none (plain data parallel all-reduce)", 64, 0, 1),
    ("PyTorch FSDP FULL_SHARD (ZeRO-3-like)", 64, 3, 64),
    ("Megatron-FSDP (sharding group 8)", 64, 3, 8),
    ("FSDP SHARD_GRAD_OP", 64, 2, 64),
    ("ZeRO-2", 1, 0, 1),
])
def test_zero_text(text, dp, stage, shard):
    assert R.zero_of(row(zero_fsdp=text), dp) == (stage, shard)


@pytest.mark.parametrize("precision,gpu,recipe", [
    ("FP8-CS", "GB200 (NVL72)", "fp8_tensorwise_current"),
    ("MXFP8", "GB200 (NVL72)", "mxfp8"),
    ("FP8-MX", "H100-SXM-80GB", "fp8_blockwise"),
    ("FP8 blockwise (128x128 weights, 1x128 activations) per doc footnote", "H100-SXM-80GB", "fp8_blockwise"),
    ("fp8 (per-tensor, current scaling)", "GB200 (NVL72)", "fp8_tensorwise_current"),
])
def test_fp8_recipes(precision, gpu, recipe):
    assert R.precision_of(row(precision=precision, gpu_type=gpu)) == ("fp8", recipe)


def test_nvfp4_is_read_and_other_fp4_skipped_with_a_reason():
    assert R.precision_of(row(precision="NVFP4")) == ("nvfp4", "")
    with pytest.raises(R.Skip, match="fp4 other than NVFP4"):
        R.precision_of(row(precision="MXFP4"))


def test_bridge_nvfp4_runs_without_userbuffers():
    """Megatron-Bridge's NVFP4 recipes set tp_comm_overlap False: only Megatron's backward TP overlap remains."""
    bridge = R.framework_of(row(software_version="NeMo 26.04 container (Megatron-Bridge + Megatron-Core)"))
    assert bridge.tp_overlap == "full"
    lay = R.layout_of(row(tp="4", pp="1", dp="2", num_gpus="8", micro_batch_size="1", global_batch_size="8"),
                      R.load_catalog().gpus["gb300"], bridge, "none")
    nv, _ = R.with_bridge_recipe(bridge, row(), lay, "nvfp4", "")
    assert nv.tp_overlap == "backward" and "tp_comm_overlap False" in nv.source
    assert R.with_bridge_recipe(bridge, row(), lay, "fp8", "mxfp8")[0].tp_overlap == "full"


@pytest.mark.parametrize("fields,framework", [
    (dict(software_version="NeMo 24.07 container"), "nemo_2407"),
    (dict(software_version="Megatron-Core (2025)"), "megatron"),
    (dict(software_version="NeMo 26.02 container (Megatron-Bridge + Megatron-Core)"), "megatron_bridge"),
    (dict(software_version="NeMo 25.02 container (NeMo 2.0)"), "megatron_bridge"),
    (dict(software_version="Megatron-LM (2021)", source_id="narayanan2021"), "megatron_lm_2021"),
    (dict(software_version="torchtitan (mid-2024), FSDP2", model="Llama 3 70B"), "torchtitan"),
    (dict(software_version="torchtitan (mid-2024), FSDP2", model="Llama 2 13B"), "torchtitan+fused_rmsnorm"),
    (dict(software_version="torchtitan (2025), FSDP2", model="Llama 2 13B"), "torchtitan"),
    (dict(software_version="torchtitan (2025), FSDP2", notes="FSDP + torch.compile + Async TP"),
     "torchtitan+compile+async_tp"),
    (dict(software_version="llm-foundry / Composer (2023-2024), FlashAttention"), "llm_foundry"),
    (dict(software_version="Megatron-LM (2021)", zero_fsdp="ZeRO-3 (DeepSpeed)"), "deepspeed+megatron_gpt_2021"),
])
def test_framework_of(fields, framework):
    assert R.framework_of(row(**fields)).name == framework


def test_power_limit_is_read_from_the_row():
    spec = R.find_gpu(R.load_catalog(), "H100 (96GB HBM2e)")
    assert spec.name == "h100-sxm-hbm2e"
    assert R.power_limit_of(row(notes="default 500W power limit"), spec) == 500.0
    assert R.power_limit_of(row(notes="500 samples"), spec) is None


@pytest.mark.parametrize("gpu,name", [("GB300 (NVL72)", "gb300"), ("B300 (DGX-B300)", "b300"),
                                      ("H100-SXM-80GB", "h100-sxm"), ("A100-SXM-40GB", "a100-40gb")])
def test_gpus_of_the_calibration_set(gpu, name):
    assert R.find_gpu(R.load_catalog(), gpu).name == name


@pytest.mark.parametrize("gpu,name", [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
                                      ("NVIDIA H100 NVL", "h100-nvl"), ("AMD Instinct MI300X", "mi300x"),
                                      ("NVIDIA GB200 (NVL72)", "gb200"), ("Nvidia H800", "h800"),
                                      ("NVIDIA A800-SXM4-80GB", "a800-80gb")])
def test_a_vendor_word_in_front_of_the_gpu_name_is_read_past(gpu, name):
    """torch.cuda.get_device_name() says 'NVIDIA H100 80GB HBM3': torch-native benchmarks' rows name GPUs so."""
    assert R.find_gpu(R.load_catalog(), gpu).name == name


@pytest.mark.parametrize("gpu,name", [
    ("GH200", "gh200"), ("NVIDIA GH200 96GB HBM3", "gh200"), ("GH200 (Alps)", "gh200"), ("GH200 96GB", "gh200"),
    ("gh200_96gb", "gh200"), ("GH200 Superchip", "gh200"), ("NVIDIA GH200 Grace Hopper Superchip", "gh200"),
    ("Grace Hopper", "gh200"),
    # the device names torch reports: the 96GB HBM3 part is named after its LPDDR5X (480GB on Lambda, 120GB on Alps)
    ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA GH200 120GB", "gh200"),
    # the HBM3e part is its own entry, never read as the 96GB one
    ("NVIDIA GH200 144G HBM3e", "gh200-144gb"), ("GH200 144GB", "gh200-144gb"), ("GH200 (144GB HBM3e)", "gh200-144gb"),
    ("MI325X", "mi325x"), ("AMD Instinct MI325X", "mi325x"), ("AMD Instinct MI325X 256GB HBM3e", "mi325x"),
    ("AMD MI325X", "mi325x"), ("MI325X (8x)", "mi325x")])
def test_gh200_and_mi325x_rows_find_their_entry(gpu, name):
    """Published runs on Grace Hopper (CSCS Alps, JUPITER) and MI325X were skipped as 'gpu not in catalog'."""
    assert R.find_gpu(R.load_catalog(), gpu).name == name


def test_gh200_and_mi325x_are_their_siblings_compute_on_their_own_systems():
    catalog = R.load_catalog()
    gh200, h100, mi325x, mi300x = (catalog.find_gpu(n) for n in ("GH200-96GB", "H100", "Instinct-MI325X", "MI300X"))
    assert (gh200.name, mi325x.name) == ("gh200", "mi325x")
    # the same tensor cores: the datasheets print the H100 SXM's and the MI300X's peaks
    assert gh200.peak_flops == h100.peak_flops and gh200.generation == "hopper" and gh200.kernel_class == ""
    assert mi325x.peak_flops == mi300x.peak_flops and mi325x.generation == "cdna3"
    # what differs: memory, the quad-GH200 node (NVLink mesh, one 200Gb/s NIC and a 450GB/s C2C host link per GPU)
    assert (gh200.hbm_bytes, catalog.gpus["gh200-144gb"].hbm_bytes, mi325x.hbm_bytes) == (96 * 2**30, 144 * 2**30,
                                                                                          256 * 2**30)
    assert (gh200.default_gpus_per_node, gh200.nvlink_domain_gpus) == (4, 4)
    assert gh200.inter_node_bandwidth_bytes_per_s == pytest.approx(25e9)
    assert gh200.pcie_bandwidth_bytes_per_s == pytest.approx(450e9)
    assert gh200.host_memory_bytes == 4 * 120 * 2**30
    assert (gh200.tdp_w, mi325x.tdp_w) == (700.0, 1000.0)


def test_every_calibration_row_parses_or_is_skipped_with_a_reason():
    rows = R.read_rows(CSV)
    parsed = skipped = 0
    for r in rows:
        try:
            R.parse_row(r)
            parsed += 1
        except R.Skip:
            skipped += 1
    assert parsed + skipped == len(rows) == 449
    assert parsed >= 300  # GB300 / B300 rows are modelled now


def test_accuracy_benchmark_reads_any_csv_with_the_columns(tmp_path):
    """Columns in another order, one more column, a subset of rows: the harness reads them by name."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accuracy

    rows = R.read_rows(CSV)[:40]
    cols = list(reversed(R.CSV_COLUMNS)) + ["extra_column"]
    path = tmp_path / "other.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "extra_column": "x"})
    report = accuracy.run(path)
    assert len(report.results) + sum(report.skipped.values()) == 40
    text = accuracy.format_report(report)
    assert text.splitlines()[-1].startswith("overall: ")
    assert "do not fit in HBM" in text


@pytest.mark.parametrize("field, value, reason", [
    ("pp", "-1", "layout degree below 1"),
    ("vp", "1000", "layout breaks a layout rule (pp_split_invalid)"),
    ("num_attention_heads", "-1", "architecture not consistent"),
    ("num_kv_heads", "5", "architecture not consistent"),
    ("gpus_per_node", "-8", "GPU count, GPUs per node or sequence length below 1"),
    ("seq_len", "-4096", "GPU count, GPUs per node or sequence length below 1"),
    # etp=0 passed the degree check as 'no etp' and tripped Layout's assert: a traceback ended the whole report
    ("etp", "0", "layout degree below 1"),
    # a layer count beyond the spec's cap: the cost model walks the layers one by one, so 1e30 never returned
    ("num_layers", "1e30", "architecture beyond dtc's limits"),
])
def test_a_row_the_model_cannot_read_is_skipped_with_its_reason_not_a_traceback(tmp_path, field, value, reason):
    """The held-out check runs benchmarks/accuracy.py on CSVs dtc never saw: a row with a value no layout or
    model can have (a negative degree, more pipeline chunks than layers, heads that do not group) is counted as
    skipped with why; the other rows are still costed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accuracy

    rows = [r for r in R.read_rows(CSV) if r["source_id"] == "narayanan2021"][:6]
    bad = {**rows[0], field: value}
    if field == "vp":
        bad.update(pp="4", num_gpus=str(4 * int(rows[0]["tp"])), global_batch_size="64", grad_accum="")
    path = tmp_path / "odd.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=R.CSV_COLUMNS)
        w.writeheader()
        w.writerows([bad] + rows[1:])
    report = accuracy.run(path)
    assert [why for why in report.skipped if why.startswith(reason)] == [next(iter(report.skipped))]
    assert sum(report.skipped.values()) == 1 and len(report.results) == 5


class _Reads(dict):
    """A CSV row that records which columns are read."""

    seen: set[str] = set()

    def __getitem__(self, key):
        _Reads.seen.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        _Reads.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        _Reads.seen.add(key)
        return super().__contains__(key)


def test_the_columns_a_csv_must_have_are_the_columns_the_parser_reads():
    """READ_COLUMNS (what a CSV's header must give) is exactly what parse_row and resolve read over the calibration
    set, besides the optional peak_memory_gib: a column read but not required would be read as blank from a CSV
    without it, one required but never read would turn away a CSV for nothing."""
    _Reads.seen = set()
    for r in R.read_rows(CSV):
        try:
            R.resolve(R.parse_row(_Reads(r), unsourced=True))
        except R.Skip:
            pass
    assert _Reads.seen - {"peak_memory_gib"} == set(R.READ_COLUMNS)
    assert R.DESCRIPTIVE_COLUMNS < set(R.CSV_COLUMNS)


def test_a_csv_without_a_column_the_parser_reads_is_refused_by_name(tmp_path, capsys):
    """A CSV without `vp` was read as if every run were non-interleaved, and one without most columns reported
    'gpu not in catalog' for each row: the report now refuses it and names the missing columns (exit 2)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import accuracy

    rows = R.read_rows(CSV)[:5]
    cols = [c for c in R.CSV_COLUMNS if c not in ("vp", "notes")]
    path = tmp_path / "without_vp.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(R.NotACalibrationCsv) as exc:
        accuracy.run(path)
    assert exc.value.missing == ["vp", "notes"]
    assert accuracy.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a calibration CSV: missing columns vp, notes" in err and "hint:" in err
    (tmp_path / "empty.csv").write_text("")
    assert accuracy.main([str(tmp_path / "empty.csv")]) == 2
    # without a descriptive column, in another order, with a byte-order mark: read
    path.write_text("\ufeff" + ",".join(reversed(R.READ_COLUMNS)) + "\n", encoding="utf-8")
    assert accuracy.run(path).results == []


ODD_CELLS = ("", "n/a", "0", "-1", "1.5", "1e30", "nan", "inf", "abc", "8 (est.)", "1,024", "999999999", "TP8")


@pytest.mark.slow
@pytest.mark.parametrize("row_id", ["8", "126"])  # a dense GPT-3-style Megatron run, a Mixtral MoE run
def test_any_odd_cell_in_any_column_is_read_or_skipped_never_a_traceback_or_a_hang(row_id):
    """The held-out check runs the harness on CSVs dtc never saw: each odd value in each column of a dense and an MoE
    row either parses into a run the cost model costs to a positive finite throughput, or is skipped with a reason
    (this found etp=0's assertion and num_layers=1e30's endless loop). An alarm turns a hang into a failure."""
    import signal

    from compiler.calibration.fit import predict
    from compiler.costmodel.efficiency import load_efficiency

    eff = load_efficiency()
    (base,) = [r for r in R.read_rows(CSV) if r["row_id"] == row_id]

    def hang(*_):
        raise TimeoutError("no answer within 20 s")

    old = signal.signal(signal.SIGALRM, hang)
    try:
        for col in R.CSV_COLUMNS:
            for value in ODD_CELLS:
                signal.alarm(20)
                try:
                    run = R.parse_row({**base, col: value})
                except R.Skip:
                    continue
                finally:
                    signal.alarm(0)
                signal.alarm(20)
                try:
                    x = predict(R.resolve(run), eff).tokens_per_s_per_gpu
                finally:
                    signal.alarm(0)
                assert 0 < x < float("inf"), (col, value, x)
    finally:
        signal.signal(signal.SIGALRM, old)


def test_a_row_measuring_no_positive_throughput_is_skipped(tmp_path):
    row = {**R.read_rows(CSV)[0], "tflops_per_gpu": "-5", "tokens_per_sec_per_gpu": "", "mfu_pct": ""}
    with pytest.raises(R.Skip, match="measured throughput not positive"):
        R.parse_row(row)


def test_deepspeed_zero3_of_2021_gathers_per_weight_matrix_and_blocks():
    """Narayanan et al. 2021's ZeRO-3 rows ran DeepSpeed 0.3-0.4, whose fetches block and go one weight matrix at a
    time; a DeepSpeed run of another year keeps DeepSpeed's overlapped per-unit gathers."""
    old = R.framework_of(row(software_version="Megatron-LM (2021)", zero_fsdp="ZeRO-3 (DeepSpeed), no tensor/pipeline "
                             "parallelism", source_id="narayanan2021"))
    assert old.name == "deepspeed+megatron_gpt_2021"
    assert (old.zero3_gathers_per_layer, old.zero3_blocking) == (4, True)
    new = R.framework_of(row(software_version="DeepSpeed 0.14 (2024)", zero_fsdp="ZeRO-3 (DeepSpeed)"))
    assert (new.zero3_gathers_per_layer, new.zero3_blocking) == (1, False)


def test_torchtitan_fused_rmsnorm_saves_no_fp32_copies_and_moves_fused_norm_bytes():
    """torchtitan's 2024 8B/13B configs ran norm_type = fused_rmsnorm (pytorch/torchtitan 1ea476e9f): the Triton
    kernel saves x and rstd, not composite RMSNorm's fp32 input and output, and moves a fused norm's bytes. The
    Llama 2 13B run without activation checkpointing (mb 2 x 4K on 80 GB) fits only so."""
    from compiler.calibration.fit import predict
    from compiler.costmodel.efficiency import load_efficiency
    r = row(source_id="torchtitan_a100", software_version="torchtitan (mid-2024), FSDP2", model="Llama 2 13B",
            num_layers="40", hidden_size="5120", ffn_hidden_size="13824", num_attention_heads="40",
            num_kv_heads="40", vocab_size="32000", seq_len="4096", gpu_type="A100-SXM-80GB", num_gpus="64",
            zero_fsdp="FSDP2 full shard (1D, 64-way)", activation_recompute="none", micro_batch_size="2",
            global_batch_size="128", tokens_per_sec_per_gpu="2162")
    fused = R.parse_row(r)
    assert fused.framework.fused_norm and fused.framework.name == "torchtitan+fused_rmsnorm"
    composite = R.parse_row(dict(r, software_version="torchtitan (2025), FSDP2"))
    assert not composite.framework.fused_norm
    eff = load_efficiency()
    a, b = predict(fused, eff), predict(composite, eff)
    act = {e.name: e.value for e in a.memory.items}["activations"]
    act_composite = {e.name: e.value for e in b.memory.items}["activations"]
    # each norm (2 per layer, and the final one) drops 2 fp32 copies (8 B per element) for its 2-byte input
    saved_per_token = (act_composite - act) / (2 * 4096)
    assert saved_per_token == pytest.approx((2 * 40 + 1) * 6 * 5120, rel=1e-6)
    assert a.memory_high_bytes_per_gpu < 80 * 2**30 < b.memory_high_bytes_per_gpu
    assert a.step_time_s < b.step_time_s  # 4 B per element through a fused norm, 36 through the composite one


def test_the_loss_is_costed_by_the_cross_entropy_each_framework_runs():
    """physics.yaml memory_bound.cross_entropy_bytes_per_element, per cost profile: NeMo 24.07's launcher fused it
    for Llama 3 and Nemotron only; Megatron-Bridge runs Transformer Engine's kernel; torchtitan and dtc's own
    trainers F.cross_entropy on fp32 logits; dtc's Megatron target passes --cross-entropy-loss-fusion (native) under
    bf16 and fp8 and costs it (tests/test_per_target.py checks the renderer), the stacks built on its profile keep
    their own loss under every precision."""
    import inspect

    from compiler.costmodel import compute
    from compiler.costmodel.context import make_setup
    from compiler.costmodel.efficiency import load_efficiency
    from compiler.runtime import model as runtime_model
    from compiler.targets import registry
    fused = R.framework_of(row(software_version="NeMo 24.07 container", model="LLAMA3-8B"))
    unfused = R.framework_of(row(software_version="NeMo 24.07 container", model="GPT3-5B"))
    assert (fused.cross_entropy, unfused.cross_entropy) == ("megatron_native", "megatron_fp32")
    assert R.framework_of(row(software_version="NeMo 26.04 container (Megatron-Bridge)")).cross_entropy == "fused"
    assert R.framework_of(row(software_version="torchtitan (2025), FSDP2")).cross_entropy == "torch_fp32"
    megatron = registry.get("megatron").cost
    assert [megatron.cross_entropy_for(p) for p in ("bf16", "fp8", "fp16", "fp32")] == \
        ["megatron_native", "megatron_native", "megatron_fp32", "megatron_fp32"]
    assert "--cross-entropy-loss-fusion" in (ROOT / "generated/llama3-70b/megatron_args.sh").read_text()  # bf16
    for stack in (fused, unfused, R.framework_of(row(software_version="NeMo 26.04 container (Megatron-Bridge)"))):
        assert stack.cross_entropy_for("fp16") == stack.cross_entropy  # not the Megatron target's fp16 rule
    assert {registry.get(t).cost.cross_entropy for t in ("fsdp", "deepspeed")} == {"torch_fp32"}
    assert "logits.float()" in inspect.getsource(runtime_model.cross_entropy)
    run = R.parse_row(row())  # Llama 3 8B, 8K, mb 1 on H100
    eff = load_efficiency()
    times = {}
    for impl in ("fused", "megatron_native", "megatron_fp32", "torch_fp32"):
        setup = make_setup(run.problem, run.layout, run.gpu, target=replace(run.framework, cross_entropy=impl), eff=eff)
        times[impl] = compute.cross_entropy_time_s(setup)
        part = {n: (f, b) for n, f, b in compute.stage_compute(setup, setup.stages[-1]).parts}["cross_entropy"]
        assert part == pytest.approx(times[impl])
    logits = 8192 * 128256  # tokens x vocab of one micro-batch, tp 1
    rate = run.gpu.spec.hbm_bandwidth_bytes_per_s * eff.physics.memory_bound_fraction["fused"]
    assert times["megatron_fp32"] == pytest.approx((logits * 38 / rate, logits * 14 / rate))
    assert times["fused"] == pytest.approx((logits * 6 / rate, logits * 4 / rate))
    assert sum(times["fused"]) < sum(times["megatron_native"]) < sum(times["torch_fp32"]) < sum(times["megatron_fp32"])


def test_nvfp4_on_a_gpu_without_fp4_tensor_cores_is_skipped():
    with pytest.raises(R.Skip, match="nvfp4 on a GPU without nvfp4 tensor cores"):
        R.parse_row(row(precision="NVFP4", gpu_type="H100-SXM-80GB"))
    run = R.parse_row(row(precision="NVFP4", gpu_type="GB300 (NVL72)", gpus_per_node="4"))
    assert run.problem.precision == "nvfp4"


def test_a_row_naming_a_catalog_model_without_its_architecture_takes_the_preset():
    """Vendor tables often give the model's name and the layout only (the Mixtral-8x22B row gives no vocabulary):
    the catalog's preset of that name is the architecture, unless a dimension the row does give contradicts it."""
    from compiler.catalog import load_catalog

    mixtral = load_catalog().models["mixtral-8x22b"].shape
    bare = dict(model="Mixtral-8x22B", num_layers="", hidden_size="", num_attention_heads="", vocab_size="",
                ffn_hidden_size="", num_kv_heads="", num_gpus="64", tp="2", pp="4", ep="8", global_batch_size="256")
    assert R.parse_row(row(**bare)).problem.shape == mixtral
    assert R.parse_row(row(**{**bare, "num_layers": "56", "hidden_size": "6144"})).problem.shape == mixtral
    with pytest.raises(R.Skip, match="architecture not given"):
        R.parse_row(row(**{**bare, "num_layers": "40"}))  # the row says otherwise: not this preset
    with pytest.raises(R.Skip, match="architecture not given"):
        R.parse_row(row(**{**bare, "model": "Some 8x22B"}))  # no preset of that name


def test_muon_runs_and_rows_that_doubt_their_own_reading_are_skipped():
    with pytest.raises(R.Skip, match=r"optimizer not modelled \(Muon\)"):
        R.parse_row(row(notes="Muon optimizer used."))
    with pytest.raises(R.Skip, match="the row's own notes doubt its reading"):
        R.parse_row(row(notes="DOUBT: stored page prints GBS 1, MBS 64; read here as GBS=64, MBS=1."))
    assert R.parse_row(row(notes="Adam, no doubts")).row_id == "1"
