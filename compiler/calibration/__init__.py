"""Calibration: published runs as cost-model inputs (runs.py) and the fit of the few fitted
constants (fit.py) that regenerates compiler/data/efficiency.yaml."""
