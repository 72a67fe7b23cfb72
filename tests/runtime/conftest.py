"""Tests of compiler/runtime: their helpers (launching.py, megatron_import.py) sit beside them."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
