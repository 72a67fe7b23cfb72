"""FSDP2 target: the runtime's FSDP2 trainer (``dtc_runtime/``, copied verbatim), its run config
``fsdp_config.json`` and the ``fsdp_train.py`` entry point (torchrun).

Nothing here is templated code: the trainer is compiler/runtime (real, linted, tested), and this
module only computes the plan's values (compiler.runtime_bundle.plan_run_config). How FSDP2 runs a
dtc layout is compiler/runtime/parallel.py's docstring: ZeRO-0 as a 2-D (dp_replicate, dp_shard=1)
mesh, ZeRO-2/3 as ``reshard_after_forward`` False/True, HSDP, TP/SP with torchtitan's plan, PP with
``torch.distributed.pipelining`` over Megatron's split of the layers (compiler.split, the split the
plan is costed with), CP on CUDA only, CPU offload, MixedPrecisionPolicy(param dtype, fp32 reduce).
"""
from __future__ import annotations

import json
from typing import Any

from compiler import rules
from compiler.errors import Diagnostic, RenderError
from compiler.plan import Plan
from compiler.runtime_bundle import render_runtime_target

CONFIG_FILE = "fsdp_config.json"
TRAIN_FILE = "fsdp_train.py"


def _check_supported(plan: Plan) -> None:
    bad = rules.plan_violations(plan, ("fsdp",))
    if bad:
        raise RenderError(Diagnostic(
            summary=f"FSDP2 cannot run layout {plan.layout.tag}: {rules.describe(bad)}",
            detail="the solver should not have chosen this layout for a plan with the fsdp target",
            hint="remove fsdp from targets, or pin a layout FSDP2 supports; if the solver chose it, please report"))
    lay = plan.layout
    if lay.world_size % lay.num_nodes:
        raise RenderError(Diagnostic(
            summary=f"world size {lay.world_size} does not split evenly over {lay.num_nodes} nodes of "
                    f"{lay.gpus_per_node} GPUs",
            hint="use a GPU count that is a multiple of the node size (or below one node)"))


def render_fsdp(plan: Plan) -> dict[str, str]:
    """dtc_runtime/*.py, fsdp_config.json and fsdp_train.py for ``plan``."""
    _check_supported(plan)
    return render_runtime_target(
        plan, target="fsdp", config_file=CONFIG_FILE, entry_file=TRAIN_FILE, module="fsdp_train",
        doc=f"FSDP2 entry for {plan.name} (layout {plan.layout.tag}): torchrun --nnodes N --nproc-per-node G "
            f"fsdp_train.py [--steps N]; runs dtc_runtime/fsdp_train.py with {CONFIG_FILE} (both beside this file).")


# ------------------------------------------------------------------------------ invariants
def check_artifacts(c: Any, files: dict[str, str]) -> None:
    """fsdp_config.json's layout and batch agree with the plan (compiler.render.invariants)."""
    cfg = json.loads(files[CONFIG_FILE])
    lay, par, batch = c.plan.layout, cfg["parallel"], cfg["batch"]
    for name, want in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp), ("dp_replicate", lay.dp_replicate),
                       ("dp_shard", lay.dp_shard), ("zero_stage", lay.zero_stage), ("vpp", lay.vpp)):
        c.expect(CONFIG_FILE, f"parallel.{name}", par.get(name), want)
    c.expect(CONFIG_FILE, "batch.micro_batch", batch.get("micro_batch"), lay.micro_batch)
    c.expect(CONFIG_FILE, "batch.grad_accum", batch.get("grad_accum"), lay.grad_accum)
    mesh = par["tp"] * par["pp"] * par["cp"] * par["dp_replicate"] * par["dp_shard"]
    c.expect(CONFIG_FILE, "the mesh size", mesh, lay.world_size)
    c.expect(CONFIG_FILE, "the global batch", batch["micro_batch"] * batch["grad_accum"] * par["dp_replicate"]
             * par["dp_shard"], c.plan.training.global_batch)
