"""Training data for the torch trainers: Megatron's indexed format, read with numpy, and blending.

One prepared dataset serves every target. ``dtc data prepare`` writes Megatron-LM's indexed format
(megatron/core/datasets/indexed_dataset.py, format version 1), which Megatron reads natively and
which this module reads without a GPU:

- ``PREFIX.bin``: the tokens of every sequence back to back, in the dtype the index names;
- ``PREFIX.idx``: ``b"MMIDIDX\\x00\\x00"``, version ``<Q`` 1, dtype code ``<B``
  (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), the sequence count
  ``<Q``, the document count ``<Q`` (sequences + 1 for GPT data: a leading 0), then the sequence
  lengths (int32), the byte offset of each sequence (int64) and the document boundaries (int64:
  the sequence index where each document ends, after a leading 0).

Samples: each epoch visits the documents in a seeded random order, concatenated into one token
stream that is cut into samples of ``seq_len + 1`` tokens, each starting ``seq_len`` tokens after
the previous one (the last token of a sample is the first of the next, as in Megatron's
GPTDataset); the samples of an epoch are then shuffled. Sample ``g`` of the run is a pure function
of ``(seed, g)``, so the data position is one integer (samples consumed) and a resumed run, on any
layout, reads exactly the samples an uninterrupted run would.

Blending (several datasets with weights) follows Megatron's rule (``build_blending_indices`` in
megatron/core/datasets/helpers.cpp: the next sample comes from the dataset furthest behind its
share), applied over periods of ``BLEND_PERIOD`` samples so that any sample is found in O(1):
within every period each dataset gets its share to within one sample.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from .config import DataSource

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}
CODE_OF = {np.dtype(v).name: k for k, v in DTYPE_CODES.items()}
BLEND_PERIOD = 4096


class DataFormatError(ValueError):
    """A file is not a dataset in Megatron's indexed format."""


def token_dtype(vocab_size: int) -> type:
    """Megatron's choice (``DType.optimal_dtype``): uint16 below 65500 tokens, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


# ------------------------------------------------------------------------------------------- writing
class IndexedDatasetWriter:
    """Writes PREFIX.bin / PREFIX.idx; nothing appears under the final names until ``finalize``."""

    def __init__(self, prefix: str | Path, dtype: type = np.uint16):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype.name not in CODE_OF:
            raise ValueError(f"token dtype {self.dtype} is not one Megatron's index can name")
        self._bin_tmp = self.prefix.with_name(self.prefix.name + ".bin.tmp")
        self._bin = open(self._bin_tmp, "wb")
        self.lengths: list[int] = []
        self.doc_ends: list[int] = [0]
        self.num_tokens = 0

    def add_document(self, tokens: Sequence[int] | np.ndarray) -> None:
        """One document as one sequence (GPT data)."""
        array = np.asarray(tokens)
        if array.ndim != 1:
            raise ValueError("a document is a 1-D sequence of token ids")
        limit = int(np.iinfo(self.dtype.type).max) if self.dtype.kind in "iu" else 2 ** 53  # type: ignore[type-var]
        if array.size and (array.min() < 0 or array.max() > limit):
            raise ValueError(f"token ids outside {self.dtype} ({array.min()}..{array.max()})")
        self._bin.write(array.astype(self.dtype, copy=False).tobytes(order="C"))
        self.lengths.append(int(array.size))
        self.doc_ends.append(len(self.lengths))
        self.num_tokens += int(array.size)

    def finalize(self) -> None:
        self._bin.close()
        lengths = np.asarray(self.lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        if len(lengths) > 1:
            pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * self.dtype.itemsize
        idx_tmp = self.prefix.with_name(self.prefix.name + ".idx.tmp")
        with open(idx_tmp, "wb") as f:
            f.write(INDEX_HEADER)
            f.write(struct.pack("<Q", INDEX_VERSION))
            f.write(struct.pack("<B", CODE_OF[self.dtype.name]))
            f.write(struct.pack("<Q", len(lengths)))
            f.write(struct.pack("<Q", len(self.doc_ends)))
            f.write(lengths.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(np.asarray(self.doc_ends, dtype=np.int64).tobytes(order="C"))
        os.replace(self._bin_tmp, self.prefix.with_name(self.prefix.name + ".bin"))
        os.replace(idx_tmp, self.prefix.with_name(self.prefix.name + ".idx"))

    def abort(self) -> None:
        self._bin.close()
        self._bin_tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------- reading
class IndexedDataset:
    """PREFIX.idx / PREFIX.bin, memory-mapped; ``get(i, offset, length)`` as Megatron's reader."""

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        idx_path = self.prefix.with_name(self.prefix.name + ".idx")
        bin_path = self.prefix.with_name(self.prefix.name + ".bin")
        for path in (idx_path, bin_path):
            if not path.is_file():
                raise DataFormatError(f"{path}: not found (a dataset prefix names PREFIX.bin and PREFIX.idx; "
                                      "write them with `dtc data prepare`)")
        with open(idx_path, "rb") as f:
            if f.read(9) != INDEX_HEADER:
                raise DataFormatError(f"{idx_path}: not a Megatron indexed dataset index (bad header)")
            (version,) = struct.unpack("<Q", f.read(8))
            if version != INDEX_VERSION:
                raise DataFormatError(f"{idx_path}: index version {version}, expected {INDEX_VERSION}")
            (code,) = struct.unpack("<B", f.read(1))
            if code not in DTYPE_CODES:
                raise DataFormatError(f"{idx_path}: unknown dtype code {code}")
            self.dtype = np.dtype(DTYPE_CODES[code])
            (self.sequence_count,) = struct.unpack("<Q", f.read(8))
            (self.document_count,) = struct.unpack("<Q", f.read(8))
            offset = f.tell()
        index = np.memmap(idx_path, mode="r", order="C")
        self.sequence_lengths = np.frombuffer(index, dtype=np.int32, count=self.sequence_count, offset=offset)
        offset += self.sequence_lengths.nbytes
        self.sequence_pointers = np.frombuffer(index, dtype=np.int64, count=self.sequence_count, offset=offset)
        offset += self.sequence_pointers.nbytes
        self.document_indices = np.frombuffer(index, dtype=np.int64, count=self.document_count, offset=offset)
        self._bin = np.memmap(bin_path, mode="r", order="C")
        expected = int(self.sequence_lengths.astype(np.int64).sum()) * self.dtype.itemsize
        if self._bin.size != expected:
            raise DataFormatError(f"{bin_path}: {self._bin.size} bytes, the index describes {expected}")

    def __len__(self) -> int:
        return self.sequence_count

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.astype(np.int64).sum())

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        if length is None:
            length = int(self.sequence_lengths[idx]) - offset
        pointer = int(self.sequence_pointers[idx]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=pointer)

    def __getitem__(self, idx: int) -> np.ndarray:
        return self.get(idx)


# ------------------------------------------------------------------------------------------- samples
class TokenSamples:
    """Fixed-length samples (``seq_len + 1`` tokens) over one indexed dataset (module docstring)."""

    def __init__(self, dataset: IndexedDataset, seq_len: int, seed: int):
        self.dataset, self.seq_len, self.seed = dataset, seq_len, seed
        self.total_tokens = dataset.num_tokens
        self.per_epoch = (self.total_tokens - 1) // seq_len
        if self.per_epoch < 1:
            raise DataFormatError(f"{dataset.prefix}: {self.total_tokens} tokens, fewer than one sample of "
                                  f"{seq_len + 1}")
        self._epoch: int | None = None
        self._cum: np.ndarray = np.zeros(0)
        self._order: np.ndarray = np.zeros(0)
        self._perm: np.ndarray = np.zeros(0)

    def _load_epoch(self, epoch: int) -> None:
        if self._epoch == epoch:
            return
        rng = np.random.default_rng([self.seed, epoch])
        self._order = rng.permutation(len(self.dataset))
        lengths = self.dataset.sequence_lengths[self._order].astype(np.int64)
        self._cum = np.concatenate(([0], np.cumsum(lengths)))
        self._perm = rng.permutation(self.per_epoch)
        self._epoch = epoch

    def __getitem__(self, g: int) -> np.ndarray:
        epoch, within = divmod(int(g), self.per_epoch)
        self._load_epoch(epoch)
        start = int(self._perm[within]) * self.seq_len
        need, out = self.seq_len + 1, []
        doc = int(np.searchsorted(self._cum, start, side="right")) - 1
        offset = start - int(self._cum[doc])
        while need > 0:
            seq = int(self._order[doc])
            take = min(need, int(self.dataset.sequence_lengths[seq]) - offset)
            if take > 0:
                out.append(self.dataset.get(seq, offset, take))
                need -= take
            doc, offset = doc + 1, 0
        return np.concatenate(out).astype(np.int64)


def blend_pattern(weights: Sequence[float], period: int = BLEND_PERIOD) -> tuple[np.ndarray, np.ndarray]:
    """(dataset of each slot, that dataset's running count at the slot) for one period, by
    Megatron's greedy rule; and the per-dataset counts per period are ``np.bincount`` of the first."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    which = np.zeros(period, dtype=np.int64)
    nth = np.zeros(period, dtype=np.int64)
    counts = np.zeros(len(w), dtype=np.int64)
    for i in range(period):
        error = w * max(i, 1) - counts
        d = int(np.argmax(error))
        which[i], nth[i] = d, counts[d]
        counts[d] += 1
    return which, nth


class BlendedSamples:
    """Samples drawn from several ``TokenSamples`` in proportion to their weights."""

    def __init__(self, sources: Sequence[TokenSamples], weights: Sequence[float], period: int = BLEND_PERIOD):
        if len(sources) != len(weights) or not sources:
            raise ValueError("one weight per dataset")
        if any(w <= 0 for w in weights):
            raise ValueError("blend weights must be positive")
        self.sources = list(sources)
        self.period = period
        self.which, self.nth = blend_pattern(weights, period)
        self.per_period = np.bincount(self.which, minlength=len(sources))

    def __getitem__(self, g: int) -> np.ndarray:
        block, slot = divmod(int(g), self.period)
        d = int(self.which[slot])
        return self.sources[d][block * int(self.per_period[d]) + int(self.nth[slot])]


class StrideSamples:
    """The learnable synthetic task (``data: synthetic``): token[t+1] = (token[t] + stride) mod vocab,
    start and stride (1-3) drawn per sample from (seed, g). With ``repeat`` > 0 sample g is sample
    ``g mod repeat`` (one fixed global batch, repeated: the loss falls within a few steps)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, repeat: int = 0):
        self.vocab_size, self.seq_len, self.seed, self.repeat = vocab_size, seq_len, seed, repeat

    def __getitem__(self, g: int) -> np.ndarray:
        if self.repeat:
            g = int(g) % self.repeat
        rng = np.random.default_rng([self.seed, int(g)])
        start = int(rng.integers(0, self.vocab_size))
        stride = int(rng.integers(1, 4))
        return (start + stride * np.arange(self.seq_len + 1, dtype=np.int64)) % self.vocab_size


def open_samples(sources: Sequence[DataSource], seq_len: int, seed: int, *, vocab_size: int | None = None,
                 base_dir: str | Path | None = None):
    """The sample sequence of a run: one dataset, or a blend. Relative prefixes are read from
    ``base_dir``. A token id >= ``vocab_size`` is an error found on the first read of it."""
    opened = []
    for i, source in enumerate(sources):
        prefix = Path(source.prefix)
        if base_dir is not None and not prefix.is_absolute():
            prefix = Path(base_dir) / prefix
        opened.append(TokenSamples(IndexedDataset(prefix), seq_len, seed * 1_000_003 + i))
    samples = opened[0] if len(opened) == 1 else BlendedSamples(opened, [s.weight for s in sources])
    return _Checked(samples, vocab_size) if vocab_size else samples


class _Checked:
    def __init__(self, samples, vocab_size: int):
        self.samples, self.vocab_size = samples, vocab_size

    def __getitem__(self, g: int) -> np.ndarray:
        out = self.samples[g]
        if out.size and int(out.max()) >= self.vocab_size:
            raise DataFormatError(f"token id {int(out.max())} in sample {g} is outside the model's vocabulary "
                                  f"({self.vocab_size}); was the data prepared with another tokenizer?")
        return out


def global_batch_indices(step: int, *, dp_rank: int, dp_size: int, micro_batch: int, grad_accum: int) -> range:
    """The run-wide sample indices of optimizer step ``step`` (0-based) for one data-parallel rank:
    consecutive blocks of micro_batch x grad_accum samples per rank, ranks in order."""
    per_rank = micro_batch * grad_accum
    start = step * per_rank * dp_size + dp_rank * per_rank
    return range(start, start + per_rank)


def batch_arrays(samples, indices: range) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (len(indices), seq_len), from samples of seq_len + 1 tokens."""
    rows = np.stack([samples[g] for g in indices])
    return rows[:, :-1], rows[:, 1:]


__all__ = ["IndexedDataset", "IndexedDatasetWriter", "TokenSamples", "BlendedSamples", "StrideSamples",
           "DataSource", "DataFormatError", "open_samples", "global_batch_indices", "batch_arrays",
           "blend_pattern", "token_dtype", "BLEND_PERIOD"]
