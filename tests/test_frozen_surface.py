"""The public surfaces are frozen: the spec schema and the CLI options change only on purpose."""
from __future__ import annotations

import json

from helpers import REPO, run_cli


def test_spec_schema_is_committed_and_current():
    result = run_cli(["schema"])
    committed = (REPO / "schemas/spec.schema.json").read_text()
    assert result.stdout == committed, (
        "the spec schema changed; if intended run `dtc schema > schemas/spec.schema.json` and commit it")
    schema = json.loads(committed)
    # every field is documented (it flows into editors' completion)
    for name, definition in [("Spec", schema), *schema["$defs"].items()]:
        for field, prop in definition.get("properties", {}).items():
            assert prop.get("description"), f"{name}.{field} has no description"


EXPECTED_OPTIONS = {
    "validate": ["--json"],
    "compile": ["--check", "--force", "--json", "--out", "--target"],
    "plan": ["--json", "--top"],
    "estimate": ["--cp", "--dp", "--dp-shard", "--ep", "--etp", "--gpu", "--json", "--micro-batch", "--offload-optimizer",
                 "--offload-params", "--plan", "--pp", "--recompute", "--schedule", "--sequence-parallel", "--tp", "--vpp",
                 "--zero"],  # --plan: re-cost a compiled plan.json (issue #14)
    "smoke": ["--allow-edited", "--json", "--preempt-at", "--slurm", "--steps", "--target", "--timeout"],
    "check": ["--diff", "--generated", "--json", "--specs-dir"],  # --diff: the details behind the summary (issue #15)
    "diff": ["--base", "--format", "--unified"],
    "schema": [],
    "catalog": ["--json"],
    "data": [],
    "calibrate": ["--date", "--name", "--output", "--sweep"],  # issue #12: cluster profiles
    "sweep": ["--local-cpu", "--output", "--steps", "--submit", "--top"],  # issue #12: on-cluster sweeps
}


def test_cli_options_are_frozen():
    from compiler.cli import cli

    import click

    ctx = click.Context(cli)
    for name, expected in EXPECTED_OPTIONS.items():
        command = cli.get_command(ctx, name)
        assert command is not None, name
        options = sorted(opt for p in command.params if isinstance(p, click.Option) for opt in p.opts
                         if opt.startswith("--") and opt != "--help")
        assert options == sorted(expected), (
            f"`dtc {name}` options changed: {options}; new knobs belong in the spec, not in flags "
            f"(update tests/test_frozen_surface.py if this is intended)")


def test_help_states_exit_codes():
    result = run_cli(["--help"])
    for code in ("0 ok", "1 differences", "2 user error", "3 internal error"):
        assert code in result.stdout


def test_committed_schema_accepts_the_example_specs():
    """What editors see: every example spec validates against schemas/spec.schema.json."""
    import jsonschema
    from ruamel.yaml import YAML

    schema = json.loads((REPO / "schemas/spec.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted((REPO / "specs").glob("*.yaml")):
        data = YAML(typ="safe").load(path.read_text())
        errors = [e.message for e in validator.iter_errors(data)]
        assert not errors, f"{path.name}: {errors}"
    bad = {"name": "x", "model": {"preset": "llama3-8b"}, "training": {"tokens": "1T"}, "cluster": {"gpu": "h100"},
           "layout": {"tensor_paralel": 8}}
    assert list(validator.iter_errors(bad)), "unknown keys must fail the schema"
