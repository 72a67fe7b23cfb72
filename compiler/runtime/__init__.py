"""dtc's torch runtime: the trainers every generated FSDP2 / DeepSpeed folder runs.

The renderer copies this package VERBATIM into each generated folder (as ``dtc_runtime/``) beside a
generated ``train_config.json``; it imports only the standard library, numpy, torch (and DeepSpeed
in ``deepspeed_train``), never ``compiler``. Modules:

- ``model``: the one decoder (Llama/GPT families), ``hf``: Hugging Face safetensors loading;
- ``data``: Megatron's indexed format (read and write) and blending, ``config``: the run config;
- ``schedule``: the lr schedule, ``checkpoint``: complete-or-invisible checkpoint folders;
- ``parallel``: FSDP2/TP/PP building blocks, ``measure``: memory measurements;
- ``fsdp_train`` and ``deepspeed_train``: the two training entry points.
"""
