"""Megatron's pipeline split of the decoder layers: the only one in dtc.

megatron-core 0.19.2 cuts the ``num_layers`` decoder layers into ``pp x vpp`` chunks in model
order; chunk ``c`` runs on pipeline rank ``c % pp`` as its virtual stage ``c // pp``
(``transformer_block.get_num_layers_to_build``, ``transformer_layer.get_transformer_layer_offset``).
The embedding is always in chunk 0 and the loss (output layer) in the last chunk. How many
layers each chunk gets is chosen by one of four mechanisms, each a set of pretrain_gpt.py flags:

* ``even``: no flag. Every chunk gets ``num_layers / (pp x vpp)`` layers (which must divide).
* ``account``: ``--account-for-embedding-in-pipeline-split`` and/or
  ``--account-for-loss-in-pipeline-split``: the embedding (loss) counts as one layer, so
  ``num_layers + 1 (+1)`` units divide evenly over the chunks and the first (last) chunk builds
  one decoder layer less (``transformer_config.py`` post-init, "account_for_*").
* ``uneven``: ``--decoder-first-pipeline-num-layers F`` / ``--decoder-last-pipeline-num-layers L``:
  the first (last) rank holds F (L) layers, the ranks between share the rest evenly; every
  rank's count must be a multiple of vpp (``transformer_config.py`` "Uneven PP").
* ``layout``: ``--pipeline-model-parallel-layout`` (``PipelineParallelLayerLayout``): any count
  per chunk, written as a string such as ``Et|(tt|)*62,tL``.

``megatron_split(num_layers, pp, vpp, split)`` is what Megatron builds for a mechanism (or why it
refuses); ``default_split(num_layers, pp, vpp)`` is the mechanism dtc uses when none is pinned:
the most balanced split Megatron can build. Balance is measured as Megatron's
``--account-for-*`` flags measure it: a decoder layer, the embedding and the loss are one unit
each. The most balanced split minimises the largest rank's units, then the largest chunk's
(``ceil((L + 2) / pp)`` and ``ceil((L + 2) / (pp x vpp))`` are always reachable with an explicit
layout); among the mechanisms that reach both, the simplest flags win (even, account, uneven,
layout). NeMo's Llama 3.1 405B recipe (126 layers, pp 8 x vpp 8: 128 units / 64 chunks = 2 each)
is ``account`` with both flags; Meta's TP8 PP16 (126 layers: 7, 8 x 14, 7) is ``account`` too.
An explicit layout gives the extra units to the last chunks (the later ranks keep fewer
micro-batches in flight, so they are the ones with memory to spare).

The cost model's per-stage layers, the solver's candidates and rules, the Megatron renderer's
flags and the FSDP2/DeepSpeed pipeline trainers all read this module;
tests/unit/test_split.py checks it against megatron-core's own functions, rank by rank.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

Mechanism = Literal["even", "account", "uneven", "layout"]
MECHANISMS: tuple[Mechanism, ...] = ("even", "account", "uneven", "layout")  # simplest first


# every flag PipelineSplit.megatron_flags can emit (a reduced model drops them: dtc smoke splits its few layers evenly)
SPLIT_FLAGS = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
               "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
               "--pipeline-model-parallel-layout")


@dataclass(frozen=True)
class PipelineSplit:
    """A Megatron split mechanism and its parameters: what a layout records and the renderer emits.

    ``first``/``last`` (uneven) are layers per rank, 0 when the flag is not given; ``embedding``/
    ``loss`` (account) are the two flags; ``chunks`` (layout) are the decoder layers of every
    chunk in model order (embedding in the first, loss in the last)."""

    mechanism: Mechanism = "even"
    first: int = 0
    last: int = 0
    embedding: bool = False
    loss: bool = False
    chunks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        m = self.mechanism
        assert m in MECHANISMS, f"unknown split mechanism {m!r}"
        assert m == "uneven" or self.first == self.last == 0, "first/last belong to the uneven mechanism"
        assert m == "account" or not (self.embedding or self.loss), "embedding/loss belong to the account mechanism"
        assert m == "layout" or not self.chunks, "chunks belong to the layout mechanism"
        object.__setattr__(self, "chunks", tuple(self.chunks))

    def megatron_flags(self) -> list[list[str]]:
        """The pretrain_gpt.py flags that select this split (besides --pipeline-model-parallel-size
        and, except for an explicit layout, --num-virtual-stages-per-pipeline-rank)."""
        if self.mechanism == "account":
            return ([["--account-for-embedding-in-pipeline-split"]] if self.embedding else []) + \
                   ([["--account-for-loss-in-pipeline-split"]] if self.loss else [])
        if self.mechanism == "uneven":
            return ([["--decoder-first-pipeline-num-layers", str(self.first)]] if self.first else []) + \
                   ([["--decoder-last-pipeline-num-layers", str(self.last)]] if self.last else [])
        if self.mechanism == "layout":
            return [["--pipeline-model-parallel-layout", layout_string(self.chunks)]]
        return []

    def describe(self) -> str:
        """One phrase: 'even', 'account for embedding and loss', 'uneven: first 7, last 7', 'layout Et|...'."""
        if self.mechanism == "account":
            return "account for " + " and ".join(w for w, on in (("embedding", self.embedding), ("loss", self.loss))
                                                 if on)
        if self.mechanism == "uneven":
            return "uneven: " + ", ".join(f"{w} {n}" for w, n in (("first", self.first), ("last", self.last)) if n)
        if self.mechanism == "layout":
            return f"layout {layout_string(self.chunks)}"
        return "even"


EVEN = PipelineSplit()


@dataclass(frozen=True)
class LayerSplit:
    """What Megatron builds: the decoder layers of every chunk (``chunk_layers``, model order)."""

    num_layers: int
    pp: int
    vpp: int
    split: PipelineSplit
    chunk_layers: tuple[int, ...]

    @property
    def num_chunks(self) -> int:
        return self.pp * self.vpp

    @property
    def embedding_chunk(self) -> int:
        return 0

    @property
    def loss_chunk(self) -> int:
        return self.num_chunks - 1

    def chunk_index(self, rank: int, vstage: int) -> int:
        return vstage * self.pp + rank

    def layers(self, rank: int, vstage: int = 0) -> range:
        """0-based indices of the decoder layers of (pipeline rank, virtual stage)."""
        c = self.chunk_index(rank, vstage)
        start = sum(self.chunk_layers[:c])
        return range(start, start + self.chunk_layers[c])

    def rank_chunks(self, rank: int) -> tuple[int, ...]:
        """Decoder layers of each virtual stage of ``rank``."""
        return self.chunk_layers[rank::self.pp]

    @functools.cached_property
    def rank_layers(self) -> tuple[int, ...]:
        """Decoder layers of each pipeline rank (all its virtual stages)."""
        return tuple(sum(self.chunk_layers[r::self.pp]) for r in range(self.pp))

    def chunk_units(self) -> tuple[int, ...]:
        """Decoder layers + embedding + loss per chunk (the --account-for-* measure of work)."""
        units = list(self.chunk_layers)
        units[0] += 1
        units[-1] += 1
        return tuple(units)

    @functools.cached_property
    def balance_key(self) -> tuple[int, int]:
        """(units of the fullest rank, units of the fullest chunk): smaller is more balanced."""
        ranks = list(self.rank_layers)
        ranks[0] += 1
        ranks[-1] += 1
        return max(ranks), max(self.chunk_units())


class SplitError(ValueError):
    """Megatron (or dtc, for an empty chunk) cannot build this split; the message says why."""


def megatron_split(num_layers: int, pp: int, vpp: int, split: PipelineSplit = EVEN) -> LayerSplit:
    """The layers per chunk megatron-core 0.19.2 builds for ``split``; SplitError when it refuses."""
    return _megatron_split(num_layers, pp, vpp, split)


@functools.lru_cache(maxsize=8192)
def _megatron_split(num_layers: int, pp: int, vpp: int, split: PipelineSplit) -> LayerSplit:
    if num_layers < 1 or pp < 1 or vpp < 1:
        raise SplitError(f"num_layers ({num_layers}), pp ({pp}) and vpp ({vpp}) must be positive")
    if pp == 1 and vpp > 1:
        raise SplitError(f"virtual pipeline stages need pp > 1, got pp=1 x vpp={vpp}")
    if pp == 1 and split.mechanism != "even":
        raise SplitError(f"pp=1 holds every layer; the {split.mechanism} split needs pp > 1")
    n = pp * vpp
    if split.mechanism == "even":
        if num_layers % n:
            raise SplitError(f"pp x vpp = {pp} x {vpp} = {n} does not divide num_layers ({num_layers})")
        chunks = (num_layers // n,) * n
    elif split.mechanism == "account":
        chunks = _account(num_layers, pp, vpp, split)
    elif split.mechanism == "uneven":
        chunks = _uneven(num_layers, pp, vpp, split)
    else:
        chunks = split.chunks
        if len(chunks) != n:
            raise SplitError(f"an explicit layout for pp x vpp = {pp} x {vpp} needs {n} chunks, got {len(chunks)}")
        if any(c < 0 for c in chunks) or sum(chunks) != num_layers:
            raise SplitError(f"an explicit layout must place all {num_layers} layers, got {sum(chunks)} "
                             f"in chunks {list(chunks)}")
    out = LayerSplit(num_layers, pp, vpp, split, tuple(chunks))
    empty = [c for c, u in enumerate(out.chunk_units()) if u == 0]
    if empty:
        raise SplitError(f"chunk {empty[0]} (pipeline rank {empty[0] % pp}, virtual stage {empty[0] // pp}) would "
                         f"hold no layer, embedding or loss: pp x vpp = {n} is more than num_layers + 2 "
                         f"({num_layers + 2}) can fill")
    return out


def _account(num_layers: int, pp: int, vpp: int, split: PipelineSplit) -> tuple[int, ...]:
    if not (split.embedding or split.loss):
        raise SplitError("the account split needs the embedding, the loss or both")
    units = num_layers + split.embedding + split.loss
    if units % pp:
        raise SplitError(f"num_layers + {split.embedding + split.loss} = {units} (embedding/loss counted as layers) "
                         f"must be divisible by pp ({pp})")
    per_rank = units // pp
    if per_rank % vpp:
        raise SplitError(f"{per_rank} units per pipeline rank must be divisible by vpp ({vpp})")
    per_chunk = per_rank // vpp
    n = pp * vpp
    chunks = [per_chunk] * n
    chunks[0] -= split.embedding
    chunks[-1] -= split.loss
    if min(chunks) < 0:
        raise SplitError("one unit per chunk leaves no room for the embedding and the loss in one chunk")
    return tuple(chunks)


def _uneven(num_layers: int, pp: int, vpp: int, split: PipelineSplit) -> tuple[int, ...]:
    f, l = split.first, split.last
    if not (f or l):
        raise SplitError("the uneven split needs the first stage's layers, the last's or both")
    if f < 0 or l < 0:
        raise SplitError(f"first/last stage layers must be positive, got {f}/{l}")
    for what, k in (("first", f), ("last", l)):
        if k and k % vpp:
            raise SplitError(f"the {what} stage's {k} layers must be divisible by vpp ({vpp})")
    middle_layers = num_layers - f - l
    middle_ranks = pp - (f > 0) - (l > 0)
    if middle_layers < 0 or bool(middle_layers) != bool(middle_ranks):
        raise SplitError(f"{middle_layers} layers remain for {middle_ranks} middle pipeline ranks "
                         f"(num_layers {num_layers}, first {f}, last {l}, pp {pp})")
    m = middle_layers // middle_ranks if middle_ranks else 0
    if middle_ranks and (middle_layers % middle_ranks or m % vpp):
        raise SplitError(f"the {middle_layers} middle layers must split over {middle_ranks} ranks in multiples of "
                         f"vpp ({vpp})")
    per_rank = [m] * pp
    if f:
        per_rank[0] = f
    if l:
        per_rank[-1] = l
    return tuple(per_rank[c % pp] // vpp for c in range(pp * vpp))


def split_problem(num_layers: int, pp: int, vpp: int, split: PipelineSplit | None = None) -> str | None:
    """Why no split of ``num_layers`` over pp x vpp exists (with ``split``: why Megatron refuses it)."""
    try:
        layer_split(num_layers, pp, vpp, split)
    except SplitError as exc:
        return str(exc)
    return None


def layer_split(num_layers: int, pp: int, vpp: int, split: PipelineSplit | None = None) -> LayerSplit:
    """The layers Megatron builds for ``split``, or for ``default_split`` when None; SplitError if none."""
    if split is None:
        split = default_split(num_layers, pp, vpp)
        if split is None:
            raise SplitError(_no_split_reason(num_layers, pp, vpp))
    return megatron_split(num_layers, pp, vpp, split)


def _no_split_reason(num_layers: int, pp: int, vpp: int) -> str:
    if pp == 1 and vpp > 1:
        return f"virtual pipeline stages need pp > 1, got pp=1 x vpp={vpp}"
    return (f"pp x vpp = {pp * vpp} chunks exceed num_layers + 2 = {num_layers + 2} (every chunk needs a layer, "
            "the embedding or the loss)")


@functools.lru_cache(maxsize=8192)
def default_split(num_layers: int, pp: int, vpp: int) -> PipelineSplit | None:
    """The simplest mechanism that builds the most balanced split (see the module docstring); None when
    no split exists (pp x vpp > num_layers + 2, or vpp > 1 without pp > 1)."""
    if num_layers < 1 or pp < 1 or vpp < 1 or (pp == 1 and vpp > 1) or pp * vpp > num_layers + 2:
        return None
    if pp == 1:
        return EVEN
    target = megatron_split(num_layers, pp, vpp, PipelineSplit("layout", chunks=balanced_chunks(num_layers, pp, vpp)))
    best = target.balance_key
    for candidate in _simple_candidates(num_layers, pp, vpp, best):
        try:
            got = megatron_split(num_layers, pp, vpp, candidate)
        except SplitError:
            continue
        if got.balance_key == best:
            return candidate
    return target.split


def balanced_chunks(num_layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Decoder layers per chunk of the most balanced explicit layout: num_layers + 2 units spread
    evenly, the remainder to the last chunks, the embedding in the first and the loss in the last."""
    n = pp * vpp
    q, r = divmod(num_layers + 2, n)
    units = [q + (c >= n - r) for c in range(n)]
    units[0] -= 1
    units[-1] -= 1
    return tuple(units)


def _simple_candidates(num_layers: int, pp: int, vpp: int, best: tuple[int, int]):
    """Mechanisms simpler than an explicit layout, simplest first; uneven splits only where their
    ranks fit the best rank load (a short list: the middle count is pinned near it)."""
    yield EVEN
    yield PipelineSplit("account", embedding=True, loss=True)
    yield PipelineSplit("account", embedding=True)
    yield PipelineSplit("account", loss=True)
    rank_cap = best[0]
    middle_ranks = pp - 2
    options: list[tuple[int, int, int, int]] = []
    for f in range(vpp, rank_cap, vpp):  # f + 1 (the embedding) <= rank_cap
        rest = num_layers - f
        if middle_ranks == 0:
            l = rest
            if 0 < l < rank_cap and l % vpp == 0:
                options.append((0, -l, -f, l))
            continue
        for l in range(vpp, rank_cap, vpp):  # l + 1 (the loss) <= rank_cap
            middle = rest - l
            if middle <= 0 or middle % middle_ranks:
                continue
            m = middle // middle_ranks
            if m % vpp or m > rank_cap:
                continue
            loads = (f + 1, m, l + 1)
            options.append((max(loads) - min(loads), -l, -f, l))
    for _, _, neg_f, l in sorted(options):
        yield PipelineSplit("uneven", first=-neg_f, last=l)


# ------------------------------------------------------------------------------ --pipeline-model-parallel-layout
def layout_string(chunks: tuple[int, ...]) -> str:
    """The --pipeline-model-parallel-layout string of per-chunk decoder counts (model order):
    'E' embedding, 't' a decoder layer, 'L' the loss, '|' between chunks; repeats written with
    Megatron's '(..|)*n' and 't*n' (PipelineParallelLayerLayout.parse_str_to_list)."""
    n = len(chunks)
    items = [("E" if c == 0 else "") + _decoders(d) + ("L" if c == n - 1 else "") for c, d in enumerate(chunks)]
    runs: list[list] = []
    for s in items:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    pieces = []
    for i, (s, k) in enumerate(runs):
        last = i == len(runs) - 1
        repeated = k - 1 if last else k
        if repeated == 1:
            pieces.append(f"{s}|")
        elif repeated > 1:
            pieces.append(f"({s}|)*{repeated}")
        if last:
            pieces.append(s)
    return ",".join(pieces)


def _decoders(d: int) -> str:
    return "t" * d if d <= 3 else f"t*{d}"


_REPEAT_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_REPEAT_CHAR = re.compile(r"(.)\*(\d+)")


def parse_layout_string(text: str) -> tuple[int, ...]:
    """Per-chunk decoder counts of a layout string (the inverse of ``layout_string``); SplitError when the
    string is not 'E' + chunks of 't' separated by '|' + 'L' (MTP layers 'm' are not modelled)."""
    s = text.replace(",", "")
    s = _REPEAT_GROUP.sub(lambda m: m.group(1) * int(m.group(2)), s)
    s = _REPEAT_CHAR.sub(lambda m: m.group(1) * int(m.group(2)), s)
    stages = s.split("|")
    if not s.startswith("E") or not s.endswith("L") or s.count("E") != 1 or s.count("L") != 1:
        raise SplitError(f"a pipeline layout starts with the embedding 'E' and ends with the loss 'L', got {text!r}")
    out = []
    for stage in stages:
        body = stage.replace("E", "").replace("L", "")
        if set(body) - {"t"}:
            raise SplitError(f"a pipeline layout chunk holds only 't' decoder layers (plus 'E' first and 'L' last), "
                             f"got {stage!r} in {text!r}")
        out.append(len(body))
    return tuple(out)
