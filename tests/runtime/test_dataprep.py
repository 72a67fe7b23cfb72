"""`dtc data prepare`: every input format and tokenizer kind, megatron-core reading the result, errors."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from helpers import run_cli
from megatron_import import megatron_module

from compiler.dataprep import load_tokenizer, prepare, read_metadata
from compiler.runtime.data import IndexedDataset

DOCS = ["the cat sat on the mat .", "a dog ran far away\nand back again .", "birds sing at dawn ."]


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("hf")
    (folder / "train.txt").write_text("\n".join(DOCS * 50))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(folder / "train.txt")], trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "</s>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return folder, tok


def _decode_docs(prefix, tok, eod):
    data = IndexedDataset(prefix)
    out = []
    for i in range(len(data)):
        ids = data[i].tolist()
        assert ids[-1] == eod
        out.append(tok.decode(ids[:-1]))
    return out


def test_txt_jsonl_and_parquet_inputs_give_the_same_dataset(tmp_path, hf_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, tok = hf_tokenizer
    (tmp_path / "a.txt").write_text("\n\n".join(DOCS) + "\n")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    pq.write_table(pa.table({"content": DOCS}), tmp_path / "a.parquet")
    tokenizer = load_tokenizer(folder)
    assert tokenizer.kind == "huggingface" and tokenizer.eod_id == tok.token_to_id("</s>")
    results = [
        prepare([tmp_path / "a.txt"], tokenizer, tmp_path / "txt", show_progress=False),
        prepare([tmp_path / "a.jsonl"], tokenizer, tmp_path / "jsonl", show_progress=False),
        prepare([tmp_path / "a.parquet"], tokenizer, tmp_path / "pq", text_key="content", show_progress=False),
    ]
    for r in results:
        assert r.documents == 3 and r.dtype == "uint16"
    bins = {(tmp_path / f"{name}.bin").read_bytes() for name in ("txt", "jsonl", "pq")}
    assert len(bins) == 1
    expected = [tok.decode(tok.encode(d).ids) for d in DOCS]
    assert _decode_docs(tmp_path / "txt", tok, tokenizer.eod_id) == expected
    assert read_metadata(tmp_path / "txt")["tokens"] == results[0].tokens
    theirs = megatron_module("megatron.core.datasets.indexed_dataset").IndexedDataset(str(tmp_path / "txt"))
    assert [list(theirs[i]) for i in range(3)] == [list(IndexedDataset(tmp_path / "txt")[i]) for i in range(3)]


def test_sentencepiece_and_tiktoken_models(tmp_path):
    import sentencepiece as spm

    (tmp_path / "train.txt").write_text("\n".join(DOCS * 40))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "train.txt"), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=40, model_type="bpe", minloglevel=2)
    sp = load_tokenizer(tmp_path / "sp.model")
    assert sp.kind == "sentencepiece" and sp.eod_id == 2  # sentencepiece's default </s>
    # a tiktoken BPE file: one "base64(token) rank" line per token (here: the 256 bytes)
    (tmp_path / "bytes.tiktoken").write_text(
        "".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    tk = load_tokenizer(tmp_path / "bytes.tiktoken")
    assert tk.kind == "tiktoken" and tk.vocab_size == 256 + 256 and tk.eod_id == 257
    (tmp_path / "in.txt").write_text("\n\n".join(DOCS))
    for name, tokenizer in (("sp", sp), ("tk", tk)):
        result = prepare([tmp_path / "in.txt"], tokenizer, tmp_path / name, show_progress=False)
        assert result.documents == 3
    data = IndexedDataset(tmp_path / "tk")
    assert bytes(data[0][:-1].tolist()).decode() == DOCS[0]  # byte-level: the ids are the bytes


def test_cli_errors_name_the_place(tmp_path, hf_tokenizer):
    folder, _ = hf_tokenizer
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": 3}\n')
    result = run_cli(["data", "prepare", str(tmp_path / "bad.jsonl"), "--tokenizer", str(folder),
                      "-o", str(tmp_path / "out")], exit_code=2)
    assert "bad.jsonl:2:1: error: the 'text' field is not a string" in result.stderr
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    result = run_cli(["data", "prepare", str(tmp_path / "broken.jsonl"), "--tokenizer", str(folder),
                      "-o", str(tmp_path / "out")], exit_code=2)
    assert "broken.jsonl:2:" in result.stderr and "not a JSON object" in result.stderr
    assert not (tmp_path / "out.bin").exists() and not (tmp_path / "out.bin.tmp").exists()
    result = run_cli(["data", "prepare", str(tmp_path / "bad.jsonl"), "--tokenizer", str(tmp_path / "none"),
                      "-o", str(tmp_path / "out")], exit_code=2)
    assert "tokenizer" in result.stderr and "not found" in result.stderr


def test_cli_json_and_large_vocabularies_use_int32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)}
    vocab["<unk>"], vocab["</s>"] = 70000, 70001
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in.txt").write_text("w1 w69999 w5\n\nw2\n")
    out = json.loads(run_cli(["data", "prepare", str(tmp_path / "in.txt"), "--tokenizer",
                              str(tmp_path / "tokenizer.json"), "-o", str(tmp_path / "big"), "--json"]).stdout)
    assert out["dtype"] == "int32" and out["documents"] == 2 and out["eod_id"] == 70001
    assert np.array_equal(IndexedDataset(tmp_path / "big")[0], [1, 69999, 5, 70001])
