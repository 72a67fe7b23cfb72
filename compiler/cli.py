"""The `dtc` command line: thin commands over the pipeline Spec -> Problem -> Plan -> Artifacts.

Every command turns a ``DtcError`` into its rendered diagnostics on stderr and
exit code 2 (or 3 for internal errors); any other exception is a bug and is
reported as INTERNAL ERROR with exit code 3, never as a bare traceback.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types

import click

from compiler.errors import EXIT_CODES_HELP, Diagnostic, DtcError, ExitCode, Location, printable

# name -> (module, attribute) of every subcommand, in --help order. Modules are imported
# only when their command runs, so `dtc validate` never pays for torch or the solver.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("compiler.commands.validate", "validate_command"),
    "compile": ("compiler.commands.compile", "compile_command"),
    "plan": ("compiler.commands.plan", "plan_command"),
    "estimate": ("compiler.commands.estimate", "estimate_command"),
    "check": ("compiler.commands.check", "check_command"),
    "diff": ("compiler.commands.diff", "diff_command"),
    "smoke": ("compiler.commands.smoke", "smoke_command"),
    "schema": ("compiler.commands.schema", "schema_command"),
    "catalog": ("compiler.commands.catalog", "catalog_command"),
    "data": ("compiler.commands.data", "data_command"),
    "calibrate": ("compiler.commands.calibrate", "calibrate_command"),
    "sweep": ("compiler.commands.sweep", "sweep_command"),
}


class DtcGroup(click.Group):
    """A lazily-loading click group whose commands report DtcErrors and bugs with dtc's exit codes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command with the whole first sentence of its help (click cuts it at about 45 characters)."""
        rows = []
        for name in self.list_commands(ctx):
            text = _short_help_from_source(*COMMANDS[name])
            if text is None:  # not a plain decorated function with a docstring: import the command
                cmd = self.get_command(ctx, name)
                if cmd is None or cmd.hidden:
                    continue
                text = cmd.get_short_help_str(limit=1000)
            rows.append((name, text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        with printable_output():
            return self._invoke(ctx)

    def _invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DtcError as exc:
            click.echo(exc.render(), err=True)
            ctx.exit(int(exc.exit_code))
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:  # the reader went away (dtc ... | head): nothing left to tell
            ctx.exit(int(ExitCode.USER_ERROR))
        except OSError as exc:  # the file system refused (a name too long, no permission, no space): not a bug
            click.echo(os_error(exc).render(), err=True)
            ctx.exit(int(ExitCode.USER_ERROR))
        except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug
            ctx.exit(report_internal_error(exc))


class _PrintableStream:
    """A text stream whose writes go through ``printable`` (line breaks kept): whatever a command
    echoes (a spec's file name, a value, a rank's log line, a generated file's diff), no ESC, CR,
    NUL or U+202E from it reaches the terminal or a PR comment as itself."""

    def __init__(self, stream) -> None:  # noqa: ANN001 - any text stream
        self._stream = stream

    def write(self, text):  # noqa: ANN001, ANN201 - the stream protocol
        return self._stream.write(printable(text, keep_newlines=True) if isinstance(text, str) else text)

    def __getattr__(self, name: str):  # noqa: ANN204 - flush, isatty, encoding, buffer, ...
        return getattr(self._stream, name)


@contextlib.contextmanager
def printable_output():
    """sys.stdout and sys.stderr through ``printable`` while a command runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PrintableStream(sys.stdout), _PrintableStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def os_error(exc: OSError) -> DtcError:
    """An OSError the pipeline did not expect, as a user error naming the path and the reason."""
    where = exc.filename if isinstance(exc.filename, (str, bytes)) else None
    shown = os.fsdecode(where) if where is not None else ""
    return DtcError(Diagnostic(summary=f"cannot use {shown}: {exc.strerror or exc}" if shown
                               else f"file system error: {exc.strerror or exc}",
                               location=Location(shown) if shown else None,
                               hint="check the path (each name at most 255 bytes), permissions and free space"))


def report_internal_error(exc: BaseException) -> int:
    import tempfile  # here: every command would otherwise pay for tempfile and traceback at start
    import traceback

    fd, path = tempfile.mkstemp(prefix="dtc-internal-error-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(exc, file=f)
    click.echo(f"INTERNAL ERROR: {type(exc).__name__}: {printable(exc)}\n"
               f"This is a bug in dtc; please report it with the traceback saved to {path}", err=True)
    return int(ExitCode.INTERNAL_ERROR)


@click.group(cls=DtcGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EXIT_CODES_HELP)
@click.version_option(package_name="dtc", prog_name="dtc")
def cli() -> None:
    """dtc, the distributed training compiler.

    One YAML spec (model, tokens, GPUs, budget) -> the best parallel layout under an
    explicit cost model -> DeepSpeed JSON, FSDP2 Python, Megatron-LM arguments and SLURM
    scripts, plus PLAN.md, all from one plan.
    """


def _short_help_from_source(module: str, attr: str) -> str | None:
    """The short help click would show for a command, read from its function's docstring in the module's
    source, so that `dtc --help` imports none of the commands (the solver, the cost model, pydantic); None
    when the command is not a plain function whose decorators set neither short_help, help, hidden nor
    deprecated."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attr:
            for deco in node.decorator_list:  # the @click.command / @click.group(...) call, not the options
                if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) \
                        and deco.func.attr in ("command", "group") \
                        and any(k.arg in ("short_help", "help", "hidden", "deprecated", "cls") for k in deco.keywords):
                    return None
            doc = ast.get_docstring(node)
            if not doc:
                return None
            # click's own shortening, through its public API (click.utils.make_default_short_help is deprecated)
            return click.Command(attr, help=doc.split("\f", 1)[0]).get_short_help_str(limit=1000)
    return None


PLUGINS_OFF = ("__all__", "1", "true")  # the values of PYDANTIC_DISABLE_PLUGINS that turn every plugin off


def _no_pydantic_plugins() -> None:
    """Turn pydantic's plugins off for dtc's own spec models, unless the user's environment says otherwise.

    Looking for plugins (pydantic's plugin loader reads the entry points of every installed distribution when the
    first model is built) cost about 10 ms of `dtc validate`'s CPU in paired runs on a machine with torch and
    DeepSpeed installed. With them off, the loader still imports ``importlib.metadata`` (and with it email, zipfile
    and csv) only to return no plugins: 10-25 ms more (alternating runs, min 0.210 -> 0.202 s and 0.231 -> 0.205 s; issue #14).
    So while plugins are off, ``pydantic.plugin._loader`` is a module whose ``get_plugins`` returns what the real
    one returns then, (); any other name imports the real module (tests/unit/test_cli_startup.py checks both)."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    name = "pydantic.plugin._loader"
    if os.environ["PYDANTIC_DISABLE_PLUGINS"] not in PLUGINS_OFF or name in sys.modules:
        return
    stub = types.ModuleType(name, "dtc's stand-in while pydantic's plugins are off (compiler/cli.py)")

    def real(attr: str) -> object:
        if attr.startswith("__"):  # the import system's own probes (``__path__``), not a name pydantic asks for
            raise AttributeError(attr)
        if sys.modules.get(name) is stub:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attr)

    stub.get_plugins = tuple  # type: ignore[attr-defined]
    stub.__getattr__ = real  # type: ignore[method-assign]
    sys.modules[name] = stub


def main() -> None:
    _no_pydantic_plugins()
    cli.main(prog_name="dtc")


if __name__ == "__main__":
    main()
