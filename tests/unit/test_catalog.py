"""The built-in catalog (compiler/data/*.yaml via compiler.catalog) and count_params itself."""
from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from compiler.catalog import (
    GPU_SOURCED_FIELDS,
    Catalog,
    ModelPreset,
    _parse_gpu,
    _parse_model,
    load_catalog,
    normalize_name,
)
from compiler.model import MLAShape, ModelShape, MoEShape, count_params

GiB = 2**30
CATALOG = load_catalog()
MODEL_NAMES = CATALOG.model_names()
GPU_NAMES = CATALOG.gpu_names()

# Published figures printed to one decimal in billions (Narayanan et al. 2021, Table 1): the
# exact count of the shape only has to round to the printed figure. The paper's own formula
# (checked exactly below) gives 1.652B and 3.562B for these two rows.
ROUNDED_TO_0_1B = {"gpt-1.7b", "gpt-3.6b"}
# DeepSeek-V3: the exact activated count of the published config is 37.55B (incl. 0.93B
# embedding + 0.93B head); DeepSeek prints 37B (paper) / 36.7B (README_WEIGHTS.md). Their
# accounting is not published, so the active figure alone gets 2%.
ACTIVE_TOLERANCE = {"deepseek-v3": 0.02}
# OpenAI's model card counts gpt-oss's active parameters without the input embedding (arXiv:2508.10925, Table 1)
ACTIVE_WITHOUT_EMBEDDING = ("gpt-oss-120b", "gpt-oss-20b")


def _within(computed: int, published: int, name: str, rel: float = 0.01) -> None:
    if name in ROUNDED_TO_0_1B:
        assert abs(computed - published) <= 0.05e9, (name, computed, published)
        return
    assert abs(computed - published) <= rel * published, (
        f"{name}: computed {computed:,} vs published {published:,} "
        f"({(computed - published) / published:+.2%})"
    )


# --- model presets ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_total_params_match_published(name):
    preset = CATALOG.models[name]
    _within(count_params(preset.shape).total, preset.published_params, name)


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES if CATALOG.models[n].shape.is_moe])
def test_active_params_match_published(name):
    preset = CATALOG.models[name]
    assert preset.published_active_params is not None
    pc = count_params(preset.shape)
    active = pc.active - pc.embedding if name in ACTIVE_WITHOUT_EMBEDDING else pc.active
    _within(active, preset.published_active_params, name, ACTIVE_TOLERANCE.get(name, 0.01))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_active_only_for_moe(name):
    preset = CATALOG.models[name]
    pc = count_params(preset.shape)
    if preset.shape.is_moe:
        assert pc.active < pc.total
    else:
        assert preset.published_active_params is None
        assert pc.active == pc.total


def test_required_presets_present():
    for name in ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b",
                 "llama3.1-70b", "llama3.1-405b", "gpt3-175b", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b",
                 "gpt-18.4b", "gpt-39.1b", "gpt-76.1b", "gpt-145.6b", "gpt-310.1b", "gpt-529.6b",
                 "gpt-1t", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen2.5-7b",
                 "qwen2.5-72b", "nemotron-4-340b"):
        assert name in CATALOG.models, name


def test_megatron_family_matches_paper_formula_exactly():
    """Narayanan et al. 2021, section 5.1: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).

    That formula omits only the final LayerNorm (2h), so the count must match it exactly.
    """
    family = [n for n in MODEL_NAMES if re.fullmatch(r"gpt-[0-9.]+[bt]", n)]
    assert len(family) == 10
    for name in family:
        s = CATALOG.models[name].shape
        l, h, V, seq = s.num_layers, s.hidden_size, s.vocab_size, s.max_position_embeddings
        formula = 12 * l * h * h + 13 * l * h + (V + seq) * h
        assert count_params(s).total == formula + 2 * h, name


def test_exact_counts_of_reference_checkpoints():
    """Counts that equal the released checkpoints' tensor totals."""
    exact = {
        "llama2-7b": 6_738_415_616,
        "llama2-70b": 68_976_648_192,
        "llama3-8b": 8_030_261_248,
        "llama3-70b": 70_553_706_496,
        "llama3.1-405b": 405_853_388_800,
        "mixtral-8x7b": 46_702_792_704,
    }
    for name, n in exact.items():
        assert count_params(CATALOG.models[name].shape).total == n, name


def test_deepseek_v3_parts():
    s = CATALOG.models["deepseek-v3"].shape
    pc = count_params(s)
    assert (pc.num_dense_layers, pc.num_moe_layers) == (3, 58)
    assert pc.extra == 0  # the 14B MTP module is not part of the published 671B
    # 671B total is exact to 0.01%
    assert abs(pc.total - 671e9) / 671e9 < 1e-4
    # routed experts are the bulk: 58 layers x 256 experts x 3 x 7168 x 2048
    assert pc.expert_total == 58 * 256 * 3 * 7168 * 2048


def test_llama3_405b_alias():
    assert CATALOG.find_model("llama3-405b") is CATALOG.models["llama3.1-405b"]


def test_qwen_biases_and_tying():
    for name in ("qwen2.5-7b", "qwen2.5-72b"):
        s = CATALOG.models[name].shape
        assert s.attention_bias and not s.linear_bias and not s.tied_embeddings


def test_presets_are_modelpresets():
    for preset in CATALOG.models.values():
        assert isinstance(preset, ModelPreset)
        assert isinstance(preset.shape, ModelShape)
        assert isinstance(preset.aliases, tuple)
        assert preset.source.strip()


# --- GPUs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GPU_NAMES)
def test_every_numeric_gpu_field_has_a_named_source(name):
    gpu = CATALOG.gpus[name]
    # host_memory is optional: sourced exactly when the entry gives it
    assert set(gpu.sources) == set(GPU_SOURCED_FIELDS) | ({"host_memory"} if gpu.host_memory_bytes else set())
    for field, text in gpu.sources.items():
        # a document and where it lives: a domain or an arXiv id
        assert re.search(r"[a-z0-9-]+\.(com|cn|ai|org|io|net)\b|arXiv:\d{4}\.\d{4,5}", text), (name, field)


@pytest.mark.parametrize("name", GPU_NAMES)
def test_gpu_numbers_are_dense_and_consistent(name):
    g = CATALOG.gpus[name]
    f = g.peak_flops
    # dense, not 2:4 sparse: fp16 == bf16, tf32 ~ bf16/2, fp8 ~ 2*bf16 (datasheet rounding <= 2%)
    assert f["fp16"] == f["bf16"]
    assert f["tf32"] == pytest.approx(f["bf16"] / 2, rel=0.02)
    if "fp8" in f:
        assert f["fp8"] == pytest.approx(2 * f["bf16"], rel=0.02)
    assert f["bf16"] < 3e15  # no single GPU in the catalog reaches 3 PFLOPS dense BF16
    assert f["fp32"] < f["bf16"]
    assert g.intra_node_bandwidth_bytes_per_s < g.hbm_bandwidth_bytes_per_s
    assert g.inter_node_bandwidth_bytes_per_s <= g.intra_node_bandwidth_bytes_per_s
    assert g.default_gpus_per_node <= g.nvlink_domain_gpus
    assert g.nvlink_domain_gpus % g.default_gpus_per_node == 0
    assert 0.1 < g.price_per_gpu_hour_usd < 50
    assert isinstance(g.peak_flops, MappingProxyType) and isinstance(g.sources, MappingProxyType)


def test_spot_values():
    h100 = CATALOG.gpus["h100-sxm"]
    assert h100.peak_flops_for("bf16") == pytest.approx(989e12, rel=1e-3)
    assert h100.peak_flops_for("fp8") == pytest.approx(1979e12, rel=1e-3)
    assert h100.hbm_bytes == 80 * GiB
    assert h100.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.intra_node_bandwidth_bytes_per_s == pytest.approx(450e9)  # 900GB/s bidirectional
    assert h100.inter_node_bandwidth_bytes_per_s == pytest.approx(50e9)  # 400Gb/s NDR
    assert h100.pcie_bandwidth_bytes_per_s == pytest.approx(64e9)

    a100 = CATALOG.gpus["a100-80gb"]
    assert a100.peak_flops_for("bf16") == pytest.approx(312e12)
    assert a100.hbm_bytes == 80 * GiB
    assert CATALOG.gpus["a100-40gb"].hbm_bytes == 40 * GiB
    assert CATALOG.gpus["h200"].hbm_bytes == 141 * GiB
    assert CATALOG.gpus["mi300x"].hbm_bytes == 192 * GiB
    assert CATALOG.gpus["b200"].hbm_bytes == 180 * GiB

    h800 = CATALOG.gpus["h800"]
    assert h800.peak_flops["bf16"] == h100.peak_flops["bf16"]
    assert h800.intra_node_bandwidth_bytes_per_s == pytest.approx(200e9)  # 400GB/s bidirectional

    gb200 = CATALOG.gpus["gb200"]
    assert (gb200.nvlink_domain_gpus, gb200.default_gpus_per_node) == (72, 4)
    assert gb200.peak_flops_for("bf16") == pytest.approx(2.5e15)
    assert CATALOG.gpus["b200"].peak_flops_for("bf16") == pytest.approx(2.25e15)


def test_precisions():
    a100 = CATALOG.find_gpu("a100")
    with pytest.raises(KeyError, match="fp8"):
        a100.peak_flops_for("fp8")
    with pytest.raises(KeyError, match="unknown precision"):
        a100.peak_flops_for("int3")
    # fp32 training runs its matmuls on TF32 tensor cores
    assert a100.peak_flops_for("fp32") == a100.peak_flops["tf32"] == pytest.approx(156e12)
    assert a100.peak_flops_for("BFloat16") == a100.peak_flops["bf16"]
    assert "fp8" not in a100.peak_flops
    for name in GPU_NAMES:
        g = CATALOG.gpus[name]
        assert ("fp8" in g.peak_flops) == (g.generation != "ampere"), name


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, expected",
    [
        ("H100", "h100-sxm"),
        ("h100-sxm", "h100-sxm"),
        ("  H100-SXM5 ", "h100-sxm"),
        ("a100", "a100-80gb"),
        ("A100_40GB", "a100-40gb"),
        ("GB200-NVL72", "gb200"),
        ("MI300X", "mi300x"),
    ],
)
def test_gpu_aliases_resolve(query, expected):
    assert CATALOG.find_gpu(query) is CATALOG.gpus[expected]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("Llama3-405B", "llama3.1-405b"),
        ("meta-llama/Llama-3.1-8B", "llama3.1-8b"),
        ("GPT3", "gpt3-175b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("Qwen/Qwen2.5-72B", "qwen2.5-72b"),
        ("mixtral", "mixtral-8x7b"),
    ],
)
def test_model_aliases_resolve(query, expected):
    assert CATALOG.find_model(query) is CATALOG.models[expected]


def test_unknown_names():
    assert CATALOG.find_gpu("tpu-v5p") is None
    assert CATALOG.find_model("llama9-1t") is None


@pytest.mark.parametrize("kind", ["gpus", "models"])
def test_no_alias_collides(kind):
    entries = getattr(CATALOG, kind)
    seen: dict[str, str] = {}
    for name, entry in entries.items():
        assert name == normalize_name(name)
        for key in (name, *entry.aliases):
            norm = normalize_name(key)
            assert norm not in seen, f"{key!r} of {name!r} collides with {seen[norm]!r}"
            seen[norm] = name
    # and every alias resolves to its own entry
    for name, entry in entries.items():
        find = CATALOG.find_gpu if kind == "gpus" else CATALOG.find_model
        for alias in entry.aliases:
            assert find(alias) is entry


def test_names_sorted_and_canonical():
    assert GPU_NAMES == sorted(CATALOG.gpus)
    assert MODEL_NAMES == sorted(CATALOG.models)
    for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h800", "h200", "b200",
                 "gb200", "mi300x", "l40s"):
        assert name in GPU_NAMES


def test_catalog_is_immutable_and_cached():
    assert load_catalog() is CATALOG
    assert isinstance(CATALOG.gpus, MappingProxyType)
    assert isinstance(CATALOG.models, MappingProxyType)
    with pytest.raises(TypeError):
        CATALOG.gpus["x"] = CATALOG.gpus["h100-sxm"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        CATALOG.gpus["h100-sxm"].hbm_bytes = 1  # type: ignore[misc]


def test_catalog_rejects_colliding_aliases():
    h100 = CATALOG.gpus["h100-sxm"]
    with pytest.raises(ValueError, match="collides"):
        Catalog(gpus=MappingProxyType({"a": h100, "h100-sxm": h100}), models=CATALOG.models)


# --- strict validation ------------------------------------------------------------------------


def _raw_gpu() -> dict:
    return {
        "display_name": "Test GPU", "aliases": [], "vendor": "nvidia", "generation": "hopper",
        "peak_flops": {"bf16": "1PFLOPS", "fp16": "1PFLOPS", "tf32": "0.5PFLOPS", "fp32": "60TFLOPS"},
        "hbm": "80GiB", "hbm_bandwidth": "3TB/s", "intra_node_link": "nvlink4",
        "intra_node_bandwidth": "450GB/s", "nvlink_domain_gpus": 8, "default_gpus_per_node": 8,
        "inter_node_bandwidth": "400Gb/s", "pcie_bandwidth": "64GB/s", "price_per_gpu_hour": "$2", "tdp": "700W",
        "sources": {k: "a datasheet (example.com)" for k in GPU_SOURCED_FIELDS},
    }


def test_gpu_validation_accepts_the_minimal_entry():
    g = _parse_gpu("test-gpu", _raw_gpu())
    assert g.hbm_bytes == 80 * GiB and g.inter_node_bandwidth_bytes_per_s == 50e9


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.update(tgp="700W"), "unknown field"),
        (lambda r: r.update(tdp="hot"), "tdp"),
        (lambda r: r.update(kernel_class="volta"), "kernel_class"),
        (lambda r: r["peak_flops"].update(int8="2POPS"), "unknown field"),
        (lambda r: r["sources"].pop("hbm"), "missing field"),
        (lambda r: r.pop("hbm"), "missing field"),
        (lambda r: r.update(hbm="eighty"), "hbm"),
        (lambda r: r.update(intra_node_link="nvlink9"), "intra_node_link"),
        (lambda r: r.update(nvlink_domain_gpus=True), "nvlink_domain_gpus"),
    ],
)
def test_gpu_validation_is_strict(mutate, message):
    raw = _raw_gpu()
    mutate(raw)
    with pytest.raises(ValueError, match=message) as info:
        _parse_gpu("test-gpu", raw)
    assert "gpus.yaml" in str(info.value) and "test-gpu" in str(info.value)


def _raw_model() -> dict:
    return {
        "display_name": "Tiny", "aliases": ["tiny-alias"], "published_params": "1.2K",
        "published_active_params": None, "source": "hand count",
        "shape": {"num_layers": 1, "hidden_size": 8, "ffn_hidden_size": 16, "num_attention_heads": 2,
                  "num_kv_heads": 2, "vocab_size": 10},
        "hyperparameters": {"rope_theta": 10000, "rope_scaling": None, "norm_eps": 1e-5, "init_std": 0.02,
                            "sources": {"rope_theta": "by hand", "norm_eps": "by hand", "init_std": "by hand"}},
    }


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.update(license="mit"), "unknown field"),
        (lambda r: r["shape"].update(rope_theta=10000), "unknown field"),
        (lambda r: r["shape"].update(moe={"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 4, "k": 1}),
         "unknown field"),
        (lambda r: r["shape"].update(mlp="relu"), "shape.mlp"),
        (lambda r: r["shape"].pop("vocab_size"), "missing field"),
        (lambda r: r["shape"].update(moe={"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 4}),
         "published_active_params"),
        (lambda r: r.update(published_active_params="1K"), "MoE shapes only"),
        (lambda r: r.update(published_params="lots"), "published_params"),
        (lambda r: r.pop("hyperparameters"), "missing field"),
        (lambda r: r["hyperparameters"].update(rope_theta=None), "rope_theta must be given"),
        (lambda r: r["hyperparameters"].update(init_std=0), "init_std must be a positive number"),
        (lambda r: r["hyperparameters"].update(rope_scaling={"kind": "ntk", "factor": 2,
                                                             "original_max_position_embeddings": 8}), "kind"),
        (lambda r: r["hyperparameters"].update(rope_scaling={"kind": "llama3", "factor": 8,
                                                             "original_max_position_embeddings": 8}),
         "sources needs rope_scaling"),
    ],
)
def test_model_validation_is_strict(mutate, message):
    raw = _raw_model()
    _parse_model("tiny", raw)  # the unmutated entry is valid
    mutate(raw)
    with pytest.raises(ValueError, match=message) as info:
        _parse_model("tiny", raw)
    assert "models.yaml" in str(info.value) and "tiny" in str(info.value)


# --- count_params on hand-counted shapes ------------------------------------------------------


def test_count_params_gqa_swiglu_by_hand():
    s = ModelShape(num_layers=2, hidden_size=8, ffn_hidden_size=16, num_attention_heads=4,
                   num_kv_heads=2, vocab_size=10)
    pc = count_params(s)
    # head_dim 2: q 8x8, k and v 8x(2 heads x 2), o 8x8
    assert pc.attention_per_layer == 64 + 2 * 32 + 64 == 192
    assert pc.dense_mlp_per_layer == 3 * 8 * 16 == 384  # gate, up, down
    assert pc.norms_per_layer == 2 * 8  # two RMSNorm weights
    assert pc.embedding == pc.output == 80
    assert pc.final_norm == 8
    assert pc.total == 80 + 80 + 2 * (192 + 384 + 16) + 8 == 1352
    assert pc.active == pc.total


def test_count_params_gelu_with_biases_by_hand():
    s = ModelShape(num_layers=1, hidden_size=4, ffn_hidden_size=16, num_attention_heads=2,
                   num_kv_heads=2, vocab_size=6, mlp="gelu", norm="layernorm", position="learned",
                   max_position_embeddings=5, tied_embeddings=True, attention_bias=True, linear_bias=True)
    pc = count_params(s)
    assert pc.attention_per_layer == 4 * 4 * 4 + 3 * 4 + 4 == 80  # qkvo weights, qkv bias, o bias
    assert pc.dense_mlp_per_layer == 2 * 4 * 16 + 16 + 4 == 148  # fc1, fc2 weights and biases
    assert pc.norms_per_layer == 2 * (4 + 4)  # two LayerNorms with weight and bias
    assert pc.embedding == 6 * 4 + 5 * 4  # tokens + learned positions
    assert pc.output == 0  # tied
    assert pc.final_norm == 8
    assert pc.total == 44 + 80 + 148 + 16 + 8 == 296


def test_count_params_moe_by_hand():
    s = ModelShape(num_layers=3, hidden_size=4, ffn_hidden_size=8, num_attention_heads=2, num_kv_heads=2,
                   vocab_size=3, moe=MoEShape(num_experts=4, top_k=1, expert_ffn_hidden_size=2,
                                              num_shared_experts=1, first_dense_layers=1, layer_freq=2))
    pc = count_params(s)
    assert [s.is_moe_layer(i) for i in range(3)] == [False, True, False]
    attn, norms, dense = 64, 8, 3 * 4 * 8
    router, expert = 4 * 4, 3 * 4 * 2
    assert (pc.attention_per_layer, pc.dense_mlp_per_layer) == (attn, dense)
    assert (pc.moe_router_per_layer, pc.expert_params_per_expert, pc.shared_expert_per_layer) == (router, expert, expert)
    head = 12 + 12 + 4
    assert pc.total == head + 2 * (attn + dense + norms) + (attn + norms + router + expert + 4 * expert) == 572
    assert pc.active == head + 2 * (attn + dense + norms) + (attn + norms + router + expert + 1 * expert) == 500


def test_count_params_mla_attention_by_hand():
    s = ModelShape(num_layers=1, hidden_size=8, ffn_hidden_size=8, num_attention_heads=2, num_kv_heads=2,
                   vocab_size=4, mla=MLAShape(q_lora_rank=4, kv_lora_rank=3, qk_nope_head_dim=2,
                                              qk_rope_head_dim=1, v_head_dim=2))
    q = 8 * 4 + 4 + 4 * 2 * (2 + 1)  # q_a, q_a norm, q_b
    kv = 8 * (3 + 1) + 3 + 3 * 2 * (2 + 2)  # kv_a (+ shared rope key), kv_a norm, kv_b
    o = 2 * 2 * 8
    assert count_params(s).attention_per_layer == q + kv + o == 151


def test_catalog_files_read_the_same_with_the_c_parser() -> None:
    """The built-in data files are read with ruamel.yaml's C parser (ruamel.yaml.clib, a dependency: without it
    `dtc validate` spends ~0.08 s more CPU); it must be installed and give exactly what the pure parser gives."""
    from pathlib import Path

    from ruamel.yaml import YAML
    from ruamel.yaml.main import CParser

    assert CParser is not None, "ruamel.yaml.clib is not installed (pyproject.toml's dependencies name it)"
    data = Path(__file__).resolve().parents[2] / "compiler" / "data"
    files = sorted(data.glob("*.yaml"))
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8")
        fast, pure = YAML(typ="safe").load(text), YAML(typ="safe", pure=True).load(text)
        assert repr(fast) == repr(pure), path.name  # repr: also the types (1 vs 1.0 vs True) and key order


def test_parsed_data_files_are_cached_under_their_hash(tmp_path, monkeypatch) -> None:
    """The catalog's YAML is parsed once and kept as JSON under the hash of its bytes (DTC_CACHE_DIR): a second
    read does not parse, gives exactly the same data, and a changed or corrupt file is parsed anew."""
    import compiler.catalog as cat

    monkeypatch.setenv(cat.CACHE_ENV, str(tmp_path))
    raw = b"a100:\n  hbm: 80 GB\n  n: 3\n  x: 1.5\n  flag: true\n  list: [1, 2.0, null]\n"
    first = cat._parse_yaml_cached("gpus.yaml", raw)
    cached = list((tmp_path / "data").glob("gpus-*.json"))
    assert len(cached) == 1
    parsed = []
    real_yaml = cat.YAML
    monkeypatch.setattr(cat, "YAML", lambda **kw: parsed.append(kw) or real_yaml(**kw))
    again = cat._parse_yaml_cached("gpus.yaml", raw)
    assert repr(again) == repr(first) and not parsed  # repr: also 1 vs 1.0 vs True
    changed = cat._parse_yaml_cached("gpus.yaml", raw.replace(b"n: 3", b"n: 4"))
    assert changed["a100"]["n"] == 4 and len(parsed) == 1
    cached[0].write_text("{not json")
    assert repr(cat._parse_yaml_cached("gpus.yaml", raw)) == repr(first) and len(parsed) == 2
    monkeypatch.setenv(cat.CACHE_ENV, "off")
    assert repr(cat._parse_yaml_cached("gpus.yaml", raw)) == repr(first) and len(parsed) == 3


def test_every_data_file_survives_the_json_cache() -> None:
    """What the cache keeps must read back exactly as the YAML (else it is not cached at all)."""
    import json
    from pathlib import Path

    from ruamel.yaml import YAML

    for path in sorted((Path(__file__).resolve().parents[2] / "compiler" / "data").glob("*.yaml")):
        data = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
        assert repr(json.loads(json.dumps(data))) == repr(data), path.name


def test_host_memory_is_a_reference_systems_node():
    # DGX datasheets' system memory (binary DIMM capacities), NVL72 trays' two Grace CPUs
    assert CATALOG.gpus["h100-sxm"].host_memory_bytes == 2 * 2**40
    assert CATALOG.gpus["a100-40gb"].host_memory_bytes == 2**40
    assert CATALOG.gpus["gb200"].host_memory_bytes == 960 * 2**30
    assert CATALOG.gpus["l40s"].host_memory_bytes == 0  # no reference system states it: not known


def test_host_memory_source_without_a_value_is_an_error():
    from compiler.catalog import _parse_gpu

    from pathlib import Path

    from ruamel.yaml import YAML

    raw = YAML(typ="safe").load((Path(__file__).resolve().parents[2] / "compiler/data/gpus.yaml").read_text())["l40s"]
    raw["sources"]["host_memory"] = "a datasheet (nvidia.com)"
    with pytest.raises(ValueError, match="host_memory"):
        _parse_gpu("l40s", raw)
