"""SLURM 22.05: one sbatch script per framework target, and train.sbatch (the primary one)."""
from compiler.targets.base import Target

TARGET = Target(
    name="slurm",
    display_name="SLURM",
    versions={"slurm": "22.05"},
    files=("train.sbatch",),
    renderer="compiler.targets.slurm.render:render_slurm",
    templates="templates",
    check_artifacts="compiler.targets.slurm.render:check_artifacts",
    validator="tools.validators.slurm_check:validate_folder",
    launches_others=True,
)
