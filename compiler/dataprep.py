"""``dtc data prepare``: tokenize text, JSONL or Parquet into Megatron's indexed format.

One prepared dataset serves every target: Megatron-LM reads ``PREFIX.bin``/``PREFIX.idx`` natively
(``--data-path PREFIX``), and the FSDP2 and DeepSpeed trainers read the same files with numpy
(compiler/runtime/data.py). Each document becomes one sequence followed by the tokenizer's
end-of-document token (Megatron's ``preprocess_data.py --append-eod``); token ids are stored as
uint16 below 65,500 tokens, else int32 (Megatron's ``DType.optimal_dtype``). Beside them,
``PREFIX.dtc.json`` records the tokenizer, its vocabulary size and end-of-document id, and the
counts (what the spec's ``data:`` section and the plan check against).

Tokenizers (local files only, nothing is downloaded):

- a Hugging Face tokenizer folder (``tokenizer.json``, with ``tokenizer_config.json`` naming the
  EOS token) or a ``tokenizer.json`` file, through the ``tokenizers`` library;
- a SentencePiece ``.model`` file, through ``sentencepiece``;
- a tiktoken BPE file (``.tiktoken``, or Llama 3's ``tokenizer.model``), through ``tiktoken`` with
  Llama 3's split pattern and special tokens (``<|begin_of_text|>`` = n, ``<|end_of_text|>`` = n+1,
  256 reserved in all, as Meta's llama3 ``tokenizer.py``).

Inputs: ``.txt`` (documents separated by blank lines, or one per file / per line), ``.jsonl`` /
``.json`` (one JSON object per line, text under ``--text-key``), ``.parquet`` (a text column).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from compiler.errors import Diagnostic, DtcError, Location

TXT_SPLITS = ("paragraph", "line", "file")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_NUM_RESERVED = 256
_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")


class DataPrepError(DtcError):
    """Bad input to ``dtc data prepare``."""


@dataclass(frozen=True)
class Tokenizer:
    kind: str  # huggingface | sentencepiece | tiktoken
    path: str
    vocab_size: int
    eod_id: int
    encode_batch: Callable[[list[str]], list[list[int]]]


@dataclass(frozen=True)
class PreparedDataset:
    prefix: str
    documents: int
    tokens: int
    vocab_size: int
    eod_id: int
    dtype: str
    tokenizer_kind: str
    tokenizer_path: str
    inputs: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _error(summary: str, path: str | Path | None = None, line: int | None = None, column: int | None = None,
           hint: str = "") -> DataPrepError:
    loc = Location(str(path), line, column) if path is not None else None
    return DataPrepError(Diagnostic(summary=summary, location=loc, hint=hint))


# ------------------------------------------------------------------------------------------- tokenizers
def _hf_eos(folder: Path, tok) -> int | None:
    config = folder / "tokenizer_config.json"
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and tok.token_to_id(eos) is not None:
            return tok.token_to_id(eos)
    for name in _EOS_NAMES:
        if tok.token_to_id(name) is not None:
            return tok.token_to_id(name)
    return None


def load_tokenizer(path: str | Path, eod_token: str | None = None) -> Tokenizer:
    """The tokenizer at ``path`` (see the module docstring for the kinds)."""
    path = Path(path)
    if not path.exists():
        raise _error(f"tokenizer {path} not found", hint="give a Hugging Face tokenizer folder, a tokenizer.json, "
                     "a SentencePiece .model or a tiktoken file")
    if path.is_dir() or path.name.endswith(".json"):
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise _error(f"{path} has no tokenizer.json", path,
                         hint="save it with tokenizers' Tokenizer.save or transformers' save_pretrained")
        from tokenizers import Tokenizer as HFTokenizer

        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as exc:  # noqa: BLE001 - the library's own parse errors
            raise _error(f"cannot read {file}: {exc}", file) from None
        eod = tok.token_to_id(eod_token) if eod_token else _hf_eos(file.parent, tok)
        if eod is None:
            raise _error(f"{file}: no end-of-document token found", file,
                         hint="name it with --eod-token (e.g. '<|endoftext|>')")
        return Tokenizer("huggingface", str(path), tok.get_vocab_size(with_added_tokens=True), eod,
                         lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)])
    head = path.read_bytes()[:64]
    if path.suffix == ".model" and not _looks_like_tiktoken(head):
        import sentencepiece as spm

        try:
            sp = spm.SentencePieceProcessor(model_file=str(path))
        except Exception as exc:  # noqa: BLE001
            raise _error(f"cannot read the SentencePiece model {path}: {exc}", path) from None
        eod = sp.piece_to_id(eod_token) if eod_token else sp.eos_id()
        if eod is None or eod < 0:
            raise _error(f"{path}: the SentencePiece model has no EOS id", path, hint="name one with --eod-token")
        return Tokenizer("sentencepiece", str(path), sp.get_piece_size(), eod,
                         lambda texts: [list(ids) for ids in sp.encode(texts)])
    return _tiktoken(path, eod_token)


def _looks_like_tiktoken(head: bytes) -> bool:
    first = head.split(b"\n", 1)[0].split(b" ")
    return len(first) == 2 and first[1].strip().isdigit()


def _tiktoken(path: Path, eod_token: str | None) -> Tokenizer:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    try:
        ranks = load_tiktoken_bpe(str(path))
    except Exception as exc:  # noqa: BLE001
        raise _error(f"cannot read {path} as a tiktoken BPE file: {exc}", path,
                     hint="a tiktoken file has one 'base64-token rank' pair per line") from None
    n = len(ranks)
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>"
                                                           for i in range(LLAMA3_NUM_RESERVED - 2)]
    special_ids = {name: n + i for i, name in enumerate(specials)}
    enc = tiktoken.Encoding(name=path.stem, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                            special_tokens=special_ids)
    eod = special_ids.get(eod_token or "<|end_of_text|>")
    if eod is None:
        raise _error(f"{path}: unknown special token {eod_token!r}", path)
    return Tokenizer("tiktoken", str(path), n + LLAMA3_NUM_RESERVED, eod,
                     lambda texts: enc.encode_ordinary_batch(texts))


# ------------------------------------------------------------------------------------------- inputs
def input_size(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    return path.stat().st_size


def iter_documents(path: Path, *, text_key: str = "text", txt_split: str = "paragraph",
                   progress: Callable[[int], None] = lambda n: None) -> Iterator[str]:
    """The documents of one input file; ``progress(n)`` is told bytes (rows for Parquet) read."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet(path, text_key, progress)
    elif suffix in (".jsonl", ".json", ".ndjson"):
        yield from _jsonl(path, text_key, progress)
    elif suffix in (".txt", ".text", ".md", ""):
        yield from _text(path, txt_split, progress)
    else:
        raise _error(f"{path}: cannot tell the format from the extension {suffix!r}", path,
                     hint="use .txt, .jsonl or .parquet")


def _text(path: Path, split: str, progress) -> Iterator[str]:
    if split == "file":
        text = path.read_text(encoding="utf-8", errors="replace")
        progress(len(text.encode()))
        if text.strip():
            yield text
        return
    para: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            progress(len(line.encode()))
            if split == "line":
                if line.strip():
                    yield line.rstrip("\n")
                continue
            if line.strip():
                para.append(line)
            elif para:
                yield "".join(para).rstrip("\n")
                para = []
    if para:
        yield "".join(para).rstrip("\n")


def _jsonl(path: Path, key: str, progress) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            progress(len(line.encode()))
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _error(f"not a JSON object: {exc.msg}", path, number, exc.colno,
                             hint="JSONL has one JSON object per line") from None
            if not isinstance(record, dict) or key not in record:
                raise _error(f"no {key!r} field in this record", path, number, 1,
                             hint="name the text field with --text-key")
            if not isinstance(record[key], str):
                raise _error(f"the {key!r} field is not a string", path, number, 1)
            yield record[key]


def _parquet(path: Path, key: str, progress) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001
        raise _error(f"cannot read Parquet: {exc}", path) from None
    if key not in file.schema_arrow.names:
        raise _error(f"no column {key!r} (columns: {', '.join(file.schema_arrow.names)})", path,
                     hint="name the text column with --text-key")
    for batch in file.iter_batches(columns=[key], batch_size=1024):
        values = batch.column(0).to_pylist()
        progress(len(values))
        for value in values:
            if value:
                yield str(value)


# ------------------------------------------------------------------------------------------- prepare
def _progress_bar(total: int, unit: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, unit_scale=True, desc="tokenizing", dynamic_ncols=True)


def prepare(inputs: Sequence[str | Path], tokenizer: Tokenizer, output_prefix: str | Path, *,
            text_key: str = "text", txt_split: str = "paragraph", append_eod: bool = True, batch_size: int = 512,
            show_progress: bool = True) -> PreparedDataset:
    """Tokenize every document of ``inputs`` into OUTPUT_PREFIX.bin/.idx (+ .dtc.json)."""
    from compiler.runtime.data import IndexedDatasetWriter, token_dtype

    paths = [Path(p) for p in inputs]
    for p in paths:
        if not p.is_file():
            raise _error(f"input {p} not found", hint="give text, JSONL or Parquet files")
    if txt_split not in TXT_SPLITS:
        raise _error(f"--txt-split must be one of {', '.join(TXT_SPLITS)}")
    prefix = Path(output_prefix)
    if not prefix.parent.is_dir():
        raise _error(f"output folder {prefix.parent} does not exist")
    dtype = token_dtype(tokenizer.vocab_size)
    writer = IndexedDatasetWriter(prefix, dtype)
    parquet = any(p.suffix == ".parquet" for p in paths)
    bar = _progress_bar(sum(input_size(p) for p in paths), "rows" if parquet else "B", show_progress)
    documents = 0

    def flush(batch: list[str]) -> None:
        nonlocal documents
        for ids in tokenizer.encode_batch(batch):
            writer.add_document(list(ids) + ([tokenizer.eod_id] if append_eod else []))
            documents += 1

    try:
        for path in paths:
            batch: list[str] = []
            for text in iter_documents(path, text_key=text_key, txt_split=txt_split,
                                       progress=(bar.update if bar is not None else lambda n: None)):
                batch.append(text)
                if len(batch) >= batch_size:
                    flush(batch)
                    batch = []
            if batch:
                flush(batch)
        if documents == 0:
            raise _error("the inputs hold no documents", hint="check --text-key and --txt-split")
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
    result = PreparedDataset(prefix=str(prefix), documents=documents, tokens=writer.num_tokens,
                             vocab_size=tokenizer.vocab_size, eod_id=tokenizer.eod_id, dtype=dtype.__name__,
                             tokenizer_kind=tokenizer.kind, tokenizer_path=str(Path(tokenizer.path).resolve()),
                             inputs=tuple(str(p.resolve()) for p in paths))
    meta = prefix.with_name(prefix.name + ".dtc.json")
    tmp = meta.with_name(meta.name + ".tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, meta)
    return result


def read_metadata(prefix: str | Path) -> dict | None:
    """PREFIX.dtc.json written by ``prepare`` (None for data prepared by other tools)."""
    meta = Path(prefix).with_name(Path(prefix).name + ".dtc.json")
    return json.loads(meta.read_text()) if meta.is_file() else None


__all__ = ["prepare", "load_tokenizer", "iter_documents", "read_metadata", "Tokenizer", "PreparedDataset",
           "DataPrepError", "TXT_SPLITS"]
