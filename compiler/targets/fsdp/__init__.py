"""torch 2.13 FSDP2: the runtime's trainer (dtc_runtime/), fsdp_config.json and the fsdp_train.py entry (torchrun)."""
from compiler.targets.base import SlurmLaunch, SmokeHooks, Target
from compiler.targets.fsdp import cost, support

TARGET = Target(
    name="fsdp",
    display_name="FSDP2",
    versions={"torch": "2.13.0"},
    files=("fsdp_config.json", "fsdp_train.py"),
    support=support.RULES,
    model_support="compiler.runtime_bundle:model_unsupported",
    cost=cost.COST,
    notes=support.notes,
    renderer="compiler.targets.fsdp.render:render_fsdp",
    check_artifacts="compiler.targets.fsdp.render:check_artifacts",
    validator="tools.validators.fsdp_check:validate_folder",
    slurm=SlurmLaunch(script="train_fsdp.sbatch", template="slurm/torchrun.sbatch.j2", launcher="torchrun",
                      framework="FSDP2", needs=("fsdp_train.py", "fsdp_config.json", "dtc_runtime"),
                      launchers={"torchrun": 0},
                      program_default="fsdp_train.py"),
    smoke=SmokeHooks(runner="compiler.smoke.targets:run_entry", entry="fsdp_train.py",
                     summary_key="dtc_fsdp_summary", options="compiler.targets.fsdp.smoke:smoke_options",
                     notes="compiler.targets.fsdp.smoke:notes"),
)
