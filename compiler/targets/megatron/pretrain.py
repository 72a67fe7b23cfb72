"""The smoke worker for the Megatron target: Megatron-LM's pretrain_gpt.py, wired as it is wired.

Run by ``dtc smoke --target megatron`` under torchrun (``torchrun ... -m
compiler.targets.megatron.pretrain MEGATRON_ARGS...``), one process per rank, with the generated
megatron_args.sh's arguments (scaled down, plus the CPU path's flags; see compiler/smoke/megatron.py).

What runs is megatron-core 0.19.2's own ``megatron.training.pretrain``: argument parsing and
validation, initialisation, model build, DDP / distributed optimizer, the pipeline schedules,
the training loop and its log lines, checkpoint save/load. The wheel has no pretrain_gpt.py, so
the four pieces that script contributes are here, as Megatron-LM tag core_v0.19.0 writes them
(pretrain_gpt.py, gpt_builders.py, model_provider.py), for the plain GPT path (no SFT, FIM,
ModelOpt, distillation, packed sequences; an artifact asking for those fails with a clear error):
``model_provider`` (gpt_builders.gpt_builder: the spec by transformer impl / MoE, GPTModel),
``train_valid_test_datasets_provider`` (MockGPTDataset for --mock-data, else GPTDataset over the
artifact's --data-path), ``forward_step`` (get_batch, the model call, loss_func) and
``get_embedding_ranks``.

Without GPUs, ``compiler.targets.megatron.cpu.install()`` runs first (the CUDA-to-CPU layer); with
GPUs nothing is bridged. After training, each rank prints one ``dtc_megatron_rank`` JSON line:
its parameter, gradient-buffer and optimizer-state bytes, the peak bytes autograd saved for
backward (measured with the generated trainers' own counter, compiler/runtime/measure.py),
and its peak resident set (CPU) or peak allocated bytes (GPU).
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from functools import partial
from typing import Any

_PROGRAM_START_TIME = time.time()

import torch  # noqa: E402

if not torch.cuda.is_available():
    from compiler.targets.megatron import cpu as megatron_cpu

    megatron_cpu.install()
else:
    from compiler.targets.megatron.cpu import python_shims

    python_shims()

from compiler.targets.megatron.smoke import (  # noqa: E402 - the runner's names, one home
    PLAN_ARGS_ENV, PLAN_CONFIG_ARGS_ENV, PLAN_CONNECTIONS_ENV, PLAN_WORLD_ENV, SUMMARY_KEY, UNSET,
    validate_args_past_te_version)

UNSUPPORTED = ("sft", "fim_data", "logits_load_dir", "yaml_cfg", "spec", "heterogeneous_layers_config_path",
               "experimental_attention_variant", "mtp_num_layers", "hybrid_context_parallel",
               "dataloader_inter_document_masking")

_CAPTURED: dict[str, Any] = {}


from compiler.runtime.common import print_json  # noqa: E402
from compiler.runtime.measure import SAVED  # noqa: E402 - the generated trainers' own counter (one home)


# ------------------------------------------------------------------------------------------- model
def gpt_builder(args, pre_process, post_process, vp_stage=None, config=None, pg_collection=None):
    """gpt_builders.py:gpt_builder (core_v0.19.0) for the decoder-only GPT path."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.training import print_rank_0
    from megatron.training.arguments import core_transformer_config_from_args

    print_rank_0("building GPT model ...")
    if config is None:
        config = core_transformer_config_from_args(args)
    use_te = args.transformer_impl == "transformer_engine"
    if args.num_experts:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization=args.normalization,
                                          qk_l2_norm=args.qk_l2_norm, vp_stage=vp_stage)
    elif use_te:
        spec = get_gpt_layer_with_transformer_engine_spec(
            config.num_moe_experts, config.moe_grouped_gemm, config.qk_layernorm, config.multi_latent_attention,
            config.experimental_attention_variant, qk_l2_norm=config.qk_l2_norm, use_kitchen=config.use_kitchen,
            use_te_activation_func=config.use_te_activation_func,
            use_kitchen_attention=config.use_kitchen_attention,
            kitchen_attention_backend=config.kitchen_attention_backend,
            mla_down_proj_fusion=getattr(config, "mla_down_proj_fusion", False),
            use_grouped_gemm_for_dense_mlp=config.use_grouped_gemm_for_dense_mlp)
    else:
        spec = get_gpt_layer_local_spec(
            config.num_moe_experts, config.moe_grouped_gemm, config.qk_layernorm, config.multi_latent_attention,
            config.experimental_attention_variant, normalization=config.normalization,
            use_kitchen=config.use_kitchen, use_kitchen_attention=config.use_kitchen_attention,
            kitchen_attention_backend=config.kitchen_attention_backend)
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process, post_process=post_process,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy, parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling, mtp_block_spec=None,
        vp_stage=vp_stage, pg_collection=pg_collection)


def model_provider(model_builder, pre_process=True, post_process=True, vp_stage=None, config=None,
                   pg_collection=None):
    """model_provider.py:model_provider (core_v0.19.0), without ModelOpt and memory-history recording."""
    from megatron.training import get_args

    return model_builder(get_args(), pre_process, post_process, vp_stage, config=config, pg_collection=pg_collection)


# ------------------------------------------------------------------------------------------- data
BATCH_KEYS = ["attention_mask", "cu_seqlens", "cu_seqlens_padded", "hybrid_cp_group", "labels", "local_cp_size",
              "loss_mask", "max_seqlen", "position_ids", "tokens"]


def get_batch(data_iterator, vp_stage=None):
    """pretrain_gpt.py:get_batch (core_v0.19.0) without packed sequences."""
    from megatron.core import mpu
    from megatron.core.parallel_state import get_context_parallel_group, get_hybrid_data_context_parallel_groups
    from megatron.core.utils import get_batch_on_this_cp_rank, get_batch_on_this_tp_rank
    from megatron.training import get_args
    from megatron.training.utils import is_first_or_last_pipeline_stage

    args = get_args()
    if not is_first_or_last_pipeline_stage(vp_stage):
        return [None for _ in BATCH_KEYS]
    tp_rank = mpu.get_tensor_model_parallel_rank()
    batch: dict[str, Any] = {}
    if tp_rank == 0:
        batch = next(data_iterator)
        for key in BATCH_KEYS:
            batch[key] = batch[key].cuda(non_blocking=True) if batch.get(key) is not None else None
    batch = get_batch_on_this_tp_rank(
        batch, broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(), has_cu_seqlens=False, is_hybrid_cp=False,
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
        cp_size=args.context_parallel_size, tp_rank=tp_rank, micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length, mtp_on_this_rank=False,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        is_pipeline_first_stage=mpu.is_pipeline_first_stage(), is_pipeline_last_stage=mpu.is_pipeline_last_stage())
    batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=get_context_parallel_group(),
                                      hybrid_cp_group_func=get_hybrid_data_context_parallel_groups)
    return [batch.get(key) for key in BATCH_KEYS]


def loss_func(loss_mask, output_tensor, model=None):
    """pretrain_gpt.py:loss_func (core_v0.19.0): summed token loss, token count, the 'lm loss' report."""
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.training import get_args

    args = get_args()
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
    if args.check_for_nan_in_loss_and_grad:
        machine = get_rerun_state_machine()
        machine.validate_result(result=loss, rejection_func=torch.isnan,
                                message="found NaN in local forward loss calculation", tolerance=0.0, fatal=True)
        machine.validate_result(result=loss, rejection_func=torch.isinf,
                                message="found Inf in local forward loss calculation", tolerance=0.0, fatal=True)
    return loss, num_tokens, report


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    """pretrain_gpt.py:forward_step (core_v0.19.0); the forward runs inside the saved-tensor counter."""
    from megatron.core.utils import get_attr_wrapped_model
    from megatron.training import get_timers

    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    vp_stage = get_attr_wrapped_model(model, "vp_stage")
    batch = dict(zip(BATCH_KEYS, get_batch(data_iterator, vp_stage)))
    timers("batch-generator").stop()
    if return_schedule_plan:
        raise RuntimeError("dtc smoke: --overlap-moe-expert-parallel-comm schedule plans are not wired here")
    with SAVED.hooks():
        output_tensor = model(batch["tokens"], batch["position_ids"], batch["attention_mask"],
                              labels=batch["labels"], loss_mask=batch["loss_mask"])
    return output_tensor, partial(loss_func, batch["loss_mask"], model=model)


def is_dataset_built_on_rank(vp_stage=None):
    from megatron.core import mpu
    from megatron.training.utils import is_first_or_last_pipeline_stage

    return mpu.get_tensor_model_parallel_rank() == 0 and is_first_or_last_pipeline_stage(vp_stage)


def core_gpt_dataset_config_from_args(args):
    """pretrain_gpt.py:core_gpt_dataset_config_from_args (core_v0.19.0), GPT path."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training.utils import get_blend_and_blend_per_split

    blend, blend_per_split = get_blend_and_blend_per_split(args)
    return GPTDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, blend=blend, blend_per_split=blend_per_split,
        split=args.split, multiple_validation_sets=args.multiple_validation_sets,
        full_validation=args.full_validation, num_dataset_builder_threads=args.num_dataset_builder_threads,
        path_to_cache=args.data_cache_path, mmap_bin_files=args.mmap_bin_files, tokenizer=build_tokenizer(args),
        reset_position_ids=args.reset_position_ids, reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss, create_attention_mask=args.create_attention_mask_in_dataloader,
        object_storage_cache_path=args.object_storage_cache_path,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus,
        allow_ambiguous_pad_tokens=args.allow_ambiguous_pad_tokens,
        fast_cache_load=args.dataloader_fast_cache_load, sequences_per_dataset=None,
        defer_npy_index_mmap=args.dataloader_defer_npy_index_mmap,
        context_parallel_size=args.context_parallel_size, data_parallel_size=args.data_parallel_size,
        sequence_parallel_size=args.tensor_model_parallel_size * args.sequence_parallel,
        hybrid_context_parallel=False, inter_document_masking=False)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """pretrain_gpt.py:train_valid_test_datasets_provider (core_v0.19.0): mock or indexed GPT data."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, MockGPTDataset
    from megatron.training import get_args, print_rank_0

    args = get_args()
    dataset_type = MockGPTDataset if args.mock_data else GPTDataset
    print_rank_0("> building train, validation, and test datasets for GPT ...")
    built = BlendedMegatronDatasetBuilder(dataset_type, train_val_test_num_samples,
                                         partial(is_dataset_built_on_rank, vp_stage=vp_stage),
                                         core_gpt_dataset_config_from_args(args)).build()
    print_rank_0("> finished creating GPT datasets ...")
    return built


# megatron's pretrain() reads this flag off the function; mypy types no attributes on functions
train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]


def get_embedding_ranks(pp_ranks):
    """pretrain_gpt.py:get_embedding_ranks (core_v0.19.0) without multi-token prediction."""
    from megatron.training import get_args

    ranks = [pp_ranks[0]]
    if len(pp_ranks) > 1 and not get_args().untie_embeddings_and_output_weights:
        ranks.append(pp_ranks[-1])
    return sorted(set(ranks))


# ------------------------------------------------------------------------------------------- measuring
def _capture_model_and_optimizer() -> None:
    """Keep the (model, optimizer) pretrain() builds, to measure their bytes after training."""
    from megatron.training import training

    original = training.setup_model_and_optimizer

    def setup(*args, **kwargs):
        out = original(*args, **kwargs)
        _CAPTURED["model"], _CAPTURED["optimizer"] = out[0], out[1]
        return out

    training.setup_model_and_optimizer = setup


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _optimizers(optimizer) -> list:
    inner = getattr(optimizer, "chained_optimizers", None)
    return list(inner) if inner is not None else [optimizer]


def measure() -> dict[str, Any]:
    """This rank's parameter, gradient-buffer, optimizer-state (+ fp32 master) and activation bytes."""
    model, optimizer = _CAPTURED.get("model") or [], _CAPTURED.get("optimizer")
    params = [p for chunk in model for p in chunk.parameters()]
    grad_buffers = [b.grad_data for chunk in model for b in (getattr(chunk, "buffers", []) or [])
                    + (getattr(chunk, "expert_parallel_buffers", []) or []) if getattr(b, "grad_data", None) is not None]
    grads = _tensor_bytes(grad_buffers) if grad_buffers else _tensor_bytes(
        getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad for p in params)
    states, masters = [], []
    for opt in _optimizers(optimizer) if optimizer is not None else []:
        torch_opt = getattr(opt, "optimizer", None)
        if torch_opt is None:
            continue
        for group in torch_opt.param_groups:
            for p in group["params"]:
                states += [v for v in torch_opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)
                           and v.numel() > 1]
        for name in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups"):
            for group in getattr(opt, name, None) or []:
                masters += list(group)
    peak = (torch.cuda.max_memory_allocated() if not _bridged()
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"param_bytes": _tensor_bytes(params), "grad_bytes": grads, "optimizer_bytes": _tensor_bytes(states),
            "master_bytes": _tensor_bytes(masters), "saved_activation_bytes": SAVED.peak,
            "peak_memory_bytes": peak, "device": "cpu" if _bridged() else "cuda"}


def _bridged() -> bool:
    from compiler.targets.megatron import cpu as megatron_cpu

    return megatron_cpu.installed()


# ------------------------------------------------------------------------------------------- checks


def megatron_message(exc: BaseException) -> str:
    """An exception from Megatron as one line; a bare assert as its source statement and place."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    for frame in reversed(frames):
        path = frame.filename.replace(os.sep, "/")
        if "/megatron/core/" in path or "/megatron/training/" in path:
            where = "megatron/" + path.rsplit("/megatron/", 1)[1] + f":{frame.lineno}"
            text = str(exc) or (frame.line or "").strip()
            return f"{type(exc).__name__}: {text} ({where})"
    return f"{type(exc).__name__}: {exc}"


def _validated(A, argv: list[str], world: str, connections: str):
    """Megatron's parse_args + validate_args of ``argv`` as rank 0 of ``world`` ranks."""
    sys.argv = ["megatron_args.sh"] + argv
    os.environ.update(RANK="0", WORLD_SIZE=world)
    if connections == UNSET:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    args = A.parse_args()  # argparse prints "megatron_args.sh: error: ..." and exits 2
    args, skipped = validate_args_past_te_version(A, args, {"tokenizer_type": "GPT2BPETokenizer"})
    if skipped is not None:
        print(f"megatron_args.sh: note: not checkable without Transformer Engine: {skipped}; the rest of "
              "validate_args passes", file=sys.stderr, flush=True)
    return args


def check_plan_args() -> None:
    """The artifact's unscaled arguments through Megatron's own parse_args and validate_args at
    the plan's world size (what the scale-down would hide: the real dp, the real layer split),
    then TransformerConfig (the model-build checks: the pipeline split, heads vs tp, ...) on the
    same arguments with only the CPU path's changes where there are any (no Transformer Engine,
    fusions, fp8, ...: DTC_SMOKE_MEGATRON_PLAN_CONFIG_ARGS)."""
    text, world = os.environ.get(PLAN_ARGS_ENV), os.environ.get(PLAN_WORLD_ENV)
    if not text or not world:
        return
    from megatron.training import arguments as A

    names = ("RANK", "WORLD_SIZE", "CUDA_DEVICE_MAX_CONNECTIONS")
    saved_argv, saved_env = sys.argv, {k: os.environ.get(k) for k in names}
    print_args, A._print_args = A._print_args, lambda *a, **k: None
    at = f"at the plan's world size ({world} ranks)"
    try:
        args = _validated(A, json.loads(text), world, os.environ.get(PLAN_CONNECTIONS_ENV, UNSET))
        config_text = os.environ.get(PLAN_CONFIG_ARGS_ENV)
        if config_text:
            config = json.loads(config_text)
            # the CPU path runs cp=1 on the plan's dp (megatron/smoke.py worker_env)
            at = f"on the CPU path (cp=1) at the plan's other degrees ({config['world']} ranks)"
            args = _validated(A, config["args"], config["world"], config["connections"])
        A.core_transformer_config_from_args(args)
    except Exception as exc:  # noqa: BLE001 - Megatron's own rejection, reported as such
        print(f"megatron_args.sh: error: Megatron rejects the generated arguments {at}: {megatron_message(exc)}",
              file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        sys.argv, A._print_args = saved_argv, print_args
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ------------------------------------------------------------------------------------------- main
def main() -> None:
    try:
        train()
    except AssertionError as exc:
        import traceback

        traceback.print_exc()
        print(megatron_message(exc), file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _count_backward_recomputation() -> None:
    """Megatron's activation recompute (tensor_parallel.checkpoint, reentrant) runs a layer's forward again inside
    the backward, and what that forward saves lives until the layer's backward has used it: run the schedules'
    backward steps inside SAVED's hooks too (forward_step runs the forward inside them), so the rematerialised
    layer is counted as the cost model counts it (its recompute_working_set line). A backward saves nothing
    else."""
    from megatron.core.pipeline_parallel import schedules

    original = schedules.backward_step

    def backward_step(*args, **kwargs):
        with SAVED.hooks():
            return original(*args, **kwargs)

    schedules.backward_step = backward_step  # the schedules call it by its module-level name


def train() -> None:
    from megatron.core.enums import ModelType
    from megatron.training import pretrain, set_startup_timestamps
    from megatron.training.argument_utils import pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    check_plan_args()
    set_startup_timestamps(program_start=_PROGRAM_START_TIME, main_entry=time.time())
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    asked = [name for name in UNSUPPORTED if getattr(args, name, None)]
    if asked:
        raise SystemExit("dtc smoke: the smoke worker runs the plain GPT path of pretrain_gpt.py; not wired: "
                         + ", ".join("--" + a.replace("_", "-") for a in asked))
    _capture_model_and_optimizer()
    _count_backward_recomputation()
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*recommended to use a ModelConfig.*")
        cfg = pretrain_cfg_container_from_args(args)
    pretrain(cfg, train_valid_test_datasets_provider, ModelType.encoder_or_decoder, forward_step,
             model_provider=partial(model_provider, gpt_builder), get_embedding_ranks=get_embedding_ranks)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    record = {SUMMARY_KEY: True, "rank": rank, **measure()}
    print_json(record)  # the generated trainers' summary writer: one write per line
    sys.stderr.flush()
    os._exit(0)  # like the generated trainers: c10d/gloo threads can abort interpreter shutdown


if __name__ == "__main__":
    main()
