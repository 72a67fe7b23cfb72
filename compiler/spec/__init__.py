"""The spec language: pydantic models (models.py) and the positioned YAML loader (load.py)."""
from compiler.spec.load import load_spec, load_spec_data, load_spec_text
from compiler.spec.models import Spec

__all__ = ["Spec", "load_spec", "load_spec_data", "load_spec_text"]
