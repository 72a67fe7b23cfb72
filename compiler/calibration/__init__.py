"""Calibration: published runs as cost-model inputs (runs.py), the fit of the few fitted constants
(fit.py) that regenerates compiler/data/efficiency.yaml, and cluster profiles (issue #12): training
logs in the frameworks' formats (logs.py), measured runs of one cluster (measured.py) and the
profile fitted on them (profile.py, the profile and its file; profile_fit.py, the fit), written by
`dtc calibrate`."""
