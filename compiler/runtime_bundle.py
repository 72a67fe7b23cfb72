"""What the FSDP2 and DeepSpeed targets ship: the runtime package, verbatim, and its run config.

``runtime_files()`` is compiler/runtime/*.py as ``dtc_runtime/<name>.py`` artifacts, byte for byte
(the trainers are real, linted, tested code; nothing in them is templated). ``model_config`` and
``run_config`` build the ``train_config.json`` those trainers read, from the plan's values, and
check it with the runtime's own ``run_config_from_dict`` (torch-free), so a config the trainers
would refuse is a render error here, not a failed job.
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any, Mapping, Sequence

from compiler.model import ModelHyperparameters, ModelShape

RUNTIME_DIR = "dtc_runtime"
CONFIG_FILE = "train_config.json"
DEFAULT_ROPE_THETA = 10000.0  # learned-position models carry none; the runtime ignores it there


class UnsupportedModel(ValueError):
    """A model feature the runtime's trainers do not build (MoE, MLA, YaRN)."""


def runtime_files() -> dict[str, str]:
    """{"dtc_runtime/<module>.py": source} for every module of compiler/runtime, sorted."""
    package = resources.files("compiler") / "runtime"
    out = {}
    for entry in sorted(package.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py"):
            out[f"{RUNTIME_DIR}/{entry.name}"] = entry.read_text(encoding="utf-8")
    return out


def entry_script(module: str, doc: str, config_file: str = CONFIG_FILE, header: str = "") -> str:
    """A generated folder's entry point (``fsdp_train.py``, ``ds_train.py``): run ``module`` of the
    runtime package beside it, with the config beside it, from any current directory."""
    return (
        (header + "\n" if header else "")
        + f'"""{doc}"""\n'
        "import sys\n"
        "from pathlib import Path\n\n"
        "HERE = Path(__file__).resolve().parent\n"
        "sys.path.insert(0, str(HERE))\n"
        f"from {RUNTIME_DIR}.common import finish  # noqa: E402\n"
        f"from {RUNTIME_DIR}.{module} import main  # noqa: E402\n\n"
        'if __name__ == "__main__":\n'
        f'    argv = sys.argv[1:] if "--config" in sys.argv[1:] else ["--config", str(HERE / "{config_file}"), '
        "*sys.argv[1:]]\n"
        "    finish(main(argv))\n"
    )


def model_unsupported(shape: ModelShape, hyper: ModelHyperparameters | None = None) -> str | None:
    """What of a model the runtime's Transformer cannot build (None: it can): the one rule the FSDP2 and
    DeepSpeed targets state as their model support (Target.model_support; spec validation asks it before
    solving, model_config before rendering). ``hyper`` None: the shape only."""
    if shape.moe is not None:
        return ("mixture-of-experts layers (the runtime's Transformer has no expert layers or expert "
                "parallelism; use the megatron target)")
    if shape.mla is not None:
        return "multi-head latent attention (use the megatron target)"
    if shape.window_size:
        return "sliding-window attention (use the megatron target)"
    if shape.attention_sinks:
        return "attention sinks (use the megatron target)"
    if shape.mlp not in ("swiglu", "gelu"):
        return f"the {shape.mlp} MLP (the runtime builds swiglu and gelu; use the megatron target)"
    scaling = hyper.rope_scaling if hyper is not None else None
    if scaling is not None and scaling.kind != "llama3":
        return f"{scaling.kind} rope scaling (the runtime implements Llama 3.1's)"
    return None


def model_config(shape: ModelShape, hyper: ModelHyperparameters, seq_len: int) -> dict[str, Any]:
    """The runtime's ModelConfig fields for a planned shape and its catalog hyperparameters."""
    reason = model_unsupported(shape, hyper)
    if reason is not None:
        raise UnsupportedModel(reason)
    scaling = hyper.rope_scaling
    return {
        "num_layers": shape.num_layers, "hidden_size": shape.hidden_size, "ffn_hidden_size": shape.ffn_hidden_size,
        "num_attention_heads": shape.num_attention_heads, "num_kv_heads": shape.num_kv_heads,
        "vocab_size": shape.vocab_size, "seq_len": seq_len, "head_dim": shape.kv_channels, "mlp": shape.mlp,
        "norm": shape.norm, "norm_eps": hyper.norm_eps, "position": shape.position,
        "max_position_embeddings": max(shape.max_position_embeddings, seq_len) if shape.position == "learned" else 0,
        "rope_theta": hyper.rope_theta if hyper.rope_theta is not None else DEFAULT_ROPE_THETA,
        "rope_scaling": None if scaling is None else {
            "factor": scaling.factor, "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings},
        "tied_embeddings": shape.tied_embeddings, "attention_bias": shape.attention_bias,
        "linear_bias": shape.linear_bias, "init_std": hyper.init_std,
    }


def data_section(datasets: Sequence[tuple[str, float]] | None, tokenizer: str | None) -> dict[str, Any]:
    """``datasets``: (prefix, weight) pairs; None or empty: the synthetic task."""
    if not datasets:
        return {"synthetic": True}
    return {"synthetic": False, "sources": [{"prefix": p, "weight": float(w)} for p, w in datasets],
            "tokenizer": tokenizer}


def run_config(*, name: str, layout_tag: str, model: Mapping[str, Any], parallel: Mapping[str, Any],
               micro_batch: int, grad_accum: int, seq_len: int, train_steps: int, peak_lr: float, min_lr: float,
               warmup_steps: int, optimizer: Mapping[str, Any], data: Mapping[str, Any],
               checkpoint: Mapping[str, Any], param_dtype: str, init: str | None, seed: int,
               notes: Sequence[str] = (), reduce_dtype: str | None = None) -> dict[str, Any]:
    """train_config.json as data, checked by the runtime's own parser."""
    from compiler.runtime.config import run_config_from_dict
    from compiler.targets.fsdp.cost import COST as FSDP_COST

    if reduce_dtype is None:  # FSDP2's MixedPrecisionPolicy.reduce_dtype: the fsdp cost profile's gradient dtype
        reduce_dtype = _PARAM_DTYPES[FSDP_COST.grad_reduce_dtype]
    config = {
        "version": 1, "name": name, "layout_tag": layout_tag, "model": dict(model), "parallel": dict(parallel),
        "batch": {"micro_batch": micro_batch, "grad_accum": grad_accum, "seq_len": seq_len},
        "schedule": {"peak_lr": peak_lr, "min_lr": min_lr, "warmup_steps": warmup_steps, "decay_steps": train_steps,
                     "style": "cosine"},
        "train_steps": train_steps, "optimizer": dict(optimizer), "data": dict(data),
        "checkpoint": dict(checkpoint), "param_dtype": param_dtype, "reduce_dtype": reduce_dtype, "init": init,
        "seed": seed, "notes": list(notes),
    }
    run_config_from_dict(config)  # raises ConfigError (a ValueError) for anything the trainers would refuse
    return config


def dump(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


__all__ = ["runtime_files", "entry_script", "model_config", "data_section", "run_config", "dump", "RUNTIME_DIR",
           "CONFIG_FILE", "UnsupportedModel", "model_unsupported"]


# ------------------------------------------------------------------------------------------- from a plan
_PARAM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}


def plan_run_config(plan: Any, *, checkpoint_interval_steps: int) -> dict[str, Any]:
    """train_config.json for ``plan`` (a compiler.plan.Plan): the planned model with its catalog
    hyperparameters, the layout with Megatron's pipeline split (the one costed), the batch, the
    schedule, the data (or the synthetic task), ``model.init`` and the checkpoint interval."""
    lay, t = plan.layout, plan.training
    split = plan.layer_split()
    warmup = min(t.num_steps, -(-int(t.warmup_tokens) // int(t.tokens_per_step))) if t.warmup_tokens else 0
    data = plan.data
    datasets = [(d.path, d.weight) for d in data.datasets] if data is not None and not data.synthetic else None
    notes = []
    if datasets is None:
        notes.append("synthetic data: " + ("asked for (data: synthetic: true)" if data is not None
                                           else "the spec has no data: section"))
    return run_config(
        name=plan.name, layout_tag=lay.tag, model=model_config(plan.model.shape, plan.model.hyperparameters, t.seq_len),
        parallel={"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp_replicate": lay.dp_replicate, "dp_shard": lay.dp_shard,
                  "vpp": lay.vpp, "zero_stage": lay.zero_stage, "sequence_parallel": lay.sequence_parallel,
                  "pp_schedule": lay.schedule, "recompute": lay.recompute,
                  "stage_layers": ([list(split.layers(c % lay.pp, c // lay.pp)) for c in range(split.num_chunks)]
                                   if lay.pp > 1 else None),
                  "offload": "cpu" if lay.offload_params == "cpu" else "none"},
        micro_batch=lay.micro_batch, grad_accum=lay.grad_accum, seq_len=t.seq_len, train_steps=t.num_steps,
        peak_lr=float(t.learning_rate), min_lr=float(t.min_learning_rate), warmup_steps=warmup,
        optimizer={"name": t.optimizer, "weight_decay": float(t.weight_decay), "beta1": float(t.adam_beta1),
                   "beta2": float(t.adam_beta2), "eps": 1e-8, "grad_clip": float(t.grad_clip)},
        data=data_section(datasets, data.tokenizer if data is not None else None),
        checkpoint={"dir": "checkpoints", "interval_steps": checkpoint_interval_steps, "keep": 2},
        param_dtype=_PARAM_DTYPES[t.precision], init=plan.model.init, seed=t.seed, notes=notes)


def render_runtime_target(plan: Any, *, target: str, config_file: str, entry_file: str, module: str,
                          doc: str) -> dict[str, str]:
    """The files of a runtime target: dtc_runtime/ verbatim, its train config, its entry script."""
    from compiler.errors import Diagnostic, RenderError

    from compiler.checkpointing import plan_policy

    policy = plan_policy(plan, target)
    try:
        config = plan_run_config(plan, checkpoint_interval_steps=policy.interval_steps)
    except (UnsupportedModel, ValueError) as exc:
        raise RenderError(Diagnostic(
            summary=f"the {target} trainer cannot build this model: {exc}",
            hint="use the megatron target for it, or change the model")) from None
    files = runtime_files()
    files[config_file] = dump(config)
    from compiler.render.common import provenance_header

    files[entry_file] = entry_script(module, doc, config_file, header=provenance_header(plan))
    return files
