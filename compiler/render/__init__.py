"""Rendering: a Plan's files, for every target, checked against each other.

all_targets.py  ``render(plan) -> ArtifactSet``: every target's files, plan.json, PLAN.md, the invariants
invariants.py   the cross-artifact invariants: the same world size, batch and sharding in every file
report.py       PLAN.md (with report_layout.py, report_svg.py, report_text.py)
environment.py  the templates' Jinja environment; common.py the pieces every renderer uses

Nothing is imported here: importing one module (a target's renderer imports common.py) must not import
the others, nor make a circle through this file.
"""
