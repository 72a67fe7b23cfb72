#!/usr/bin/env bash
# Install what tools/validators/megatron_check.py and `dtc smoke --target megatron` need into the
# current virtualenv, idempotently:
#   megatron-core 0.19.2 (its megatron/training/arguments.py is the flag parser we validate with,
#   its megatron/training/training.py the training loop the smoke runs), triton (imported at
#   module level by megatron/core/transformer/moe/ops/paged_stash.py:4; it imports fine without a
#   GPU) and psutil (Megatron's checkpoint saving).
#
# megatron-core >= 0.17 declares Requires-Python >= 3.12; all of it that the validator imports runs
# on 3.11 with the shims in megatron_check.py, so on 3.11 it is installed with
# --ignore-requires-python. --no-deps so pip never tries to replace torch; its real runtime
# dependencies (torch, numpy, packaging) plus typing_extensions (the typing.override shim) are
# checked/installed separately. (megatron_check.py still stubs the one module that imports triton
# where triton is missing; the smoke runs the real one.) einops/tqdm are optional.
#
# Usage: . .venv/bin/activate && tools/validators/install.sh      (or PYTHON=/path/to/python ...)
set -euo pipefail

MCORE_VERSION=0.19.2
TRITON_VERSION=3.9.0
PY="${PYTHON:-$(command -v python || command -v python3)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

in_venv=$("$PY" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
if [[ "$in_venv" != 1 && "${ALLOW_SYSTEM_PYTHON:-0}" != 1 ]]; then
  echo "install.sh: $PY is not inside a virtualenv; activate one (or set ALLOW_SYSTEM_PYTHON=1)" >&2
  exit 2
fi

have() {  # have DIST [VERSION]: installed (at that exact version when given)?
  "$PY" - "$@" <<'EOF'
import sys
from importlib import metadata
try:
    v = metadata.version(sys.argv[1])
except metadata.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if len(sys.argv) < 3 or v == sys.argv[2] else 1)
EOF
}

if ! have torch; then
  echo "install.sh: torch is not installed in $PY; install it first (pip install torch==2.13.0)" >&2
  exit 2
fi

missing=()
have numpy || missing+=(numpy)
have packaging || missing+=("packaging>=24.2")
have typing_extensions || missing+=(typing_extensions)
have psutil || missing+=(psutil)
if ((${#missing[@]})); then
  echo "install.sh: installing ${missing[*]}"
  "$PY" -m pip install --quiet "${missing[@]}"
fi

if have megatron-core "$MCORE_VERSION"; then
  echo "install.sh: megatron-core $MCORE_VERSION already installed"
else
  echo "install.sh: installing megatron-core==$MCORE_VERSION (--ignore-requires-python --no-deps)"
  "$PY" -m pip install --quiet --ignore-requires-python --no-deps "megatron-core==$MCORE_VERSION"
fi

if have triton "$TRITON_VERSION"; then
  echo "install.sh: triton $TRITON_VERSION already installed"
else
  # --no-deps: it must not pull anything next to the CPU torch wheel
  echo "install.sh: installing triton==$TRITON_VERSION (--no-deps)"
  "$PY" -m pip install --quiet --no-deps "triton==$TRITON_VERSION"
fi

# Smoke check: the validator's own loader (shims included) and one known-good flag list.
"$PY" - "$HERE" <<'EOF'
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(sys.argv[1])))
from tools.validators.megatron_check import validate_megatron_flags, _load_megatron
flags = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
         "--max-position-embeddings 128 --micro-batch-size 2 --global-batch-size 16 --bf16 "
         "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --mock-data "
         "--tokenizer-type NullTokenizer --vocab-size 1024 --lr 1e-4 --train-iters 10").split()
errs = validate_megatron_flags(flags, 8)
if errs:
    sys.exit(f"install.sh: smoke check failed: {errs}")
print(f"install.sh: ok, megatron-core {_load_megatron()['version']} validates flags in {sys.executable}")
EOF
