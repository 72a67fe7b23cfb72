"""The output targets, one package each (deepspeed, fsdp, megatron, slurm), listed in registry.py.

Each ``compiler/targets/<name>/__init__.py`` defines ``TARGET`` (compiler.targets.base.Target): its
support rules (support.py), renderer (render.py) and templates (templates/), smoke hooks (smoke.py)
and the validator the tests run on its files. docs/adding-a-target.md has the steps to add one.
"""
