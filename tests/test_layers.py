"""The package's layering: no import cycle (lazy imports included) and no module using another's private names.

Every ``import`` and ``from ... import`` in ``tsconv/`` is read with ``ast``, wherever it stands (module level
or inside a function), and resolved to a module of the package. A cycle among those edges, a name with a
leading underscore taken from another module (``from .x import _y``), or an attribute with a leading
underscore read off an imported module (``x._y``) fails the test, naming the files.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tsconv

ROOT = Path(tsconv.__file__).parent
PACKAGE = "tsconv"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(current: str, is_package: bool, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The package module ``name`` refers to (a module, or the package holding a name)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Edges module -> modules it imports, and every cross-module private name used."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private: list[str] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        aliases: dict[str, str] = {}  # local name -> package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != PACKAGE:
                        continue
                    target = _target(alias.name, modules)
                    if target and target != mod:
                        edges[mod].add(target)
                        aliases[alias.asname or alias.name.split(".")[0]] = target
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_package, node.module, node.level)
                if base.split(".")[0] != PACKAGE:
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = _target(full, modules) if full in modules else _target(base, modules)
                    if target is None or target == mod:
                        continue
                    edges[mod].add(target)
                    if full in modules:
                        aliases[alias.asname or alias.name] = full
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{path.relative_to(ROOT.parent)}: from {base} import {alias.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                private.append(f"{path.relative_to(ROOT.parent)}: {aliases[node.value.id]}.{node.attr}")
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _without_package_faces(edges: dict[str, set[str]], modules: dict[str, Path]) -> dict[str, set[str]]:
    """A package's ``__init__`` that only re-exports names lazily is not a layer: drop edges into a package
    from its own submodules (importing ``tsconv.io.x`` runs ``tsconv/io/__init__.py``, never the reverse)."""
    return {
        m: {t for t in ts if not (modules[t].name == "__init__.py" and m.startswith(t + "."))}
        for m, ts in edges.items()
    }


def test_no_import_cycles_lazy_imports_included():
    modules = _modules()
    edges, _ = _imports(modules)
    cycles = _cycles(_without_package_faces(edges, modules))
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_module_uses_another_modules_private_names():
    _, private = _imports(_modules())
    assert private == [], "private names used across modules:\n" + "\n".join(sorted(private))


def test_the_checker_sees_lazy_imports_and_private_names(tmp_path):
    """The walk itself: a cycle through a function-level import and a private name are both found."""
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    from .c import _g\n    return a\n")
    (pkg / "c.py").write_text("def _g():\n    pass\n")
    global ROOT
    saved = ROOT
    ROOT = pkg
    try:
        modules = _modules()
        edges, private = _imports(modules)
    finally:
        ROOT = saved
    assert _cycles(_without_package_faces(edges, modules)) == [["tsconv.a", "tsconv.b"]]
    assert private == ["tsconv/b.py: from tsconv.c import _g"]
