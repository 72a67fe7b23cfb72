"""The DeepSpeed trainer: ``deepspeed|torchrun ... deepspeed_train.py [--config train_config.json]
[--ds-config ds_config.json] [--steps N]``.

The engine runs exactly ds_config.json (ZeRO 0-3, AutoTP via ``tensor_parallel.autotp_size``, the
pipeline engine when the config has a ``pipeline`` section) with the runtime's model, data,
schedule and checkpoints:

- the model: the runtime's Transformer (ZeRO-3: built under ``deepspeed.zero.Init``); a pipeline
  config builds it as a ``PipelineModule`` whose stages hold exactly the configured layer lists;
- weight decay on matrices and embeddings only (parameter groups), the lr set every step from
  schedule.py (a ``scheduler`` section in ds_config.json is dropped, and the change printed);
- checkpoints: ``engine.save_checkpoint`` / ``load_checkpoint`` (model, ZeRO optimizer partitions)
  with the step and samples consumed as client state, inside checkpoint.py's complete-or-invisible
  folders, plus per-rank RNG state; saved every ``interval_steps``, on SIGUSR1/SIGTERM (then exit
  0 for the requeue) and at the end; a start resumes from the newest complete one;
- ``init``: a Hugging Face Llama safetensors folder loaded into the module before the engine is
  built (ZeRO-3: each partitioned parameter gathered and written by rank 0).

On a machine without GPUs it runs on CPU with gloo: no shared-memory allreduce op, fp16 mapped to
bf16, torch's Adam instead of DeepSpeed's JIT-compiled ops (``--cpu-optimizer deepspeed`` keeps
them). Rank 0 prints one line per step and a final JSON line (``dtc_deepspeed_summary``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script from a generated folder: import the package beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = Path(__file__).resolve().parent.name  # noqa: A001

from . import checkpoint as ckpt  # noqa: E402
from . import common as C  # noqa: E402
from . import measure as M  # noqa: E402
from .config import ConfigError, RunConfig  # noqa: E402
from .model import (  # noqa: E402
    ModelConfig,
    Transformer,
    TransformerBlock,
    count_parameters,
    cross_entropy,
    init_module_weights,
    make_norm,
    rope_table,
    weight_decay_groups,
)

SUMMARY_KEY = "dtc_deepspeed_summary"
CHECKPOINT_TAG = "ds"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="dtc DeepSpeed trainer", allow_abbrev=False)
    C.add_common_args(p, Path.cwd() / "train_config.json")
    p.add_argument("--ds-config", default=None, help="DeepSpeed config (default: ds_config.json beside --config)")
    p.add_argument("--tp", type=int, default=None, help="AutoTP degree (tensor_parallel.autotp_size)")
    p.add_argument("--pp", type=int, default=None, help="pipeline stages (pipeline.stages; pipeline configs only)")
    p.add_argument("--dp-shard", type=int, default=None,
                   help="ZeRO++ hpZ secondary partition size (zero_hpz_partition_size; hpZ configs only)")
    p.add_argument("--zero-sizes", default=None, metavar="KEY=N,...",
                   help="set these zero_optimization sizes (dtc smoke: the buckets and the persistence threshold "
                        "ds_config.json sizes by the hidden size, for the reduced model's)")
    p.add_argument("--allow-resize", action="store_true",
                   help="run a config on a world its batch fields do not fit: recompute train_batch_size")
    p.add_argument("--cpu-optimizer", choices=("torch", "deepspeed"), default="torch",
                   help="on CPU: torch.optim (default) or DeepSpeed's JIT-compiled optimizers")
    p.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")),
                   help="set by the deepspeed launcher")
    C.defaults_from_env(p)
    args = p.parse_args(argv)
    for name in ("steps", "micro_batch", "grad_accum", "tp", "pp", "dp_shard", "seq"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# ------------------------------------------------------------------------------------------- ds_config
def data_parallel_size(ds: dict, world: int) -> int:
    """What DeepSpeedConfig checks train_batch_size against: world / stages for the pipeline
    engine; the whole world otherwise (AutoTP included: no mpu is passed)."""
    if "pipeline" in ds:
        return world // ds["pipeline"]["stages"]
    return world


def adapt_ds_config(ds: dict, args, cfg: RunConfig, world: int, on_cpu: bool) -> tuple[dict, list[dict]]:
    """ds_config with the command line's overrides and this machine's needs; (config, changes)."""
    changes: list[dict] = []

    def put(path, value, why):
        node = ds
        for key in path[:-1]:
            node = node.setdefault(key, {})
        old = node.get(path[-1])
        if old == value:
            return False
        node[path[-1]] = value
        changes.append({"key": ".".join(path), "from": old, "to": value, "why": why})
        return True

    if "scheduler" in ds:
        changes.append({"key": "scheduler", "from": ds.pop("scheduler"), "to": None,
                        "why": "the runtime's schedule (schedule.py, Megatron's) sets the lr every step"})
    if args.tp is not None and (args.tp > 1 or "tensor_parallel" in ds):
        put(("tensor_parallel", "autotp_size"), args.tp, "--tp")
    if args.pp is not None:
        if "pipeline" in ds:
            put(("pipeline", "stages"), args.pp, "--pp")
        elif args.pp > 1:
            raise ConfigError(f"--pp {args.pp} needs a pipeline config (this ds_config has no pipeline section)")
    if args.dp_shard is not None and "zero_hpz_partition_size" in ds.get("zero_optimization", {}):
        put(("zero_optimization", "zero_hpz_partition_size"), args.dp_shard, "--dp-shard")
    for item in filter(None, (args.zero_sizes or "").split(",")):
        key, _, value = item.partition("=")
        if not key or not value.strip().isdigit():
            raise ConfigError(f"--zero-sizes: {item!r} is not KEY=N")
        if "zero_optimization" not in ds or key.strip() not in ds["zero_optimization"]:
            continue  # a size this config's stage does not use
        put(("zero_optimization", key.strip()), int(value), "--zero-sizes")
    batch_set = False
    if args.micro_batch is not None:
        batch_set |= put(("train_micro_batch_size_per_gpu",), args.micro_batch, "--micro-batch")
    if args.grad_accum is not None:
        batch_set |= put(("gradient_accumulation_steps",), args.grad_accum, "--grad-accum")
    mbs, gas = ds.get("train_micro_batch_size_per_gpu"), ds.get("gradient_accumulation_steps")
    if isinstance(mbs, int) and isinstance(gas, int):
        dp = data_parallel_size(ds, world)
        if ds.get("train_batch_size") != mbs * gas * dp and (batch_set or args.allow_resize):
            put(("train_batch_size",), mbs * gas * dp,
                f"{'--allow-resize: ' if not batch_set else ''}micro {mbs} x accumulation {gas} x {dp} processes")
    if on_cpu:
        if ds.get("fp16", {}).get("enabled"):
            put(("fp16", "enabled"), False, "DeepSpeed has no fp16 on CPU: bf16 instead")
            put(("bf16", "enabled"), True, "DeepSpeed has no fp16 on CPU: bf16 instead")
        opt = ds.get("optimizer", {})
        if args.cpu_optimizer == "torch" and opt.get("type") in ("Adam", "AdamW"):
            why = "CPU: torch.optim instead of DeepSpeed's JIT-compiled ops (--cpu-optimizer deepspeed keeps them)"
            put(("optimizer", "params", "torch_adam"), True, why)
            if ds.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none") != "none":
                put(("zero_force_ds_cpu_optimizer",), False, why)
    return ds, changes


def check_ds_config(ds: dict, world: int, path: Path) -> None:
    """DeepSpeed's own config checks (the batch identity first), before the model is built."""
    from deepspeed.runtime.config import DeepSpeedConfig

    dp = data_parallel_size(ds, world)

    class DataParallel:  # all DeepSpeedConfig asks an mpu
        @staticmethod
        def get_data_parallel_world_size():
            return dp

    try:
        DeepSpeedConfig(ds, mpu=DataParallel())
    except AssertionError as exc:
        hint = ("; launch as many processes as the config is for, or pass --allow-resize"
                if "batch" in str(exc) else "")
        raise ConfigError(f"DeepSpeed refuses {path}: {exc}{hint}") from None


# ------------------------------------------------------------------------------------------- pipeline model
class EmbeddingPipe(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_embeddings = nn.Embedding(cfg.position_table, cfg.hidden_size) if cfg.position == "learned" else None

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))[None]
        return h


class BlockPipe(TransformerBlock):
    """A block with its own rotary table (pipeline layers take one tensor)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        table = rope_table(cfg.seq_len, cfg.kv_channels, cfg.rope_theta, cfg.rope_scaling) \
            if cfg.position == "rope" else None
        self.register_buffer("freqs_cis", table, persistent=False)

    def forward(self, x):
        return super().forward(x, self.freqs_cis)


class NormPipe(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = make_norm(cfg)

    def forward(self, x):
        return self.norm(x)


class HeadPipe(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x):
        return self.output(x)


def _tied_head(module, x):
    return F.linear(x, module.tok_embeddings.weight)


def pipeline_model(cfg: RunConfig, stages: int, checkpoint_fn, checkpoint_interval: int):
    """The decoder as a PipelineModule: [embedding, blocks..., final norm, head]; stage s holds the
    configured layers of stage s (the embedding on the first, norm and head on the last)."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    m = cfg.model
    layer_lists = cfg.parallel.stages(m.num_layers)
    if m.tied_embeddings:
        first = TiedLayerSpec("embed", EmbeddingPipe, m)
        last = TiedLayerSpec("embed", EmbeddingPipe, m, forward_fn=_tied_head)
    else:
        first, last = LayerSpec(EmbeddingPipe, m), LayerSpec(HeadPipe, m)
    specs = [first, *[LayerSpec(BlockPipe, m) for _ in range(m.num_layers)], LayerSpec(NormPipe, m), last]
    # boundaries in the spec list: stage s spans [parts[s], parts[s+1])
    parts = [0]
    for s, layers in enumerate(layer_lists):
        end = 1 + layers[-1] + 1
        parts.append(len(specs) if s == len(layer_lists) - 1 else end)

    class ConfiguredPipeline(PipelineModule):
        def _partition_layers(self, method="uniform"):
            self.parts = parts
            self._set_bounds(start=parts[self.stage_id], stop=parts[self.stage_id + 1])

    return ConfiguredPipeline(layers=specs, num_stages=stages, loss_fn=cross_entropy, partition_method="uniform",
                              activation_checkpoint_interval=checkpoint_interval,
                              checkpointable_layers=["BlockPipe"], activation_checkpoint_func=checkpoint_fn,
                              base_seed=cfg.seed)


def pipeline_param_name(name: str, num_layers: int) -> str:
    """Our model's name for a PipelineModule parameter ("3.attention.wq.weight" -> layer 2)."""
    idx, _, rest = name.partition(".")
    if not idx.isdigit():  # a tied module: "tied_modules.embed.tok_embeddings.weight"
        return rest.split(".", 1)[1] if name.startswith("tied_modules.") else name
    i = int(idx)
    if i == 0:
        return rest
    if i <= num_layers:
        return f"layers.{i - 1}.{rest}"
    return rest  # norm.weight, output.weight


# ------------------------------------------------------------------------------------------- measurements
def hold_checkpoint_inputs(out):
    """deepspeed.checkpointing keeps a checkpointed call's inputs on its autograd node, outside the
    saved-tensor hooks: count them until that node's backward has run. Under partition_activations
    an input's ``data`` is emptied and this rank's slice kept as its ``saved_data``
    (checkpointing.py get_partitioned_activations_for_backward): that slice is what is held."""
    first = out if torch.is_tensor(out) else next((o for o in out if torch.is_tensor(o)), None)
    node = getattr(first, "grad_fn", None)
    saved = getattr(node, "deepspeed_saved_tensors", None)
    if not saved:
        return
    held = [M.SAVED.hold(getattr(t, "saved_data", t)) for t in saved if torch.is_tensor(t)]
    node.register_hook(lambda grad_inputs, grad_outputs: held.clear())


def ds_checkpoint(fn, *args):
    import deepspeed

    out = deepspeed.checkpointing.checkpoint(fn, *args)
    hold_checkpoint_inputs(out)
    return out


def _tensors(value, depth=3):
    if torch.is_tensor(value):
        yield value
    elif depth > 0 and isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth - 1)
    elif depth > 0 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, depth - 1)


def _storage_bytes(tensors, exclude=()):
    seen, total = set(exclude), 0
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key and key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def base_optimizer(optimizer):
    """The torch.optim.Optimizer DeepSpeed's wrappers (ZeRO, bf16, fp16) step in the end."""
    seen = set()
    while optimizer is not None and id(optimizer) not in seen:
        if isinstance(optimizer, torch.optim.Optimizer):
            return optimizer
        seen.add(id(optimizer))
        optimizer = getattr(optimizer, "optimizer", None)
    return None


class Memory:
    """Per-rank bytes of the model states: parameters (ZeRO-3: this rank's partition, persistent
    parameters, ZeRO++ hpZ's secondary copy), gradients (when the optimizer step starts), optimizer
    states, fp32 master copies."""

    def __init__(self, engine):
        self.model = engine.module
        self.optimizer = engine.optimizer
        self.grad_bytes = self.param_bytes = 0
        if self.optimizer is not None:
            step = self.optimizer.step

            def measured_step(*args, **kwargs):
                self.grad_bytes = max(self.grad_bytes, self.gradients())
                self.param_bytes = max(self.param_bytes, self.params())
                return step(*args, **kwargs)

            self.optimizer.step = measured_step

    def params(self):
        total = 0
        for p in self.model.parameters():
            part = getattr(p, "ds_tensor", None)
            if part is None:
                total += p.numel() * p.element_size()
            else:
                total += part.numel() * part.element_size()
                if getattr(p, "ds_persist", False):
                    total += p.ds_numel * part.element_size()
            secondary = getattr(p, "ds_secondary_tensor", None)
            if secondary is not None:
                total += secondary.numel() * secondary.element_size()
        return total

    def _model_storages(self):
        keys = set()
        for p in self.model.parameters():
            for t in (p, getattr(p, "ds_tensor", None), getattr(p, "ds_secondary_tensor", None)):
                if t is not None and t.device.type != "meta" and t.untyped_storage().data_ptr():
                    keys.add(t.untyped_storage().data_ptr())
        return keys

    def gradients(self):
        tensors = [p.grad for p in self.model.parameters()]
        opt, seen = self.optimizer, set()
        while opt is not None and id(opt) not in seen and not isinstance(opt, torch.optim.Optimizer):
            seen.add(id(opt))
            for name, value in vars(opt).items():
                if "grad" in name.lower() or "ipg" in name.lower():
                    tensors.extend(_tensors(value))
            opt = getattr(opt, "optimizer", None)
        base = base_optimizer(self.optimizer)
        masters = [p for group in base.param_groups for p in group["params"]] if base is not None else []
        tensors += [p.grad for p in masters]
        weights = self._model_storages() | {p.untyped_storage().data_ptr() for p in masters}
        return _storage_bytes(tensors, exclude=weights)

    def optimizer_states(self):
        base = base_optimizer(self.optimizer)
        return 0 if base is None else _storage_bytes(t for s in base.state.values() for t in _tensors(s))

    def masters(self):
        base = base_optimizer(self.optimizer)
        if base is None:
            return 0
        owned = [p for p in base.state.keys() if torch.is_tensor(p)]
        owned += [p for group in base.param_groups for p in group["params"]]
        model = {id(p) for p in self.model.parameters()}
        return _storage_bytes((p for p in owned if id(p) not in model), exclude=self._model_storages())


# ------------------------------------------------------------------------------------------- init
def load_pretrained(model: nn.Module, cfg: RunConfig, zero3: bool, pipelined: bool) -> str:
    from . import hf

    checkpoint = hf.HFCheckpoint(cfg.init_path)
    mismatches = hf.config_mismatches(cfg.model, checkpoint.config)
    if mismatches:
        raise ConfigError(f"{checkpoint.folder}: config.json does not match the model: " + "; ".join(mismatches))
    rename = hf.hf_name
    if pipelined:
        n = cfg.model.num_layers

        def rename(name):  # noqa: F811 - the pipeline's names first become ours
            return hf.hf_name(pipeline_param_name(name, n))
    assign = None
    if zero3:
        import deepspeed

        def assign(param, value):
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                if torch.distributed.get_rank() == 0:
                    param.data.copy_(value.to(param.dtype))

    loaded = hf.load_hf_weights(model.named_parameters(remove_duplicate=False), checkpoint, rename=rename,
                                assign=assign)
    return f"initialised from {checkpoint.folder} ({loaded['loaded']} tensors)"


# ------------------------------------------------------------------------------------------- checkpoints
def save_checkpoint(engine, cfg: RunConfig, root: Path, step: int, consumed: int) -> Path:
    rank = torch.distributed.get_rank()

    def write(tmp: Path) -> None:
        engine.save_checkpoint(str(tmp), tag=CHECKPOINT_TAG,
                               client_state={"step": step, "consumed_samples": consumed})
        torch.save({"rng": C.rng_state()}, tmp / f"rank_{rank:05d}.pt")

    meta = {"step": step, "consumed_samples": consumed, "global_batch": None, "trainer": "deepspeed",
            "format": "deepspeed engine.save_checkpoint", "tag": CHECKPOINT_TAG, "schedule": cfg.schedule.to_dict(),
            "model": cfg.model.to_dict(), "world_size": torch.distributed.get_world_size()}
    return ckpt.save(root, step, meta, write, rank=rank, barrier=torch.distributed.barrier, keep=cfg.checkpoint.keep)


def load_checkpoint(engine, found: ckpt.Found, cfg: RunConfig) -> tuple[int, int]:
    if found.meta.get("model") not in (None, cfg.model.to_dict()):
        raise ConfigError(f"{found.path}: the checkpoint is of another model shape; start fresh (--no-resume)")
    path, client = engine.load_checkpoint(str(found.path), tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                          load_lr_scheduler_states=False)
    if path is None:
        raise ConfigError(f"{found.path}: DeepSpeed found no checkpoint under tag {CHECKPOINT_TAG!r}")
    extra = found.path / f"rank_{torch.distributed.get_rank():05d}.pt"
    if extra.is_file():
        C.set_rng_state(torch.load(extra, weights_only=False)["rng"])
    return int(client["step"]), int(client["consumed_samples"])


# ------------------------------------------------------------------------------------------- training
def main(argv=None) -> int:
    args = parse_args(argv)
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    on_cpu = get_accelerator().device_name() == "cpu"
    if on_cpu:  # the shared-memory allreduce op is JIT-compiled at process-group init; gloo needs none
        setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)  # noqa: B010
    C.single_process_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        cfg = C.read_config(args)
        ds_path = Path(args.ds_config) if args.ds_config else Path(cfg.base_dir) / "ds_config.json"
        ds_raw = json.loads(ds_path.read_text())
    except (ValueError, OSError) as exc:
        if local_rank == 0:
            print(f"deepspeed_train.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    C.install_stop_handlers()
    deepspeed.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()

    def log(msg):
        if rank == 0:
            print(f"[ds_train] {msg}", flush=True)

    try:
        ds, changes = adapt_ds_config(ds_raw, args, cfg, world, on_cpu)
        check_ds_config(ds, world, ds_path)
        tp = ds.get("tensor_parallel", {}).get("autotp_size", 1) or 1
        stages = ds["pipeline"]["stages"] if "pipeline" in ds else 1
        if world % (tp * stages):
            raise ConfigError(f"{world} processes do not split into autotp_size {tp} x pipeline stages {stages}; "
                              f"launch a multiple of {tp * stages}")
        par = cfg.parallel
        par = replace(par, tp=tp, pp=stages, vpp=1, dp_shard=world // (tp * stages), dp_replicate=1, cp=1,
                      stage_layers=par.stage_layers if stages == par.pp and par.vpp == 1 else None)
        cfg = C.apply_args(cfg.with_changes(parallel=par), args, {})
        cfg = cfg.with_changes(batch=replace(cfg.batch, micro_batch=ds["train_micro_batch_size_per_gpu"],
                                             grad_accum=ds["gradient_accumulation_steps"]))
    except (ValueError, OSError) as exc:
        if rank == 0:
            print(f"deepspeed_train.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    for c in changes:
        log(f"config {c['key']}: {c['from']} -> {c['to']} ({c['why']})")
    torch.manual_seed(cfg.seed)
    recompute = cfg.parallel.recompute
    pipelined = "pipeline" in ds
    zero3 = ds.get("zero_optimization", {}).get("stage", 0) == 3 and not pipelined
    if pipelined:
        model = pipeline_model(cfg, stages, ds_checkpoint, 1 if recompute == "full" else 0)
        init_module_weights(model, cfg.model)
    else:
        with deepspeed.zero.Init(config_dict_or_path=ds, enabled=zero3):
            model = Transformer(cfg.model)
        if zero3:  # zero.Init partitioned each parameter as its module was built: initialise them gathered
            init_module_weights(model, cfg.model,
                                gather=lambda ps: deepspeed.zero.GatheredParameters(ps, modifier_rank=0))
        if recompute == "full":
            model.checkpoint_block = ds_checkpoint
    if recompute == "selective":
        for module in model.modules():
            if hasattr(module, "checkpoint_core"):
                module.checkpoint_core = ds_checkpoint
    init_note = load_pretrained(model, cfg, zero3, pipelined) if cfg.init else None
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in {id(p): p for p in model.parameters()}.values()) \
        if zero3 else count_parameters(model)
    groups = weight_decay_groups(model.named_parameters(), cfg.optimizer.weight_decay)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds)
    memory = Memory(engine)
    if "activation_checkpointing" in ds:
        ac = ds["activation_checkpointing"]
        mpu = importlib.import_module("deepspeed.utils.groups") if tp > 1 else None
        deepspeed.checkpointing.configure(
            mpu, partition_activations=ac.get("partition_activations", False),
            checkpoint_in_cpu=ac.get("cpu_checkpointing", False),
            contiguous_checkpointing=ac.get("contiguous_memory_optimization", False),
            num_checkpoints=ac.get("number_checkpoints"), synchronize=ac.get("synchronize_checkpoint_boundary", False),
            profile=ac.get("profile", False))
    if pipelined:
        dp_rank, dp_size = engine.grid.get_data_parallel_id(), engine.grid.get_data_parallel_world_size()
        counts = [None] * engine.grid.get_pipe_parallel_world_size()
        torch.distributed.all_gather_object(counts, num_params, group=engine.grid.get_pipe_parallel_group())
        num_params = sum(counts)
    else:
        dp_rank, dp_size = rank // tp, world // tp
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    device = torch.device(get_accelerator().current_device_name())

    root = C.checkpoint_root(cfg)
    start_step, consumed, resumed_from = 0, 0, None
    found = None if args.no_resume else ckpt.latest(root)
    if found is not None:
        start_step, consumed = load_checkpoint(engine, found, cfg)
        resumed_from = start_step
    samples = C.open_run_samples(cfg)
    per_rank = micro * gas
    tokens_per_step = per_rank * dp_size * cfg.batch.seq_len
    log(f"{cfg.name}: layout {cfg.layout_tag} on {world} processes ({'cpu' if on_cpu else 'gpu'}); "
        f"zero {ds.get('zero_optimization', {}).get('stage', 0)} tp {tp} pp {stages}; {per_rank * dp_size} sequences x "
        f"{cfg.batch.seq_len} tokens per step; steps {start_step + 1}..{cfg.train_steps}; data "
        f"{'synthetic' if cfg.data.synthetic else ', '.join(s.prefix for s in cfg.data.sources)}"
        + (f"; resumed from step {resumed_from}" if resumed_from is not None else "")
        + (f"; {init_note}" if init_note else ""))

    if args.dump_logits:
        if pipelined:
            raise ConfigError("--dump-logits needs a config without a pipeline section")
        x, _ = C.step_batch(samples, consumed, dp_rank, micro, device)
        with torch.no_grad():
            logits = engine(x)
        if rank == 0:
            C.dump_logits(args.dump_logits, x, logits)
    losses, loss_steps, lrs, times, saved_at = [], [], [], [], []
    step, stopped = start_step, False
    with M.SAVED.hooks():
        for step in range(start_step + 1, cfg.train_steps + 1):
            t0 = time.perf_counter()
            lr = cfg.schedule.lr_at(step)
            for group in engine.optimizer.param_groups:
                group["lr"] = lr
            inputs, targets = C.step_batch(samples, consumed, dp_rank, per_rank, device)
            batches = [(inputs[i * micro:(i + 1) * micro], targets[i * micro:(i + 1) * micro]) for i in range(gas)]
            if pipelined:
                loss = engine.train_batch(data_iter=iter(batches)).detach().float()
            else:
                micro_losses = []
                for x, y in batches:
                    out = cross_entropy(engine(x), y)
                    engine.backward(out)
                    engine.step()
                    micro_losses.append(out.detach().float())
                loss = torch.stack(micro_losses).mean()
                torch.distributed.all_reduce(loss)
                loss = loss / world
            consumed += per_rank * dp_size
            flag = torch.tensor([float(C.STOP["signal"])], device=device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            dt = time.perf_counter() - t0
            losses.append(loss.item())
            loss_steps.append(step)
            lrs.append(lr)
            times.append(dt)
            log(f"step {step}/{cfg.train_steps} loss {losses[-1]:.4f} lr {lr:.3e} "
                f"time {dt:.2f}s tokens/s {tokens_per_step / dt:.0f}")
            signalled = flag.item() > 0
            if root is not None and (C.should_save(cfg.checkpoint, step) or signalled):
                saved_at.append(str(save_checkpoint(engine, cfg, root, step, consumed)))
                log(f"checkpoint saved: step {step} -> {saved_at[-1]}")
            if signalled:
                stopped = True
                log(f"stop signal: stopped after step {step}"
                    + (" (checkpoint saved; requeue to resume)" if root is not None else ""))
                break
    if (not stopped and root is not None and cfg.checkpoint.save_at_end and step > start_step
            and (not saved_at or not saved_at[-1].endswith(f"{step:09d}"))):
        saved_at.append(str(save_checkpoint(engine, cfg, root, step, consumed)))

    record = {
        "rank": rank,
        "param_bytes": max(memory.param_bytes, memory.params()),
        "grad_bytes": memory.grad_bytes,
        "optimizer_bytes": memory.optimizer_states(),
        "master_bytes": memory.masters(),
        "saved_activation_bytes": M.SAVED.peak,
        "peak_memory_bytes": M.peak_memory_bytes(device),
        "mean_step_time_s": sum(times) / len(times) if times else 0.0,
    }
    records = [None] * world
    torch.distributed.all_gather_object(records, record)
    if rank == 0:
        later = times[1:] or times
        zero = ds.get("zero_optimization", {})
        C.print_json({
            SUMMARY_KEY: 1, "plan": cfg.name, "layout": cfg.layout_tag, "world_size": world, "device": device.type,
            "backend": torch.distributed.get_backend(), "zero_stage": zero.get("stage", 0),
            "offload_optimizer": zero.get("offload_optimizer", {}).get("device", "none"),
            "offload_param": zero.get("offload_param", {}).get("device", "none"),
            "pipeline_stages": stages, "autotp_size": tp, "dp_size": dp_size,
            "stage_layers": cfg.parallel.stages(cfg.model.num_layers) if pipelined else None,
            "precision": "bf16" if ds.get("bf16", {}).get("enabled") else (
                "fp16" if ds.get("fp16", {}).get("enabled") else "fp32"),
            "grad_accum_dtype": ds.get("data_types", {}).get("grad_accum_dtype"),
            "communication_data_type": ds.get("communication_data_type"),
            "optimizer": type(base_optimizer(engine.optimizer) or engine.optimizer).__name__,
            "model": cfg.model.to_dict(), "num_params": num_params, "micro_batch": micro, "grad_accum": gas,
            "train_batch_size": engine.train_batch_size(), "seq_len": cfg.batch.seq_len,
            "data": "synthetic" if cfg.data.synthetic else "indexed", "config_changes": changes,
            "steps": len(losses), "requested_steps": cfg.train_steps - start_step, "last_step": step,
            "resumed_from_step": resumed_from, "stopped_by_signal": stopped, "checkpoints": saved_at,
            "losses": losses, "loss_steps": loss_steps, "lrs": lrs,
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "mean_step_time_s": sum(times) / len(times) if times else 0.0,
            "mean_step_time_s_after_first": sum(later) / len(later) if later else 0.0,
            "init": init_note, "ranks": records,
        })
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    C.finish(main())
