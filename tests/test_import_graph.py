"""No import circle inside compiler/: every `import` and `from ... import` of every module, those inside
functions included (a lazy import kept for start-up speed is still a dependency), read with ast.

Importing ``a.b.c`` first runs the __init__.py of ``a`` and ``a.b``, so an import depends on those packages
too, except on the importer's own packages (already initialised, or being initialised, when it runs): a heavy
package __init__ cannot hide a circle.

Imports under ``if TYPE_CHECKING:`` are left out: they never run, and they are how a module names a
type for its annotations without depending on the module that defines it.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "compiler"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``package`` (a package is its __init__.py)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` (or ``if typing.TYPE_CHECKING:``)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere in its body.

    ``from a.b import c`` depends on a.b.c when that is a module, else on a.b; relative imports are
    resolved against the module's package.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _type_checking_only(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    out.add(f"{source}.{alias.name}")
                elif source in modules:
                    out.add(source)
    out.discard(name)
    return out | package_inits(name, out, modules)


def package_inits(name: str, imported: set[str], modules: dict[str, Path]) -> set[str]:
    """The packages whose __init__.py importing ``imported`` runs, other than ``name``'s own (and itself)."""
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    inits = {".".join(m.split(".")[:i]) for m in imported for i in range(1, m.count(".") + 1)}
    return {p for p in inits if p in modules and p not in own}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_files(package)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle per strongly connected component of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_shortest_circle(graph, c) for c in components]


def _shortest_circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest circle through the component's first module (breadth-first), start repeated at the end."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_compiler_has_no_import_circle() -> None:
    graph = import_graph()
    assert "compiler.cli" in graph and "compiler.review.plans" in graph  # the walk found the package
    found = cycles(graph)
    assert not found, "import circles in compiler/ (break each by moving the shared piece to a module both use):\n" \
        + "\n".join("  " + " -> ".join(c) for c in found)


def test_a_circle_is_found_and_named(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .c import g\n")  # lazy and relative: still an edge
    (pkg / "sub" / "c.py").write_text("import pkg.a\nfrom typing import TYPE_CHECKING\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    (pkg / "e.py").write_text("from pkg import d\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b", "pkg.sub"}  # importing pkg.sub.b runs pkg/sub/__init__.py first
    assert graph["pkg.sub.b"] == {"pkg.sub.c"}  # its own package is already initialised
    assert graph["pkg.d"] == set()  # under TYPE_CHECKING only
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]]


def test_a_circle_through_a_package_init_is_found(tmp_path: Path) -> None:
    """heavy/__init__.py imports f, f imports g, g imports heavy.leaf: importing heavy.leaf runs the __init__."""
    pkg = tmp_path / "pkg"
    (pkg / "heavy").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy" / "__init__.py").write_text("from pkg.f import x\n")
    (pkg / "heavy" / "leaf.py").write_text("")
    (pkg / "f.py").write_text("import pkg.g\n")
    (pkg / "g.py").write_text("from pkg.heavy.leaf import y\n")
    graph = import_graph(pkg)
    assert graph["pkg.g"] == {"pkg.heavy.leaf", "pkg.heavy"}
    assert cycles(graph) == [["pkg.f", "pkg.g", "pkg.heavy", "pkg.f"]]
