"""DeepSpeed 0.19.8: ds_config.json, the runtime's trainer (dtc_runtime/) with ds_train_config.json, and ds_train.py."""
from compiler.targets.base import SlurmLaunch, SmokeHooks, Target
from compiler.targets.deepspeed import cost, support

TARGET = Target(
    name="deepspeed",
    display_name="DeepSpeed",
    versions={"deepspeed": "0.19.8", "torch": "2.13.0"},
    files=("ds_config.json", "ds_train.py"),
    support=support.RULES,
    model_support="compiler.runtime_bundle:model_unsupported",
    cost=cost.COST,
    notes=support.notes,
    renderer="compiler.targets.deepspeed.render:render_deepspeed",
    check_artifacts="compiler.targets.deepspeed.render:check_artifacts",
    validator="tools.validators.deepspeed_check:validate_folder",
    slurm=SlurmLaunch(script="train_deepspeed.sbatch", template="slurm/torchrun.sbatch.j2", launcher="torchrun",
                      framework="DeepSpeed", needs=("ds_train.py", "ds_config.json", "ds_train_config.json", "dtc_runtime"),
                      launchers={"deepspeed": 0, "torchrun": 1}, program_default="ds_train.py",
                      # the generated ds_train.py takes --ds-config; a user entry gets DeepSpeed's own flag
                      config_flag=("--ds-config", "--deepspeed_config")),
    smoke=SmokeHooks(runner="compiler.smoke.targets:run_entry", entry="ds_train.py",
                     summary_key="dtc_deepspeed_summary", options="compiler.targets.deepspeed.smoke:smoke_options",
                     preflight="compiler.targets.deepspeed.smoke:preflight",
                     notes="compiler.targets.deepspeed.smoke:notes", jit_extensions=True),
)
