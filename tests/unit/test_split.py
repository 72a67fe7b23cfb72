"""The one pipeline split (compiler.split) is megatron-core 0.19.2's, and the costed split is the rendered one.

Three levels:
* known layouts (Llama 3 405B as Meta and NeMo ran it, ...) and the mechanisms' own rules;
* every layer count up to 128 and every pp x vpp up to 128: the cost model's stages, the Megatron
  renderer's flags and megatron-core's own get_num_layers_to_build / get_transformer_layer_offset
  (a TransformerConfig built from the rendered flags) agree rank by rank;
* Hypothesis (derandomized): the full flag path (megatron's argparse, validate_args,
  core_transformer_config_from_args) for default and pinned mechanisms, both ways: what
  compiler.split accepts Megatron builds identically, what it refuses Megatron refuses.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.costmodel.stages import stage_layers
from compiler.model import ModelShape
from compiler.targets.megatron.render import pipeline_flags
from compiler.split import (EVEN, PipelineSplit, SplitError, default_split, layer_split, layout_string,
                            megatron_split, parse_layout_string, split_problem)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.validators import megatron_check  # noqa: E402

MAX_CHUNKS = 128


def shape(num_layers: int) -> ModelShape:
    return ModelShape(num_layers=num_layers, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8,
                      num_kv_heads=8, vocab_size=128)


@pytest.mark.parametrize("layers,pp,vpp,mechanism,ranks", [
    (126, 16, 1, "account", (7,) + (8,) * 14 + (7,)),  # Llama 3 405B as Meta ran it (TP8 PP16)
    (126, 8, 8, "account", (15,) + (16,) * 6 + (15,)),  # NeMo's Llama 3.1 405B recipe: 128 units / 64 chunks
    (126, 16, 2, "account", (7,) + (8,) * 14 + (7,)),  # Meta's PP16 with interleaving
    (126, 8, 9, "layout", (15,) + (16,) * 6 + (15,)),
    (80, 8, 1, "even", (10,) * 8),
    (80, 8, 5, "even", (10,) * 8),
    (32, 2, 1, "even", (16, 16)),
    (61, 4, 1, "uneven", (14, 16, 16, 15)),
    (7, 2, 1, "account", (3, 4)),
    (4, 4, 1, "even", (1, 1, 1, 1)),
    (4, 6, 1, "account", (0, 1, 1, 1, 1, 0)),  # pp = layers + 2: embedding and loss stages of their own
    (5, 1, 1, "even", (5,)),
])
def test_known_splits(layers: int, pp: int, vpp: int, mechanism: str, ranks: tuple[int, ...]) -> None:
    split = default_split(layers, pp, vpp)
    assert split is not None and split.mechanism == mechanism
    got = megatron_split(layers, pp, vpp, split)
    assert got.rank_layers == ranks and sum(got.chunk_layers) == layers


@pytest.mark.parametrize("layers,pp,vpp", [(8, 1, 2), (8, 11, 1), (126, 8, 17), (5, 4, 2)])
def test_no_split(layers: int, pp: int, vpp: int) -> None:
    assert default_split(layers, pp, vpp) is None
    assert split_problem(layers, pp, vpp) is not None
    with pytest.raises(SplitError):
        layer_split(layers, pp, vpp)


def test_mechanism_rules() -> None:
    assert split_problem(126, 8, 1, EVEN) is not None  # 8 does not divide 126
    assert split_problem(126, 8, 9, PipelineSplit("uneven", first=9, last=9)) is None  # Megatron's 9 / 18 x 6 / 9
    assert megatron_split(126, 8, 9, PipelineSplit("uneven", first=9, last=9)).rank_layers == (9,) + (18,) * 6 + (9,)
    assert split_problem(126, 8, 9, PipelineSplit("uneven", first=10, last=8)) is not None  # not multiples of vpp
    assert split_problem(126, 8, 1, PipelineSplit("account", embedding=True)) is not None  # 127 units over 8
    assert split_problem(10, 2, 1, PipelineSplit("layout", chunks=(5, 4))) is not None  # 9 layers placed
    assert megatron_split(10, 2, 1, PipelineSplit("layout", chunks=(4, 6))).rank_layers == (4, 6)


@pytest.mark.parametrize("chunks", [(0,) + (1,) * 15 + (2,) * 55 + (1,), (3, 4), (20, 20, 20), (0, 2, 2, 0)])
def test_layout_string_round_trip(chunks: tuple[int, ...]) -> None:
    text = layout_string(chunks)
    assert parse_layout_string(text) == chunks
    megatron_check._load_megatron()
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    parsed = PipelineParallelLayerLayout.parse_str_to_list(text)  # megatron-core's own parser
    assert [row.count(LayerType.decoder) for row in parsed] == list(chunks)


def _config(num_layers: int, pp: int, vpp: int, flags: list[list[str]]):
    """A TransformerConfig for the rendered pipeline flags (the flag -> field names are
    core_transformer_config_from_args'; the full flag path is checked by the Hypothesis test)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw: dict = {}
    for flag in flags:
        name = flag[0]
        if name == "--num-virtual-stages-per-pipeline-rank":
            kw["virtual_pipeline_model_parallel_size"] = int(flag[1])
        elif name == "--decoder-first-pipeline-num-layers":
            kw["num_layers_in_first_pipeline_stage"] = int(flag[1])
        elif name == "--decoder-last-pipeline-num-layers":
            kw["num_layers_in_last_pipeline_stage"] = int(flag[1])
        elif name == "--account-for-embedding-in-pipeline-split":
            kw["account_for_embedding_in_pipeline_split"] = True
        elif name == "--account-for-loss-in-pipeline-split":
            kw["account_for_loss_in_pipeline_split"] = True
        elif name == "--pipeline-model-parallel-layout":
            kw["pipeline_model_parallel_layout"] = flag[1]
        else:
            assert name == "--pipeline-model-parallel-size" and int(flag[1]) == pp, flag
    return TransformerConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=8,
                             pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16, **kw)


def _assert_built(chunks: list[dict], split, pp: int, vpp: int) -> None:
    """megatron-core's chunks (model order) are exactly ``split``'s: layers, offsets, embedding, loss."""
    n = pp * vpp
    assert [(c["rank"], c["vstage"]) for c in chunks] == [(i % pp, i // pp) for i in range(n)]
    assert tuple(c["layers"] for c in chunks) == split.chunk_layers
    assert [c["offset"] for c in chunks] == [split.layers(i % pp, i // pp).start for i in range(n)]
    assert [c["embedding"] for c in chunks] == [i == split.embedding_chunk for i in range(n)]
    assert [c["loss"] for c in chunks] == [i == split.loss_chunk for i in range(n)]


def _assert_costed(split, pp: int, vpp: int) -> None:
    costed = stage_layers(shape(split.num_layers), pp, vpp, split.split)
    assert tuple(s.layers for s in costed) == split.rank_layers
    assert tuple(s.max_chunk_layers for s in costed) == tuple(max(split.rank_chunks(r)) for r in range(pp))
    assert [(s.first, s.last) for s in costed] == [(r == 0, r == pp - 1) for r in range(pp)]


@pytest.mark.slow  # every split of up to 128 layers through megatron-core's own code
def test_every_default_split_is_what_megatron_builds() -> None:
    """Every layer count up to 128, every pp x vpp up to 128: costed == rendered == megatron-core.

    Even, account and uneven splits go through a TransformerConfig and megatron-core's functions rank by
    rank; an explicit layout through megatron-core's own layout parser (its TransformerConfig path costs
    ~0.5 ms a layout: the Hypothesis test below runs it on a derandomized sample)."""
    megatron_check._load_megatron()
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    checked = 0
    for layers in range(1, 129):
        for pp in range(2, MAX_CHUNKS + 1):
            for vpp in range(1, MAX_CHUNKS // pp + 1):
                split = default_split(layers, pp, vpp)
                if pp * vpp > layers + 2:
                    assert split is None
                    continue
                assert split is not None, (layers, pp, vpp)
                built = megatron_split(layers, pp, vpp, split)
                _assert_costed(built, pp, vpp)
                flags = pipeline_flags(pp, vpp, split)
                if split.mechanism == "layout":
                    assert flags[-1][0] == "--pipeline-model-parallel-layout" and len(flags) == 2, flags
                    rows = PipelineParallelLayerLayout.parse_str_to_list(flags[-1][1])
                    assert tuple(row.count(LayerType.decoder) for row in rows) == built.chunk_layers
                    assert [LayerType.embedding in row for row in rows] == [c == 0 for c in range(len(rows))]
                    assert [LayerType.loss in row for row in rows] == [c == len(rows) - 1 for c in range(len(rows))]
                else:
                    _assert_built(megatron_check.config_layer_split(_config(layers, pp, vpp, flags)), built, pp, vpp)
                checked += 1
    assert checked == 30370


def _base_flags(num_layers: int, pp: int) -> list[str]:
    return ["--num-layers", str(num_layers), "--hidden-size", "64", "--num-attention-heads", "8",
            "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
            "--global-batch-size", str(pp), "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--bf16",
            "--tensor-model-parallel-size", "1"]


@st.composite
def pinned_splits(draw):
    pp = draw(st.integers(2, 32))
    vpp = draw(st.integers(1, MAX_CHUNKS // pp))
    layers = draw(st.integers(1, 130))
    kind = draw(st.sampled_from(("default", "even", "account", "uneven", "layout")))
    if kind == "default":
        return layers, pp, vpp, default_split(layers, pp, vpp)
    if kind == "even":
        return layers, pp, vpp, EVEN
    if kind == "account":
        e, l = draw(st.sampled_from(((True, True), (True, False), (False, True))))
        return layers, pp, vpp, PipelineSplit("account", embedding=e, loss=l)
    if kind == "uneven":
        first = draw(st.integers(0, layers)) * draw(st.sampled_from((1, vpp)))
        last = draw(st.integers(0 if first else 1, layers)) * draw(st.sampled_from((1, vpp)))
        return layers, pp, vpp, PipelineSplit("uneven", first=first, last=last)
    chunks = draw(st.lists(st.integers(0, 4), min_size=pp * vpp, max_size=pp * vpp))
    return sum(chunks) or 1, pp, vpp, PipelineSplit("layout", chunks=tuple(chunks) if sum(chunks) else
                                                    (1,) + (0,) * (pp * vpp - 1))


@settings(derandomize=True, max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pinned_splits())
def test_megatron_builds_what_dtc_accepts(case) -> None:
    layers, pp, vpp, split = case
    if split is None:
        assert pp * vpp > layers + 2
        return
    flags = _base_flags(layers, pp) + [tok for flag in pipeline_flags(pp, vpp, split) for tok in flag]
    result = megatron_check.megatron_layer_split(flags, world_size=pp)
    try:
        built = megatron_split(layers, pp, vpp, split)
    except SplitError as exc:
        if "would hold no layer" in str(exc):
            return  # dtc's own rule (an empty chunk cannot be costed); Megatron would build it
        assert result["errors"], f"dtc refuses {split} ({exc}) but Megatron builds it: {flags}"
        return
    assert not result["errors"], f"dtc accepts {split} but Megatron refuses: {result['errors']}"
    _assert_built(result["chunks"], built, pp, vpp)
    _assert_costed(built, pp, vpp)
