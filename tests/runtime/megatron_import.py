"""Import megatron-core's own dataset and scheduler code on Python 3.11 without triton (the same
stub tools/validators/megatron_check.py installs: paged_stash is the only module importing triton)."""
from __future__ import annotations

import importlib.util
import os
import sys
import types
import typing
import warnings


def megatron_module(name: str):
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    stub = "megatron.core.transformer.moe.ops.paged_stash"
    if importlib.util.find_spec("triton") is None and stub not in sys.modules:
        module = types.ModuleType(stub)
        module.GLOBAL_BLOCK_SIZE = 1024
        module.paged_stash_copy_kernel = module.paged_stash_pop_kernel = None
        sys.modules[stub] = module
    os.environ.setdefault("NO_VCS_VERSION", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)
