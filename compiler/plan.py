"""The Plan: the solved layout, its estimate and the search's explanation, as a versioned artifact.

Renderers read only the Plan (never the Spec). ``plan.json`` is written next to
every set of artifacts; ``Plan.from_json(plan.to_json())`` is the identity, and
``solve`` returns plans that already went through that round trip, so rendering
from memory and from disk gives the same bytes. The cost model's outputs (the
estimates and the search's figures) are rounded to 4 significant digits (memory
stays in integer bytes) so that a change in the 6th digit of the cost model does
not churn every golden file; what the spec said (hyperparameters, time limits,
prices, bandwidths) is kept exactly, because artifacts pass it on (an adam_beta2 of
0.99999 rounded to 1.0 is an error in torch).
"""
from __future__ import annotations

import collections.abc
import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from pydantic import BaseModel

from compiler.profile_ref import ProfileRef
from compiler.estimate import Estimate
from compiler.layout import Layout
from compiler.model import ModelHyperparameters, ModelShape
from compiler.spec.models import PLAN_DATA, DataSpec, SlurmSpec
from compiler.units import round_sig

if TYPE_CHECKING:
    from compiler.split import LayerSplit

# 4: estimate.band (the 80% error band, issue #12) in every estimate, budget.confidence;
# 3: model.hyperparameters, model.init, data, target_estimates; 2: typed sections, layout.split
PLAN_SCHEMA_VERSION = 4
ESTIMATED_SECTIONS = frozenset({"estimate", "alternatives", "search", "target_estimates"})  # cost-model output: rounded
COST_MODEL_VERSION = "1"



@dataclass(frozen=True)
class Candidate:
    layout: Layout
    estimate: Estimate
    rank: int
    why_lost: str  # empty for the chosen layout


@dataclass(frozen=True)
class TargetEstimate:
    """The chosen layout costed for one framework target of the spec (its artifacts' kernels, gradient dtypes,
    activation profile and overlaps: compiler/targets/<name>/cost.py). The plan's ``estimate`` is the binding
    target's: the slowest at the spec's confidence (compiler.costmodel.evaluation.evaluate_targets), as a layout
    rendered for several targets must fit under each."""

    target: str
    binding: bool
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    time_to_train_s: float
    gpu_hours: float
    cost_usd: float
    memory_bytes_per_gpu: int
    usable_bytes_per_gpu: int

    @classmethod
    def of(cls, target: str, estimate: Estimate, *, binding: bool) -> "TargetEstimate":
        return cls(target=target, binding=binding, step_time_s=estimate.step_time_s,
                   tokens_per_s_per_gpu=estimate.tokens_per_s_per_gpu, mfu=estimate.mfu,
                   time_to_train_s=estimate.time_to_train_s, gpu_hours=estimate.gpu_hours, cost_usd=estimate.cost_usd,
                   memory_bytes_per_gpu=estimate.memory.total_bytes_per_gpu,
                   usable_bytes_per_gpu=estimate.memory.usable_bytes_per_gpu)


@dataclass(frozen=True)
class ClosestMiss:
    """An infeasible spec's near miss: the layout, why it fails, what would make it fit, how far off it is."""

    layout: str  # its tag
    description: str
    code: str
    message: str
    fix: str
    over_by: float  # how far over the limit, relative (0.1 = 10% over)
    gpus: str = ""  # '16 x h100-sxm': how many GPUs of which type


@dataclass(frozen=True)
class SearchSummary:
    num_considered: int  # layouts in the space after pins
    num_evaluated: int  # fully costed (the rest were pruned by bounds or rejected early)
    num_feasible: int
    num_pruned_by_bound: int
    rejections_by_code: Mapping[str, int]
    closest_misses: tuple[ClosestMiss, ...] = ()  # for infeasible specs


@dataclass(frozen=True)
class Provenance:
    spec_path: str  # as the user gave it (an absolute path is reduced to its file name)
    spec_sha256: str
    cost_model_version: str
    frameworks: Mapping[str, str]  # package -> the release the artifacts are written for


@dataclass(frozen=True)
class ModelSection:
    name: str  # preset name, "custom", or "derived from 70B"
    shape: ModelShape
    params_total: int
    params_active: int
    params_embedding: int  # embedding + output layer
    is_moe: bool
    # rope base and scaling, norm eps, init std: the catalog's for a preset (with sources), else
    # compiler.model.derived_hyperparameters
    hyperparameters: ModelHyperparameters
    init: str | None = None  # model.init: a Hugging Face safetensors folder to start from


@dataclass(frozen=True)
class TrainingSection:
    tokens: int
    seq_len: int
    global_batch: int  # sequences actually trained per step
    requested_global_batch: int
    batch_note: str  # how a token batch was converted
    tokens_per_step: int
    num_steps: int
    precision: str
    optimizer: str
    learning_rate: float
    min_learning_rate: float
    warmup_tokens: int
    weight_decay: float
    grad_clip: float
    adam_beta1: float
    adam_beta2: float
    seed: int


@dataclass(frozen=True)
class ClusterSection:
    gpu: str  # catalog name
    display_name: str
    generation: str
    gpus_per_node: int
    num_gpus: int
    num_nodes: int
    hbm_bytes: int
    peak_flops: float  # for the training precision
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    price_per_gpu_hour_usd: float
    memory_headroom: float  # fraction of HBM kept free on top of the modelled items (search.memory_headroom)
    # cluster.profile: the cluster profile whose constants costed this plan (left out of plan.json when none)
    profile: ProfileRef | None = dataclasses.field(default=None, metadata={"omit_if_none": True})
    # the host memory per node the offloaded states were checked against (cluster.host_memory or the catalog's;
    # left out of plan.json when the layout offloads nothing to the CPU or it is not known)
    host_memory_bytes_per_node: int | None = dataclasses.field(default=None, metadata={"omit_if_none": True})


@dataclass(frozen=True)
class BudgetSection:
    max_cost_usd: float | None
    deadline_s: float | None
    objective: str
    confidence: str = "p80"  # the step-time quantile the objective ranked by (budget.confidence)


def _spec_limited(plan: "Plan") -> tuple[tuple[str, Any, Any], ...]:
    """(where in plan.json, value, the spec's type for it) of each value the plan takes from its spec and the cost
    model divides by or iterates over."""
    from compiler.spec import models as S

    c, t, m = plan.cluster, plan.training, plan.model.shape
    dims = tuple((f"model.shape.{f}", getattr(m, f), S.PosInt)
                 for f in ("hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size"))
    moe = (("model.shape.moe", dataclasses.asdict(m.moe), S.MoESpec),) if m.moe is not None else ()
    cluster = (("cluster.intra_node_bandwidth_bytes_per_s", c.intra_node_bandwidth_bytes_per_s, S.PosBandwidth),
               ("cluster.inter_node_bandwidth_bytes_per_s", c.inter_node_bandwidth_bytes_per_s, S.PosBandwidth),
               ("cluster.price_per_gpu_hour_usd", c.price_per_gpu_hour_usd, S.Price),
               ("cluster.memory_headroom", c.memory_headroom, S.MemoryHeadroom),
               ("cluster.gpus_per_node", c.gpus_per_node, S.PosInt), ("cluster.num_gpus", c.num_gpus, S.PosInt))
    training = (("training.tokens", t.tokens, S.TokenCount), ("training.seq_len", t.seq_len, S.PosInt),
                ("training.global_batch", t.global_batch, S.PosInt))
    return dims + moe + cluster + training + (("targets", list(plan.targets), list[S.TargetName]),)


@functools.lru_cache(maxsize=None)
def _adapter(kind: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(kind)


def _check_spec_limits(plan: "Plan") -> None:
    """The values a plan takes from its spec within the spec's own limits (its types in compiler.spec.models): a
    hand-edited plan.json with a zero bandwidth or sequence length, or a target dtc does not have, is refused here
    (ValueError) rather than divided by in the cost model."""
    from pydantic import ValidationError

    for where, value, kind in _spec_limited(plan):
        try:
            _adapter(kind).validate_python(value, context={PLAN_DATA: True})
        except ValidationError as exc:
            err = exc.errors()[0]
            why, field = err["msg"], ".".join(str(x) for x in err["loc"] if isinstance(x, str))
            raise ValueError(f"plan.json: plan.{where}{'.' + field if field else ''} is not what a spec accepts "
                             f"({why[:1].lower()}{why[1:]}), got {err.get('input', value)!r}") from None


@dataclass(frozen=True)
class Plan:
    schema_version: int
    name: str
    description: str
    provenance: Provenance
    model: ModelSection
    training: TrainingSection
    cluster: ClusterSection
    budget: BudgetSection
    targets: tuple[str, ...]
    slurm: SlurmSpec  # the spec's validated slurm section (compiler.spec.models: one list of its fields)
    layout: Layout
    estimate: Estimate
    alternatives: tuple[Candidate, ...]
    search: SearchSummary
    notes: tuple[str, ...] = ()  # target-specific remarks (e.g. how DeepSpeed runs this layout)
    data: DataSpec | None = None  # the spec's data section; None: no data given (synthetic, said in PLAN.md)
    # the layout costed for each framework target (the binding one is ``estimate``); () for plans made by a
    # test's stand-in cost model
    target_estimates: tuple[TargetEstimate, ...] = ()

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return plan_data(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        """The plan of ``data`` (plan.json), type-checked field by field; ValueError says what is wrong where."""
        if not isinstance(data, Mapping):
            raise ValueError(f"plan.json must hold an object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != PLAN_SCHEMA_VERSION:
            raise ValueError(f"plan.json schema_version {version!r} is not {PLAN_SCHEMA_VERSION}; recompile the spec")
        plan = _from_data(cls, data, "plan")
        _check_spec_limits(plan)
        return plan

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """The plan in ``text``; ValueError (with what is wrong) for anything that is not one: not JSON,
        NaN or Infinity, not an object (``[]``, ``null``), nested too deeply, fields of the wrong type."""
        def no_constant(name: str) -> Any:
            raise ValueError(f"plan.json holds {name}, which is not a number in JSON")

        try:
            data = json.loads(text, parse_constant=no_constant)
        except RecursionError:
            raise ValueError("plan.json nests too deeply") from None
        if not isinstance(data, dict):
            raise ValueError(f"plan.json must hold a JSON object, got {type(data).__name__}")
        try:
            return cls.from_dict(data)
        except ValueError:
            raise
        except (KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ValueError(f"plan.json does not have the fields of a plan ({type(exc).__name__}: {exc})") from None

    def layer_split(self) -> "LayerSplit":
        """The decoder layers of every pipeline (virtual) stage: Megatron's split of the plan's layout
        (compiler.split), the split the plan is costed with and every target renders."""
        from compiler.split import layer_split

        lay = self.layout
        return layer_split(self.model.shape.num_layers, lay.pp, lay.vpp, lay.split)

    def normalized(self) -> "Plan":
        """The plan as it will read back from plan.json (rounded)."""
        return Plan.from_dict(self.to_dict())


def plan_data(obj: Any) -> Any:
    """``obj`` (a plan or any of its parts) as plan.json holds it: plain data, the cost model's outputs
    (estimates, alternatives, search figures) rounded to 4 significant digits; what the spec gave (time
    limits, hyperparameters, prices) exact."""
    data = _to_data(obj)
    if isinstance(obj, Plan):
        return {k: _round(v) if k in ESTIMATED_SECTIONS else v for k, v in data.items()}
    return _round(data)


def as_in_plan(obj: Any) -> Any:
    """``obj`` (a dataclass of the plan, e.g. an Estimate) as it reads back from plan.json (rounded)."""
    return _from_data(type(obj), plan_data(obj), type(obj).__name__)


_PLAIN = (str, int, float, bool, type(None))  # what _to_data returns as it is (plan.json's scalars)


@functools.cache
def _data_fields(cls: Any) -> tuple[tuple[str, bool, Any], ...] | None:
    """(name, omitted when at its default, the default) of each field of the dataclass ``cls``; None when ``cls``
    is not a dataclass. A field marked omit_if_none (its default None) or omit_if_default (a field added after
    plans were written: plans that do not use it keep their bytes) is left out at its default. A plan holds
    thousands of pipeline events: the fields are looked up once per class."""
    if not dataclasses.is_dataclass(cls):
        return None
    return tuple((f.name, bool(f.metadata.get("omit_if_none") or f.metadata.get("omit_if_default")), f.default)
                 for f in dataclasses.fields(cls))


def _to_data(obj: Any) -> Any:
    cls: Any = type(obj)
    if cls in _PLAIN:
        return obj
    fields = _data_fields(cls)
    if fields is not None:
        out = {}
        for name, omit, default in fields:
            value = getattr(obj, name)
            if not (omit and value == default):
                out[name] = _to_data(value)
        return out
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, Mapping):
        return {str(k): _to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_data(v) for v in obj]
    return obj


def _round(obj: Any) -> Any:
    if isinstance(obj, float):
        return round_sig(obj, 4)
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round(v) for v in obj]
    return obj


@functools.cache
def _field_types(tp: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = typing.get_type_hints(tp)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(tp))


def _exact_section(where: str) -> bool:
    """Whether the plan.json path ``where`` lies in a section kept exact (not an estimated one)."""
    parts = where.split(".")
    return len(parts) > 1 and parts[0] == "plan" and parts[1].split("[")[0] not in ESTIMATED_SECTIONS


def _path(where: Any) -> str:
    """The plan.json path ``where`` names, as an error says it: ``where`` is the root's name or (the parent's
    path, ".field" or a list index), formatted only for an error (a plan holds thousands of pipeline events)."""
    pieces = []
    while isinstance(where, tuple):
        where, piece = where
        pieces.append(f"[{piece}]" if isinstance(piece, int) else piece)
    return where + "".join(reversed(pieces))


def _from_data(tp: Any, data: Any, where: Any) -> Any:
    """``data`` as a value of type ``tp``, checked; ``where`` is its path in plan.json (for the error; _path)."""
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"plan.json: {_path(where)} must be a number, got {data!r}"[:300])
        if isinstance(data, int) and not _exact_section(_path(where)):
            return round_sig(float(data), 4)  # an int in an estimated float field: round as to_dict rounds floats
        return float(data) if isinstance(data, int) else data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise ValueError(f"plan.json: {_path(where)} must be an integer, got {data!r}"[:300])
        return data
    if tp is str:
        if not isinstance(data, str):
            raise ValueError(f"plan.json: {_path(where)} must be a string, got {data!r}"[:300])
        return data
    if tp is bool:
        if not isinstance(data, bool):
            raise ValueError(f"plan.json: {_path(where)} must be true or false, got {data!r}"[:300])
        return data
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            raise ValueError(f"plan.json: {_path(where)} must be an object, got {data!r}"[:300])
        fields = _field_types(tp)
        missing = [name for name, _, required in fields if required and name not in data]
        if missing:
            raise ValueError(f"plan.json: {_path(where)} lacks {', '.join(missing)}")
        values = {name: _from_data(hint, data[name], (where, "." + name)) for name, hint, _ in fields
                  if name in data}
        try:
            return tp(**values)
        except (AssertionError, TypeError) as exc:  # a Layout's own invariants
            raise ValueError(f"plan.json: {_path(where)}: {exc}") from None
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        # pydantic's ValidationError is a ValueError; values are read back as plan.json holds them (a time limit
        # in whole seconds, not as a spec writes it)
        return tp.model_validate(data, context={PLAN_DATA: True})
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, (list, tuple)):
            raise ValueError(f"plan.json: {_path(where)} must be a list, got {data!r}"[:300])
        inner = args[0] if args else Any
        return tuple(_from_data(inner, v, (where, i)) for i, v in enumerate(data))
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return _from_data(members[0], data, where) if len(members) == 1 else data
    if origin is typing.Literal:
        if data not in typing.get_args(tp):
            raise ValueError(f"plan.json: {_path(where)} must be one of {', '.join(map(str, typing.get_args(tp)))}, "
                             f"got {data!r}"[:300])
        return data
    if origin is not None and origin in (Mapping, dict, collections.abc.Mapping):
        if not isinstance(data, Mapping):
            raise ValueError(f"plan.json: {_path(where)} must be an object, got {data!r}"[:300])
        return dict(data)
    return data


def model_hyperparameters(problem: Any) -> ModelHyperparameters:
    """The catalog's hyperparameters of the problem's preset (when its shape kept the preset's kind of
    positions), else the derived ones (compiler.model.derived_hyperparameters)."""
    from compiler.catalog import load_catalog
    from compiler.model import derived_hyperparameters

    preset = load_catalog().find_model(problem.model_name)
    if preset is not None and (preset.hyperparameters.rope_theta is None) == (problem.shape.position == "learned"):
        return preset.hyperparameters
    return derived_hyperparameters(problem.shape)


def _recipe_notes(problem: Any) -> tuple[str, ...]:
    """Where a defaulted learning rate comes from (PLAN.md's notes)."""
    h = problem.hyper
    if not h.learning_rate_source:
        return ()
    return (f"Learning rate {h.learning_rate:g} peak, {h.min_learning_rate:g} final: the spec sets none, so "
            f"the published recipe for a model of this size applies: {h.learning_rate_source.rstrip('.')}.",)


def make_plan(problem: Any, layout: Layout, estimate: Estimate, *, alternatives: tuple[Candidate, ...],
              search: SearchSummary, notes: tuple[str, ...] = (),
              target_estimates: tuple[TargetEstimate, ...] = ()) -> Plan:
    """Assemble the Plan from a Problem and the chosen layout; the result is already normalised.

    The sections below are everything renderers may use; they never see the Problem or Spec.
    """
    from compiler.problem import Problem  # local: plan.py stays importable without the spec layer
    from compiler.targets import registry

    assert isinstance(problem, Problem)
    if layout.split is None:  # the plan records the split it is costed with (and every target renders)
        from compiler.split import layer_split

        layout = layout.with_(split=layer_split(problem.shape.num_layers, layout.pp, layout.vpp).split)
    option = next(o for o in problem.gpu_options if o.name == layout.gpu)
    pc = problem.params
    plan = Plan(
        schema_version=PLAN_SCHEMA_VERSION,
        name=problem.name,
        description=problem.description,
        provenance=Provenance(spec_path=problem.spec_path, spec_sha256=problem.spec_sha256,
                              cost_model_version=COST_MODEL_VERSION, frameworks=dict(registry.framework_versions())),
        model=ModelSection(name=problem.model_name, shape=problem.shape, params_total=pc.total,
                           params_active=pc.active, params_embedding=pc.embedding + pc.output,
                           is_moe=problem.shape.is_moe, hyperparameters=model_hyperparameters(problem),
                           init=problem.init),
        training=TrainingSection(
            tokens=problem.tokens, seq_len=problem.seq_len,
            global_batch=layout.global_batch,  # sequences actually trained per step
            requested_global_batch=problem.global_batch, batch_note=problem.batch_note,
            tokens_per_step=layout.global_batch * problem.seq_len,
            num_steps=-(-problem.tokens // (layout.global_batch * problem.seq_len)),
            precision=problem.precision, optimizer=problem.optimizer, learning_rate=problem.hyper.learning_rate,
            min_learning_rate=problem.hyper.min_learning_rate, warmup_tokens=problem.hyper.warmup_tokens,
            weight_decay=problem.hyper.weight_decay, grad_clip=problem.hyper.grad_clip,
            adam_beta1=problem.hyper.adam_beta1, adam_beta2=problem.hyper.adam_beta2, seed=problem.hyper.seed),
        cluster=ClusterSection(
            gpu=option.name, display_name=option.spec.display_name, generation=option.spec.generation,
            gpus_per_node=layout.gpus_per_node, num_gpus=layout.world_size, num_nodes=layout.num_nodes,
            hbm_bytes=option.spec.hbm_bytes, peak_flops=option.spec.peak_flops_for(problem.precision),
            intra_node_bandwidth_bytes_per_s=option.intra_node_bandwidth_bytes_per_s,
            inter_node_bandwidth_bytes_per_s=option.inter_node_bandwidth_bytes_per_s,
            price_per_gpu_hour_usd=option.price_per_gpu_hour_usd, memory_headroom=problem.memory_headroom,
            profile=problem.profile,
            host_memory_bytes_per_node=(option.host_memory_bytes_per_node
                                        if estimate.memory.usable_cpu_bytes_per_node is not None else None)),
        budget=BudgetSection(max_cost_usd=problem.max_cost_usd, deadline_s=problem.deadline_s,
                             objective=problem.objective, confidence=problem.confidence),
        targets=tuple(problem.targets),
        slurm=problem.slurm,
        layout=layout,
        estimate=estimate,
        alternatives=alternatives,
        search=search,
        notes=notes + _recipe_notes(problem),
        data=problem.data,
        target_estimates=target_estimates,
    )
    return plan.normalized()
