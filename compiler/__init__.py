"""dtc, the distributed training compiler.

The pipeline is a chain of pure stages over frozen types:
``load_spec -> lower -> solve -> render_artifacts`` (Spec -> Problem -> Plan -> ArtifactSet);
``write_artifacts`` is the only disk writer.
"""
# ``render_artifacts``, not ``render``: that name is the compiler.render subpackage, which shadows a lazy attribute
# once any of its modules is imported
__all__ = ["load_spec", "lower", "solve", "render_artifacts", "compile_spec", "write_artifacts"]


def __getattr__(name: str):  # lazy: `dtc --help` imports this package and must not pay for pydantic models
    if name == "load_spec":
        from compiler.spec.load import load_spec
        return load_spec
    if name == "lower":
        from compiler.problem import lower
        return lower
    if name == "solve":
        from compiler.solver import solve
        return solve
    if name == "render_artifacts":
        from compiler.render.all_targets import render
        return render
    if name == "compile_spec":
        from compiler.pipeline import compile_spec
        return compile_spec
    if name == "write_artifacts":
        from compiler.artifacts import write_artifacts
        return write_artifacts
    raise AttributeError(name)
