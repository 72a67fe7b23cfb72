"""Review: what a change does, for a reviewer (`dtc diff`, and the file lists of `dtc compile` and `dtc check`).

plans.py   two sides (Plan + ArtifactSet) -> ``ArtifactDiff``: the semantic summary and warnings
files.py   one artifact old -> new: ``FileChange`` with the keys that changed and a unified diff
format.py  ``ArtifactDiff``s as text, Markdown or JSON
folder.py  an ``ArtifactSet`` against a folder on disk: which files would be added, changed, removed
sides.py   the sides `dtc diff` compares: a spec compiled in memory, a generated folder, either as of a git revision
git.py     files and folders as of a git revision (``dtc diff --base``)

Imports run one way: format -> plans -> files; sides -> plans, git. Nothing is re-exported here, so that importing
one module does not import the others.
"""
