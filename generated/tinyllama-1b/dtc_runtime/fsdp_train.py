"""The FSDP2 trainer: ``torchrun ... fsdp_train.py [--config train_config.json] [--steps N]``.

Builds the mesh, the model (the runtime's Transformer of the configured shape, on the meta device
above 2B parameters and materialised after sharding), optionally loads a Hugging Face Llama
checkpoint into the shards (``init``), and trains on the configured data (Megatron indexed
datasets, blended) with AdamW (weight decay on matrices and embeddings only), the configured
learning-rate schedule and gradient clipping.

Checkpoints (``checkpoint.dir``): torch.distributed.checkpoint, sharded, of the model and the
optimizer (one per pipeline stage module, flattened FQN keys), plus per-rank RNG state and the loss
scaler; ``meta.json`` holds the step, the samples consumed and the schedule. Saved every
``interval_steps``, on SIGUSR1/SIGTERM (after the current step, then exit 0 for the requeue) and at
the end. A start resumes from the newest complete checkpoint (checkpoint.py).

Rank 0 prints one line per step and, at the end, one JSON line (``dtc_fsdp_summary``) with the
losses and per-rank measurements (parameter, gradient and optimizer-state bytes, the peak bytes kept
for backward, the peak allocation). Options may also come from DTC_SMOKE_<OPTION>.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

if __package__ in (None, ""):  # run as a script from a generated folder: import the package beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = Path(__file__).resolve().parent.name  # noqa: A001

from . import checkpoint as ckpt  # noqa: E402
from . import common as C  # noqa: E402
from . import measure as M  # noqa: E402
from . import parallel as P  # noqa: E402
from .config import ConfigError, RunConfig  # noqa: E402
from .model import Transformer, count_parameters, cross_entropy, weight_decay_groups  # noqa: E402

SUMMARY_KEY = "dtc_fsdp_summary"
META_BUILD_PARAMS = 2e9
_AXES = ("tp", "pp", "cp", "dp_shard", "dp_replicate", "vpp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="dtc FSDP2 trainer", allow_abbrev=False)
    C.add_common_args(p, Path.cwd() / "train_config.json")
    for axis in _AXES:
        p.add_argument(f"--{axis.replace('_', '-')}", type=int, default=None, help=f"override the {axis} degree")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--build-on", choices=("auto", "host", "meta"), default="auto",
                   help="build the model on the device or on meta (materialised after sharding); auto: meta "
                        f"above {META_BUILD_PARAMS:.0e} parameters")
    p.add_argument("--param-dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="parameter/compute dtype instead of the config's (e.g. bf16 for an fp16 plan on CPU)")
    C.defaults_from_env(p)
    args = p.parse_args(argv)
    for name in ("steps", "micro_batch", "grad_accum"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def configure(args: argparse.Namespace, world: int) -> RunConfig:
    cfg = C.read_config(args)
    overrides = {a: getattr(args, a) for a in _AXES}
    if overrides.get("dp_shard") == -1:
        rest = 1
        for a in ("tp", "pp", "cp", "dp_replicate"):
            rest *= overrides[a] if overrides[a] is not None else getattr(cfg.parallel, a)
        if world % rest:
            raise P.MeshSizeError(f"--dp-shard -1 needs WORLD_SIZE divisible by the other degrees ({rest})")
        overrides["dp_shard"] = world // rest
    cfg = C.apply_args(cfg, args, overrides)
    if args.param_dtype:
        cfg = cfg.with_changes(param_dtype=C.param_dtype_name(args.param_dtype))
    P.check_world(cfg.parallel, world)
    check_model_fits(cfg)
    return cfg


def check_model_fits(cfg: RunConfig) -> None:
    """The divisibility rules of the layout for this model shape (ValueError with the rule)."""
    m, par, b = cfg.model, cfg.parallel, cfg.batch
    rules = [
        (m.num_attention_heads % par.tp == 0, f"tp={par.tp} must divide the attention heads ({m.num_attention_heads})"),
        (m.num_kv_heads % par.tp == 0, f"tp={par.tp} must divide the KV heads ({m.num_kv_heads})"),
        (m.ffn_hidden_size % par.tp == 0, f"tp={par.tp} must divide the FFN width ({m.ffn_hidden_size})"),
        (m.vocab_size % par.tp == 0, f"tp={par.tp} must divide the vocabulary ({m.vocab_size})"),
        (not par.sequence_parallel or b.seq_len % par.tp == 0,
         f"sequence parallel needs tp={par.tp} to divide the sequence length ({b.seq_len})"),
        (par.cp == 1 or b.seq_len % (2 * par.cp) == 0,
         f"context parallel needs 2 x cp={2 * par.cp} to divide the sequence length ({b.seq_len})"),
        (par.pp == 1 or b.grad_accum >= par.pp,
         f"pipeline microbatches (grad_accum={b.grad_accum}) must be at least pp={par.pp}"),
        (par.vpp == 1 or b.grad_accum % par.pp == 0,
         f"interleaved 1F1B needs grad_accum ({b.grad_accum}) divisible by pp={par.pp}"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)
    par.stages(m.num_layers)  # raises ConfigError if the split does not fit


# ------------------------------------------------------------------------------------------- checkpoints
def _state(parts, optimizers):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd, optim_sd = {}, {}
    for part, opt in zip(parts, optimizers, strict=True):
        m, o = get_state_dict(part, opt, options=options)
        model_sd.update(m)
        optim_sd.update(o)
    return {"model": model_sd, "optim": optim_sd}


def save_checkpoint(cfg: RunConfig, root: Path, step: int, consumed: int, parts, optimizers, scaler) -> Path:
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()

    def write(tmp: Path) -> None:
        dcp.save(_state(parts, optimizers), checkpoint_id=str(tmp))
        torch.save({"rng": C.rng_state(), "scaler": scaler.state_dict()}, tmp / f"rank_{rank:05d}.pt")

    meta = {"step": step, "consumed_samples": consumed, "global_batch": cfg.global_batch, "trainer": "fsdp2",
            "format": "torch.distributed.checkpoint", "schedule": cfg.schedule.to_dict(),
            "model": cfg.model.to_dict(), "layout": cfg.parallel.describe(), "world_size": dist.get_world_size(),
            "torch": torch.__version__}
    return ckpt.save(root, step, meta, write, rank=rank, barrier=dist.barrier, keep=cfg.checkpoint.keep)


def load_checkpoint(found: ckpt.Found, cfg: RunConfig, parts, optimizers, scaler) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    saved_model = found.meta.get("model")
    if saved_model is not None and saved_model != cfg.model.to_dict():
        raise ConfigError(f"{found.path}: the checkpoint is of another model shape; start fresh (--no-resume) "
                          "or point --checkpoint-dir elsewhere")
    state = _state(parts, optimizers)
    dcp.load(state, checkpoint_id=str(found.path))
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    for part, opt in zip(parts, optimizers, strict=True):
        names = set(part.state_dict().keys())
        set_state_dict(part, opt, model_state_dict={k: v for k, v in state["model"].items() if k in names},
                       optim_state_dict=state["optim"], options=options)
    extra = found.path / f"rank_{dist.get_rank():05d}.pt"
    if extra.is_file():
        saved = torch.load(extra, weights_only=False)
        C.set_rng_state(saved["rng"])
        scaler.load_state_dict(saved["scaler"])


# ------------------------------------------------------------------------------------------- training
def build_optimizers(cfg: RunConfig, parts) -> list[torch.optim.Optimizer]:
    o = cfg.optimizer
    out: list[torch.optim.Optimizer] = []
    for part in parts:
        groups = weight_decay_groups(part.named_parameters(), o.weight_decay)
        if o.name == "sgd":
            out.append(torch.optim.SGD(groups, lr=cfg.schedule.peak_lr, momentum=o.beta1))
        else:
            cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
            out.append(cls(groups, lr=cfg.schedule.peak_lr, betas=(o.beta1, o.beta2), eps=o.eps))
    return out


def train(cfg: RunConfig, args: argparse.Namespace, device: torch.device) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    par, b = cfg.parallel, cfg.batch
    mesh = P.build_mesh(device.type, par)
    dp_index, dp_size = P.dp_coordinate(mesh, par)
    torch.manual_seed(cfg.seed)  # identical weights on every rank before sharding
    approx = cfg.model.num_layers * 12 * cfg.model.hidden_size ** 2 + 2 * cfg.model.vocab_size * cfg.model.hidden_size
    meta = args.build_on == "meta" or (args.build_on == "auto" and approx > META_BUILD_PARAMS)
    with torch.device("meta" if meta else device):
        model = Transformer(cfg.model)
    num_params = count_parameters(model)

    scaler = P.LossScaler(enabled=cfg.param_dtype == "float16")
    pipe = None
    if par.pp > 1:
        pipe = P.build_pipeline(model, mesh, par, device=device, n_microbatches=b.grad_accum,
                                loss_fn=lambda logits, targets: scaler.scale_loss(cross_entropy(logits, targets)),
                                param_dtype=cfg.param_dtype, reduce_dtype=cfg.reduce_dtype)
        parts = pipe.modules
        pp_group = mesh["pp"].get_group()
    else:
        parts = [P.parallelize(model, mesh, par, cfg.param_dtype, cfg.reduce_dtype)]
        pp_group = None
    for part in parts:
        if any(p.is_meta for p in part.parameters()):
            part.to_empty(device=device)
            with torch.no_grad():
                part.init_weights()
    init_note = None
    if cfg.init:
        from . import hf

        checkpoint = hf.HFCheckpoint(cfg.init_path)
        mismatches = hf.config_mismatches(cfg.model, checkpoint.config)
        if mismatches:
            raise ConfigError(f"{checkpoint.folder}: config.json does not match the model: " + "; ".join(mismatches))
        loaded = sum(hf.load_hf_weights(part.named_parameters(remove_duplicate=False), checkpoint)["loaded"]
                     for part in parts)
        init_note = f"initialised from {checkpoint.folder} ({loaded} tensors on this rank's stages)"
    tied = None
    if par.pp > 1 and cfg.model.tied_embeddings:  # decided from the config: sharding rebinds the weights
        tied = P.TiedEmbeddings(parts, mesh)
        tied.sync_weights()
    sac_counted = M.count_sac_caches(parts)
    remat_counted = M.count_recomputation() if par.recompute != "none" else None
    params = [p for part in parts for p in part.parameters()]
    # ZeRO-2 and ZeRO-0 (fully_shard over a shard group of one, parallel.py) keep the unsharded 16-bit parameters
    # between forward and backward (reshard_after_forward=False): part of the model states
    unsharded = M.UnshardedParams(parts, params) if par.zero_stage in (0, 2) else None
    # the gradient norm counts a tied embedding once (Megatron: param_is_not_shared)
    norm_params = [p for p in params if tied is None or tied.embedding is not None or p is not tied.head]
    optimizers = build_optimizers(cfg, parts)

    root = C.checkpoint_root(cfg)
    start_step, consumed, resumed_from = 0, 0, None
    found = None if args.no_resume else ckpt.latest(root)
    if found is not None:
        load_checkpoint(found, cfg, parts, optimizers, scaler)
        start_step, consumed, resumed_from = found.step, int(found.meta["consumed_samples"]), found.step
    samples = C.open_run_samples(cfg)
    per_rank = b.micro_batch * b.grad_accum
    if rank == 0:
        print(f"dtc fsdp_train: {cfg.name} ({cfg.layout_tag}); mesh {par.describe()}; "
              f"{'pipeline ' + par.schedule + ' x ' + str(b.grad_accum) + ' microbatches; ' if pipe else ''}"
              f"zero {par.zero_stage} param_dtype={cfg.param_dtype} offload={par.offload} ac={par.recompute}; "
              f"model {num_params / 1e6:.2f}M params; data "
              f"{'synthetic' if cfg.data.synthetic else ', '.join(s.prefix for s in cfg.data.sources)}; "
              f"device {device.type}" + (f"; resumed from step {resumed_from}" if resumed_from is not None else "")
              + (f"; {init_note}" if init_note else ""), flush=True)

    if args.dump_logits:
        if pipe is not None:
            raise ConfigError("--dump-logits needs pp=1 (one module computing the logits)")
        x, _ = C.step_batch(samples, consumed, dp_index, b.micro_batch, device)
        with torch.no_grad():
            logits = parts[0](x)
        if rank == 0:
            C.dump_logits(args.dump_logits, x, logits)
    losses, loss_steps, times, grad_bytes, saved_at = [], [], [], 0, []
    step, stopped = start_step, False
    with M.SAVED.hooks():
        for step in range(start_step + 1, cfg.train_steps + 1):
            t0 = time.perf_counter()
            lr = cfg.schedule.lr_at(step)
            for opt in optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr
            inputs, targets = C.step_batch(samples, consumed, dp_index, per_rank, device)
            if pipe is not None:
                with P.cp_context(mesh, par, parts, inputs, targets):
                    loss = pipe.step(inputs, targets)
                local = loss / scaler.scale if loss is not None else torch.zeros((), device=device)
                has = 1.0 if loss is not None else 0.0
            else:
                local, has = torch.zeros((), device=device), 1.0
                mb = b.micro_batch
                for i in range(b.grad_accum):
                    x, y = inputs[i * mb:(i + 1) * mb].contiguous(), targets[i * mb:(i + 1) * mb].contiguous()
                    P.set_grad_sync(parts, i == b.grad_accum - 1, par)
                    with P.cp_context(mesh, par, parts, x, y):
                        micro_loss = cross_entropy(parts[0](x), y) / b.grad_accum
                        scaler.scale_loss(micro_loss).backward()
                    local += micro_loss.detach().float()
            if tied is not None:
                tied.sync_grads()
            take, norm = scaler.unscale_(params, P.grad_norm(norm_params, pp_group))
            if take:
                P.clip_grads(params, cfg.optimizer.grad_clip, norm)
                for opt in optimizers:
                    opt.step()
            grad_bytes = M.local_bytes(p.grad for p in params)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            consumed += per_rank * dp_size
            stats = torch.tensor([local.item() * has, has, float(C.STOP["signal"])], device=device)
            dist.all_reduce(stats[:2])
            dist.all_reduce(stats[2:], op=dist.ReduceOp.MAX)
            loss_value = (stats[0] / stats[1]).item()
            elapsed = time.perf_counter() - t0
            losses.append(loss_value)
            loss_steps.append(step)
            times.append(elapsed)
            if rank == 0:
                print(f"step {step}/{cfg.train_steps} loss {loss_value:.4f} lr {lr:.3e} grad_norm {float(norm):.4f} "
                      f"time {elapsed:.3f}s tokens/s {per_rank * dp_size * b.seq_len / elapsed:.0f}", flush=True)
            signalled = stats[2].item() > 0
            if root is not None and (C.should_save(cfg.checkpoint, step) or signalled):
                saved_at.append(str(save_checkpoint(cfg, root, step, consumed, parts, optimizers, scaler)))
                if rank == 0:
                    print(f"checkpoint saved: step {step} -> {saved_at[-1]}", flush=True)
            if signalled:
                stopped = True
                if rank == 0:
                    print(f"stop signal: stopped after step {step}"
                          + (" (checkpoint saved; requeue to resume)" if root is not None else ""), flush=True)
                break
    if (not stopped and root is not None and cfg.checkpoint.save_at_end and step > start_step
            and (not saved_at or not saved_at[-1].endswith(f"{step:09d}"))):
        saved_at.append(str(save_checkpoint(cfg, root, step, consumed, parts, optimizers, scaler)))

    record = {
        "rank": rank,
        "coords": {name: mesh[name].get_local_rank() for name in P.MESH_DIM_NAMES},
        "param_bytes": M.local_bytes(params) + (unsharded.peak if unsharded is not None else 0),
        "grad_bytes": grad_bytes,
        "optimizer_bytes": sum(M.optimizer_state_bytes(o) for o in optimizers),
        "saved_activation_bytes": M.SAVED.peak,
        "peak_memory_bytes": M.peak_memory_bytes(device),
        "mean_step_time_s": sum(times) / len(times) if times else 0.0,
    }
    records: list = [None] * world
    dist.all_gather_object(records, record)
    if rank == 0:
        later = times[1:] or times
        C.print_json({
            SUMMARY_KEY: 1, "plan": cfg.name, "layout": cfg.layout_tag, "world_size": world,
            "mesh": {n: getattr(par, n) for n in P.MESH_DIM_NAMES}, "vpp": par.vpp,
            "schedule": par.schedule if pipe else None, "stage_layers": par.stages(cfg.model.num_layers),
            "device": device.type, "backend": dist.get_backend(), "zero_stage": par.zero_stage,
            "reshard_after_forward": par.zero_stage == 3, "param_dtype": cfg.param_dtype, "offload": par.offload,
            "ac_mode": par.recompute, "sac_cache_counted": None if sac_counted is None else sac_counted(),
            "recompute_counted": remat_counted,
            "num_params": num_params, "micro_batch": b.micro_batch, "grad_accum": b.grad_accum,
            "seq_len": b.seq_len, "data": "synthetic" if cfg.data.synthetic else "indexed",
            "steps": len(losses), "requested_steps": cfg.train_steps - start_step, "last_step": step,
            "resumed_from_step": resumed_from, "stopped_by_signal": stopped, "checkpoints": saved_at,
            "losses": losses, "loss_steps": loss_steps,
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "mean_step_time_s": sum(times) / len(times) if times else 0.0,
            "mean_step_time_s_after_first": sum(later) / len(later) if later else 0.0,
            "init": init_note, "ranks": records,
        })
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    C.single_process_env()
    world, local_rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    try:
        cfg = configure(args, world)
    except (ValueError, OSError) as exc:  # ConfigError, MeshSizeError, a layout rule the model breaks
        if local_rank == 0:
            print(f"fsdp_train.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cfg.parallel.cp > 1 and not use_cuda:
        print(f"fsdp_train.py: error: context parallel (cp={cfg.parallel.cp}) needs CUDA: torch {torch.__version__} "
              "has no CPU sharding rule for scaled_dot_product_attention; use --cp 1 on CPU", file=sys.stderr)
        return 2
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    C.install_stop_handlers()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        return train(cfg, args, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    C.finish(main())
