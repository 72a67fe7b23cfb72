"""Review: what a change does, for a reviewer (`dtc diff`).

plans.py   two sides (Plan + ArtifactSet) -> ``ArtifactDiff``: the semantic summary and warnings
files.py   one artifact old -> new: ``FileChange`` with the keys that changed and a unified diff
format.py  ``ArtifactDiff``s as text, Markdown or JSON

Imports run one way: format -> plans -> files. Nothing is re-exported here, so that importing
one module does not import the others.
"""
