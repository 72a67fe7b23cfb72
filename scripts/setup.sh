#!/usr/bin/env bash
# Everything the test suite needs, on a fresh Debian 12 machine with Python 3.11, idempotently:
#   - a virtualenv at .venv (or $VENV) with torch 2.13.0 (the CPU wheel, installed FIRST so that
#     nothing later pulls a CUDA build), deepspeed 0.19.8 (DS_BUILD_OPS=0: ops JIT-compile on
#     demand), dtc itself (editable) with its [smoke,data,test] extras (data: tokenizers,
#     sentencepiece, tiktoken, pyarrow for `dtc data prepare`; test: transformers), and
#     megatron-core 0.19.2 (with triton and psutil) for validating Megatron arguments with
#     Megatron's own parser and for `dtc smoke --target megatron` (Megatron-LM's own training
#     loop on CPU);
#   - system packages: slurm-wlm + munge (a real one-node SLURM for sbatch tests) and shellcheck.
# Usage: bash scripts/setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON_BIN:-python3}"
cd "$ROOT"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip

have() { "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('$1') == '$2' else 1)" 2>/dev/null; }

have torch 2.13.0 || "$PY" -m pip install --quiet "torch==2.13.0"
if ! have deepspeed 0.19.8; then
    # An sdist: build without isolation so the build never fetches another torch.
    "$PY" -m pip install --quiet wheel setuptools numpy psutil py-cpuinfo packaging
    DS_BUILD_OPS=0 "$PY" -m pip install --quiet --no-build-isolation "deepspeed==0.19.8"
fi
"$PY" -m pip install --quiet -e ".[smoke,data,test]"
PYTHON="$PY" bash tools/validators/install.sh
bash .ci/install-system-deps.sh
echo "setup: ok ($("$PY" --version), torch $("$PY" -c 'import torch; print(torch.__version__)'))"
