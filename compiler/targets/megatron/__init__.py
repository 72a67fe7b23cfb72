"""Megatron-LM on megatron-core 0.19.2: megatron_args.sh, the pretrain_gpt.py arguments (srun)."""
from compiler.targets.base import SlurmLaunch, SmokeHooks, Target
from compiler.targets.megatron import cost, support

# train_megatron.sbatch runs a short benchmark when this is set to an iteration count (render.py's slurm_context
# writes the override block; dtc sweep sets it, compiler/sweep.py)
BENCH_STEPS_ENV = "DTC_BENCH_STEPS"

TARGET = Target(
    name="megatron",
    display_name="Megatron",
    versions={"megatron-core": "0.19.2"},
    files=("megatron_args.sh",),
    support=support.RULES,
    model_support="compiler.targets.megatron.support:model_unsupported",
    layout_model_support="compiler.targets.megatron.support:layout_model_unsupported",
    cost=cost.COST,
    notes=support.notes,
    renderer="compiler.targets.megatron.render:render_megatron",
    templates="templates",
    check_artifacts="compiler.targets.megatron.render:check_artifacts",
    validator="tools.validators.megatron_check:validate_folder",
    slurm=SlurmLaunch(script="train_megatron.sbatch", template="slurm/srun.sbatch.j2", launcher="srun",
                      framework="Megatron-LM", needs=("megatron_args.sh",), launchers={"srun": 0},
                      context="compiler.targets.megatron.render:slurm_context", bench_steps_env=BENCH_STEPS_ENV),
    # Megatron-LM's own training loop (megatron.training.pretrain) on the smoke world: NCCL on GPUs,
    # gloo through a CUDA-to-CPU layer (cpu.py) on CPUs; locally or through train_megatron.sbatch
    smoke=SmokeHooks(runner="compiler.targets.megatron.smoke:run_megatron", complete=True),
)
