"""The Plan: the solved layout, its estimate and the search's explanation, as a versioned artifact.

Renderers read only the Plan (never the Spec). ``plan.json`` is written next to
every set of artifacts; ``Plan.from_json(plan.to_json())`` is the identity, and
``solve`` returns plans that already went through that round trip, so rendering
from memory and from disk gives the same bytes. Floats are rounded to 4
significant digits (memory stays in integer bytes) so that a change in the 6th
digit of the cost model does not churn every golden file.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from compiler.estimate import Estimate
from compiler.layout import Layout
from compiler.units import round_sig

if TYPE_CHECKING:
    from compiler.split import LayerSplit

PLAN_SCHEMA_VERSION = 1
COST_MODEL_VERSION = "1"



@dataclass(frozen=True)
class Candidate:
    layout: Layout
    estimate: Estimate
    rank: int
    why_lost: str  # empty for the chosen layout


@dataclass(frozen=True)
class SearchSummary:
    num_considered: int  # layouts in the space after pins
    num_evaluated: int  # fully costed (the rest were pruned by bounds or rejected early)
    num_feasible: int
    num_pruned_by_bound: int
    rejections_by_code: Mapping[str, int]
    closest_misses: tuple[Mapping[str, Any], ...] = ()  # for infeasible specs: layout tag, code, message, fix


@dataclass(frozen=True)
class Plan:
    schema_version: int
    name: str
    description: str
    provenance: Mapping[str, Any]  # spec_path, spec_sha256, cost_model_version, frameworks
    model: Mapping[str, Any]  # name, shape (ModelShape dict), params_total, params_active, params_embedding
    training: Mapping[str, Any]  # tokens, seq_len, global_batch, batch_note, precision, optimizer, hyper
    cluster: Mapping[str, Any]  # gpu, display_name, generation, gpus_per_node, num_gpus, num_nodes, hbm_bytes, ...
    budget: Mapping[str, Any]  # max_cost_usd, deadline_s, objective
    targets: tuple[str, ...]
    slurm: Mapping[str, Any]
    layout: Layout
    estimate: Estimate
    alternatives: tuple[Candidate, ...]
    search: SearchSummary
    notes: tuple[str, ...] = ()  # target-specific remarks (e.g. how DeepSpeed runs this layout)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return _round(_to_data(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        version = data.get("schema_version")
        if version != PLAN_SCHEMA_VERSION:
            raise ValueError(f"plan.json schema_version {version!r} is not {PLAN_SCHEMA_VERSION}; recompile the spec")
        return _from_data(cls, data)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))

    def layer_split(self) -> "LayerSplit":
        """The decoder layers of every pipeline (virtual) stage: Megatron's split of the plan's layout
        (compiler.split), the split the plan is costed with and every target renders."""
        from compiler.split import layer_split

        lay = self.layout
        return layer_split(int(self.model["shape"]["num_layers"]), lay.pp, lay.vpp, lay.split)

    def normalized(self) -> "Plan":
        """The plan as it will read back from plan.json (rounded)."""
        return Plan.from_dict(self.to_dict())


def _to_data(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
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
def _field_types(tp: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(tp)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(tp))


def _from_data(tp: Any, data: Any) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return tp(**{name: _from_data(hint, data[name]) for name, hint in _field_types(tp) if name in data})
    if origin is tuple:
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        return tuple(_from_data(inner, v) for v in data)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return _from_data(args[0], data) if len(args) == 1 else data
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return round_sig(float(data), 4)  # an int in a float field: round as to_dict rounds floats
    return data


def make_plan(problem: Any, layout: Layout, estimate: Estimate, *, alternatives: tuple[Candidate, ...],
              search: SearchSummary, notes: tuple[str, ...] = ()) -> Plan:
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
        provenance={
            "spec_path": problem.spec_path,
            "spec_sha256": problem.spec_sha256,
            "cost_model_version": COST_MODEL_VERSION,
            "frameworks": dict(registry.framework_versions()),
        },
        model={
            "name": problem.model_name,
            "shape": problem.shape.to_dict(),
            "params_total": pc.total,
            "params_active": pc.active,
            "params_embedding": pc.embedding + pc.output,
            "is_moe": problem.shape.is_moe,
        },
        training={
            "tokens": problem.tokens,
            "seq_len": problem.seq_len,
            "global_batch": layout.global_batch,  # sequences actually trained per step
            "requested_global_batch": problem.global_batch,
            "batch_note": problem.batch_note,
            "tokens_per_step": layout.global_batch * problem.seq_len,
            "num_steps": -(-problem.tokens // (layout.global_batch * problem.seq_len)),
            "precision": problem.precision,
            "optimizer": problem.optimizer,
            "learning_rate": problem.hyper.learning_rate,
            "min_learning_rate": problem.hyper.min_learning_rate,
            "warmup_tokens": problem.hyper.warmup_tokens,
            "weight_decay": problem.hyper.weight_decay,
            "grad_clip": problem.hyper.grad_clip,
            "adam_beta1": problem.hyper.adam_beta1,
            "adam_beta2": problem.hyper.adam_beta2,
            "seed": problem.hyper.seed,
        },
        cluster={
            "gpu": option.name,
            "display_name": option.spec.display_name,
            "generation": option.spec.generation,
            "gpus_per_node": layout.gpus_per_node,
            "num_gpus": layout.world_size,
            "num_nodes": layout.num_nodes,
            "hbm_bytes": option.spec.hbm_bytes,
            "peak_flops": option.spec.peak_flops_for(problem.precision),
            "intra_node_bandwidth_bytes_per_s": option.intra_node_bandwidth_bytes_per_s,
            "inter_node_bandwidth_bytes_per_s": option.inter_node_bandwidth_bytes_per_s,
            "price_per_gpu_hour_usd": option.price_per_gpu_hour_usd,
        },
        budget={
            "max_cost_usd": problem.max_cost_usd,
            "deadline_s": problem.deadline_s,
            "objective": problem.objective,
        },
        targets=tuple(problem.targets),
        slurm=dict(problem.slurm),
        layout=layout,
        estimate=estimate,
        alternatives=alternatives,
        search=search,
        notes=notes,
    )
    return plan.normalized()
