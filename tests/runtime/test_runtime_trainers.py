"""The runtime's trainers for real (torchrun, gloo, CPU), copied verbatim into a folder as the
renderer does: exact resume after SIGUSR1, learning a tokenized corpus, starting from a checkpoint
saved by transformers."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from launching import install_runtime, launch

from compiler.runtime.data import IndexedDataset

pytestmark = pytest.mark.slow

MODEL = {"num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 160, "num_attention_heads": 8, "num_kv_heads": 4,
         "vocab_size": 128, "seq_len": 32, "rope_theta": 500000.0, "init_std": 0.02}
DS_BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "gradient_clipping": 1.0, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                     "weight_decay": 0.1}},
           "bf16": {"enabled": False}, "data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}


def write_config(folder, *, parallel, model=MODEL, steps=6, data=None, batch=(2, 2), lr=3e-3, ds=None, **extra):
    cfg = {"name": "t", "train_steps": steps, "seed": 7, "model": model, "parallel": parallel,
           "batch": {"micro_batch": batch[0], "grad_accum": batch[1], "seq_len": model["seq_len"]},
           "schedule": {"peak_lr": lr, "min_lr": lr / 10, "warmup_steps": 2, "decay_steps": steps},
           "data": data or {"synthetic": True}, "param_dtype": "float32",
           "checkpoint": {"dir": "ckpt", "interval_steps": 0}, **extra}
    (folder / "train_config.json").write_text(json.dumps(cfg, indent=1))
    if ds is not None:
        (folder / "ds_config.json").write_text(json.dumps(ds, indent=1))


PREEMPTION = {
    "fsdp-full-shard": ("fsdp_train.py", {"dp_shard": 2, "zero_stage": 3}, 2, None),
    "fsdp-hsdp": ("fsdp_train.py", {"dp_replicate": 2, "dp_shard": 2, "zero_stage": 3}, 4, None),
    "fsdp-tp2-x-fsdp2-sp": ("fsdp_train.py", {"tp": 2, "dp_shard": 2, "zero_stage": 3, "sequence_parallel": True},
                            4, None),
    "fsdp-pp2-stages-1+3": ("fsdp_train.py", {"pp": 2, "zero_stage": 3, "stage_layers": [[0], [1, 2, 3]]}, 2, None),
    "deepspeed-zero1": ("deepspeed_train.py", {}, 2, 1),
    "deepspeed-zero2": ("deepspeed_train.py", {}, 2, 2),
    "deepspeed-zero3": ("deepspeed_train.py", {}, 2, 3),
    "deepspeed-pipeline-stages-1+3": ("deepspeed_train.py", {"pp": 2, "stage_layers": [[0], [1, 2, 3]]}, 2, "pipe"),
}


@pytest.mark.parametrize("name", list(PREEMPTION))
def test_sigusr1_saves_and_the_next_job_continues_exactly(tmp_path, name):
    entry, parallel, nproc, zero = PREEMPTION[name]
    ds = None
    if zero == "pipe":
        ds = {**DS_BASE, "train_batch_size": 4, "zero_optimization": {"stage": 1}, "pipeline": {"stages": 2}}
    elif zero is not None:
        ds = {**DS_BASE, "zero_optimization": {"stage": zero}}
    key = "dtc_deepspeed_summary" if ds else "dtc_fsdp_summary"
    install_runtime(tmp_path)
    write_config(tmp_path, parallel=parallel, ds=ds)
    full = launch(tmp_path, entry, ["--no-resume", "--no-save-at-end", "--checkpoint-dir", str(tmp_path / "x")],
                  nproc=nproc, summary_key=key)
    assert full.returncode == 0 and full.summary, full.text[-4000:]
    first = launch(tmp_path, entry, [], nproc=nproc, stop_after=3, summary_key=key)
    assert first.returncode == 0 and first.summary["stopped_by_signal"], first.text[-4000:]
    assert first.summary["last_step"] == 3 and first.summary["checkpoints"][-1].endswith("step_000000003")
    second = launch(tmp_path, entry, [], nproc=nproc, summary_key=key)
    assert second.returncode == 0 and second.summary, second.text[-4000:]
    assert second.summary["resumed_from_step"] == 3 and second.summary["loss_steps"] == [4, 5, 6]
    diffs = [abs(a - b) for a, b in zip(full.summary["losses"][3:], second.summary["losses"], strict=True)]
    assert max(diffs) <= 1e-6, (full.summary["losses"], first.summary["losses"], second.summary["losses"])
    assert full.summary["losses"][-1] < full.summary["losses"][0]
    if "stage_layers" in parallel:  # the pipeline ran the configured split, not its own
        assert full.summary["stage_layers"] == parallel["stage_layers"]


GPT_MODEL = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4, "num_kv_heads": 4,
             "vocab_size": 128, "seq_len": 32, "mlp": "gelu", "norm": "layernorm", "position": "learned",
             "max_position_embeddings": 32, "linear_bias": True, "tied_embeddings": True}


def test_gpt_style_layouts_compute_the_same_losses(tmp_path):
    """Learned positions, biases and tied embeddings: TP2 with sequence parallel and PP2 (the tied
    head kept in sync across the stages, counted once in the gradient norm) train exactly as one
    process does."""
    install_runtime(tmp_path)
    losses = {}
    for name, parallel, nproc in (("tp1", {"zero_stage": 3}, 1),
                                  ("tp2-sp", {"tp": 2, "zero_stage": 3, "sequence_parallel": True}, 2),
                                  ("pp2-tied", {"pp": 2, "zero_stage": 3}, 2)):
        write_config(tmp_path, parallel=parallel, model=GPT_MODEL, steps=5, checkpoint={"dir": None})
        run = launch(tmp_path, "fsdp_train.py", [], nproc=nproc)
        assert run.returncode == 0 and run.summary, run.text[-4000:]
        losses[name] = run.summary["losses"]
    for name in ("tp2-sp", "pp2-tied"):
        assert max(abs(a - b) for a, b in zip(losses["tp1"], losses[name], strict=True)) < 1e-5, losses


# ------------------------------------------------------------------------------------------- a real corpus
NOUNS = "cat dog bird fish horse cow sheep goat lion tiger".split()
VERBS = "sees chases likes follows feeds watches".split()
ADJS = "big small red quick lazy happy".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Text, a BPE tokenizer trained on it with `tokenizers`, and `dtc data prepare`'s output."""
    from helpers import run_cli
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    with open(folder / "corpus.txt", "w") as f:
        for _ in range(600):
            for _ in range(rng.randint(2, 5)):
                f.write(f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)} .\n")
            f.write("\n")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=96, special_tokens=["<unk>", "<|endoftext|>"])
    tok.train([str(folder / "corpus.txt")], trainer)
    (folder / "tok").mkdir()
    tok.save(str(folder / "tok" / "tokenizer.json"))
    result = run_cli(["data", "prepare", str(folder / "corpus.txt"), "--tokenizer", str(folder / "tok"),
                      "-o", str(folder / "corpus"), "--json"])
    meta = json.loads(result.stdout)
    data = IndexedDataset(folder / "corpus")
    tokens = np.concatenate([data[i] for i in range(len(data))])
    counts = np.bincount(tokens)
    p = counts[counts > 0] / counts.sum()
    return folder, meta, float(-(p * np.log(p)).sum())


@pytest.mark.parametrize("entry", ["fsdp_train.py", "deepspeed_train.py"])
def test_trainers_learn_a_tokenized_corpus(tmp_path, corpus, entry):
    folder, meta, unigram = corpus
    assert meta["documents"] == 600 and meta["eod_id"] == 1
    model = {**MODEL, "num_layers": 2, "vocab_size": 96, "seq_len": 64, "num_attention_heads": 4, "num_kv_heads": 2,
             "ffn_hidden_size": 192}
    ds = {**DS_BASE, "train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 2}}
    install_runtime(tmp_path)
    write_config(tmp_path, parallel={"dp_shard": 2, "zero_stage": 3}, model=model, steps=60, batch=(8, 1),
                 data={"sources": [{"prefix": str(folder / "corpus"), "weight": 1.0}]}, ds=ds,
                 checkpoint={"dir": None})
    key = "dtc_deepspeed_summary" if entry.startswith("deepspeed") else "dtc_fsdp_summary"
    run = launch(tmp_path, entry, [], nproc=2, summary_key=key)
    assert run.returncode == 0 and run.summary, run.text[-4000:]
    assert run.summary["data"] == "indexed"
    last = sum(run.summary["losses"][-5:]) / 5
    print(f"{entry}: unigram entropy {unigram:.3f} nats, loss {run.summary['losses'][0]:.3f} -> {last:.3f}")
    assert last < 0.6 * unigram


# ------------------------------------------------------------------------------------------- pretrained init
INIT_CASES = {
    "fsdp-full-shard": ("fsdp_train.py", {"dp_shard": 2, "zero_stage": 3}, None),
    "fsdp-tp2": ("fsdp_train.py", {"tp": 2, "zero_stage": 3}, None),
    "deepspeed-zero3": ("deepspeed_train.py", {}, {"stage": 3}),
    "deepspeed-autotp2": ("deepspeed_train.py", {}, {"stage": 1}),
}


@pytest.mark.parametrize("name", list(INIT_CASES))
def test_a_transformers_checkpoint_loads_into_the_trainers(tmp_path, name):
    from transformers import LlamaConfig, LlamaForCausalLM

    entry, parallel, zero = INIT_CASES[name]
    torch.manual_seed(0)
    hc = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=4, max_position_embeddings=64, rope_theta=500000.0, rms_norm_eps=1e-5,
                     tie_word_embeddings=False)
    hf = LlamaForCausalLM(hc).eval()
    hf.save_pretrained(tmp_path / "hf")
    ds = None
    if zero is not None:
        ds = {**DS_BASE, "zero_optimization": zero}
        if name.endswith("autotp2"):
            ds["tensor_parallel"] = {"autotp_size": 2}
    install_runtime(tmp_path)
    write_config(tmp_path, parallel=parallel, steps=1, ds=ds, init="hf", checkpoint={"dir": None})
    key = "dtc_deepspeed_summary" if ds else "dtc_fsdp_summary"
    run = launch(tmp_path, entry, ["--dump-logits", str(tmp_path / "logits.pt")], nproc=2, summary_key=key)
    assert run.returncode == 0 and run.summary, run.text[-4000:]
    assert run.summary["init"].startswith("initialised from")
    dumped = torch.load(tmp_path / "logits.pt")
    with torch.no_grad():
        reference = hf(dumped["tokens"]).logits
    diff = (reference - dumped["logits"]).abs().max().item()
    print(f"{name}: max |logit difference| vs transformers {diff:.2e}")
    assert diff < 1e-4


def test_a_checkpoint_resumes_on_another_layout(tmp_path):
    """torch.distributed.checkpoint reshards, and the data position is the run's sample count: a job
    stopped under ZeRO-3 over 2 ranks continues as HSDP 2 x 2 with half the micro-batch (the same
    global batch) and computes the uninterrupted run's losses."""
    install_runtime(tmp_path)
    write_config(tmp_path, parallel={"dp_shard": 2, "zero_stage": 3})
    full = launch(tmp_path, "fsdp_train.py", ["--no-resume", "--no-save-at-end", "--checkpoint-dir",
                                              str(tmp_path / "x")], nproc=2)
    stopped = launch(tmp_path, "fsdp_train.py", [], nproc=2, stop_after=3)
    assert stopped.summary["last_step"] == 3, stopped.text[-3000:]
    write_config(tmp_path, parallel={"dp_replicate": 2, "dp_shard": 2, "zero_stage": 3}, batch=(1, 2))
    resumed = launch(tmp_path, "fsdp_train.py", [], nproc=4)
    assert resumed.returncode == 0 and resumed.summary["resumed_from_step"] == 3, resumed.text[-3000:]
    diffs = [abs(a - b) for a, b in zip(full.summary["losses"][3:], resumed.summary["losses"], strict=True)]
    assert max(diffs) <= 1e-6
