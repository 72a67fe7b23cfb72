"""The runtime's data reader/writer against megatron-core's own IndexedDataset, samples, blending."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from megatron_import import megatron_module

from compiler.runtime.data import (
    BLEND_PERIOD,
    BlendedSamples,
    DataFormatError,
    DataSource,
    IndexedDataset,
    IndexedDatasetWriter,
    StrideSamples,
    TokenSamples,
    blend_pattern,
    open_samples,
)


def _docs(seed=0, n=120, vocab=1000):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(1, 60))) for _ in range(n)]


def _write(prefix, docs, dtype=np.uint16):
    w = IndexedDatasetWriter(prefix, dtype)
    for d in docs:
        w.add_document(d)
    w.finalize()


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_reads_what_we_write_byte_for_byte(tmp_path, dtype):
    idx = megatron_module("megatron.core.datasets.indexed_dataset")
    docs = _docs()
    _write(tmp_path / "ours", docs, dtype)
    theirs = idx.IndexedDataset(str(tmp_path / "ours"))
    assert len(theirs) == len(docs)
    assert list(theirs.document_indices) == list(range(len(docs) + 1))
    for i, d in enumerate(docs):
        assert np.array_equal(theirs[i], d)
    # and megatron's own builder writes the same bytes
    builder = idx.IndexedDatasetBuilder(str(tmp_path / "mega.bin"), dtype=dtype)
    for d in docs:
        builder.add_document(torch.tensor(d), [len(d)])
    builder.finalize(str(tmp_path / "mega.idx"))
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"mega{ext}").read_bytes()
    ours = IndexedDataset(tmp_path / "mega")
    assert all(np.array_equal(ours[i], d) for i, d in enumerate(docs))


def test_bad_files_are_refused_clearly(tmp_path):
    with pytest.raises(DataFormatError, match="not found"):
        IndexedDataset(tmp_path / "missing")
    (tmp_path / "x.idx").write_bytes(b"NOTANIDX" + bytes(40))
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(DataFormatError, match="bad header"):
        IndexedDataset(tmp_path / "x")
    _write(tmp_path / "t", [[1, 2, 3]])
    with pytest.raises(DataFormatError, match="fewer than one sample"):
        TokenSamples(IndexedDataset(tmp_path / "t"), 8, 0)[0]


def test_samples_cover_the_stream_once_per_epoch_and_are_deterministic(tmp_path):
    docs = _docs(1)
    _write(tmp_path / "d", docs)
    seq = 16
    s = TokenSamples(IndexedDataset(tmp_path / "d"), seq, seed=5)
    total = sum(len(d) for d in docs)
    assert s.per_epoch == (total - 1) // seq
    rows = [s[g] for g in range(s.per_epoch)]
    assert all(r.shape == (seq + 1,) for r in rows)
    # the epoch's samples, put back in stream order, tile the shuffled document stream
    by_start = sorted(range(s.per_epoch), key=lambda w: int(s._perm[w]))
    stream = np.concatenate([docs[i] for i in s._order])
    for k, w in enumerate(by_start):
        assert np.array_equal(rows[w], stream[k * seq:k * seq + seq + 1])
    again = TokenSamples(IndexedDataset(tmp_path / "d"), seq, seed=5)
    assert all(np.array_equal(again[g], s[g]) for g in (0, 7, s.per_epoch + 3))  # pure function of (seed, g)
    other = TokenSamples(IndexedDataset(tmp_path / "d"), seq, seed=6)
    assert not np.array_equal(other[0], s[0])


def test_blend_follows_the_weights_in_every_period(tmp_path):
    which, nth = blend_pattern([0.5, 0.3, 0.2])
    counts = np.bincount(which, minlength=3)
    assert np.all(np.abs(counts - np.array([0.5, 0.3, 0.2]) * BLEND_PERIOD) <= 1)
    for d in range(3):  # each dataset's samples are taken in order
        assert np.array_equal(nth[which == d], np.arange(counts[d]))
    _write(tmp_path / "a", [[1] * 40] * 10)
    _write(tmp_path / "b", [[2] * 40] * 10)
    blended = open_samples([DataSource(str(tmp_path / "a"), 3.0), DataSource(str(tmp_path / "b"), 1.0)], 8, 0)
    assert isinstance(blended, BlendedSamples)
    firsts = [int(blended[g][0]) for g in range(2 * BLEND_PERIOD)]
    assert firsts.count(1) == 3 * firsts.count(2)


def test_vocabulary_overflow_is_caught(tmp_path):
    _write(tmp_path / "v", [[5, 6, 7, 900]] * 20)
    samples = open_samples([DataSource("v")], 8, 0, vocab_size=100, base_dir=tmp_path)
    with pytest.raises(DataFormatError, match="outside the model's vocabulary"):
        samples[0]


def test_synthetic_repeat():
    s = StrideSamples(50, 8, seed=1, repeat=4)
    assert np.array_equal(s[1], s[5]) and not np.array_equal(s[1], s[2])
    row = StrideSamples(50, 8, seed=1)[3]
    stride = (row[1] - row[0]) % 50
    assert np.array_equal((row[1:] - row[:-1]) % 50, np.full(8, stride))
