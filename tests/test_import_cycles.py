"""No import circles in stepwatch: every module under src/stepwatch is read with ``ast`` (nothing imported).

A circle means two modules that cannot be understood, tested or moved apart. At module level there is
none anywhere. Counting every import (those for type checkers and those inside functions too), the
report core, the protocol, the client, the CLI and the integrations have none either; the server's
that remain are listed below, exactly, and the list only shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Circles through an import for type checkers or inside a function; removed by the server regroup (none
# is left). Each is the set of modules that reach one another. When one goes, delete it here (the test
# says so).
SERVER_CIRCLES: frozenset[frozenset[str]] = frozenset()


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted((SRC / "stepwatch").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, every: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a module: those run when it is imported, or (``every``) all of them."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not every and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue  # runs when called, not when imported
        elif not every and isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:  # the ``else`` of ``if TYPE_CHECKING`` does run
                yield from _imports(ast.Module(body=[branch], type_ignores=[]), every)
        else:
            yield from _imports(node, every)


def _graph(every: bool) -> dict[str, set[str]]:
    """Which modules of the package each module imports (relative imports resolved)."""
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path)), every):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            edges[name] |= {target for target in targets if target in modules}
    return edges


def _circles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:  # Tarjan's algorithm; the package is far shallower than the recursion limit
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges[node]:
                found.add(frozenset(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _show(circles: AbstractSet[frozenset[str]], edges: dict[str, set[str]]) -> str:
    lines = []
    for circle in sorted(circles, key=sorted):
        lines.append("circle: " + ", ".join(sorted(circle)))
        lines += [f"    {m} imports {', '.join(sorted(edges[m] & circle))}" for m in sorted(circle)]
    return "\n".join(lines)


def test_the_graph_sees_the_imports() -> None:
    edges = _graph(every=True)
    assert len(edges) > 100
    assert "stepwatch.protocol" in edges["stepwatch._sender"]  # ``from .protocol import ...``
    assert "stepwatch.protocol" in edges["stepwatch.client._core"]  # ``from ..protocol import ...``
    assert "stepwatch._setup" in edges["stepwatch._run"]  # inside a function: counted only with every import
    assert "stepwatch._setup" not in _graph(every=False)["stepwatch._run"]


def test_no_module_level_import_circle() -> None:
    edges = _graph(every=False)
    circles = _circles(edges)
    assert not circles, "import circles at module level:\n" + _show(circles, edges)


def test_no_import_circle_at_all_but_the_servers_listed_ones() -> None:
    edges = _graph(every=True)
    circles = _circles(edges)
    new = circles - SERVER_CIRCLES
    assert not new, "import circles (counting imports for type checkers and in functions):\n" + _show(new, edges)
    gone = SERVER_CIRCLES - circles
    assert not gone, "these listed circles are gone (or changed): take them off SERVER_CIRCLES\n" + _show(gone, edges)


def test_only_the_server_may_have_listed_circles() -> None:
    assert all(m.startswith("stepwatch.server.") for circle in SERVER_CIRCLES for m in circle)


# The server's floors, lowest first: a module of a folder (or a module at the server's root) imports only
# from its own floor and the floors below. Why this order: ``stepwatch/server/__init__.py``.
SERVER_FLOORS: tuple[tuple[str, ...], ...] = (
    ("analysis",),
    ("store",),
    ("views",),
    ("live",),
    ("notify",),
    ("policies",),
    ("ingest",),
    ("services",),
    ("runners",),
    ("api",),
    ("settings",),
    ("app",),
    ("serving", "__init__"),
)

# Imports that go up a floor (counting every import, as the circle test does): (importer, imported) -> the file
# that holds it and why it is there. None is left (13 on 2026-12-07 before the floors were laid); a new one
# fails the test, and one that must stay for a while is listed here with its reason, to be removed.
SERVER_BACK_UP: dict[tuple[str, str], str] = {}


def _server_part(module: str) -> str | None:
    """The folder (or root module) of the server that holds ``module``; ``__init__`` for the package itself."""
    parts = module.split(".")
    if parts[:2] != ["stepwatch", "server"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def _floor_of() -> dict[str, int]:
    return {part: level for level, parts in enumerate(SERVER_FLOORS) for part in parts}


def _back_up(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import of a server module from a higher floor than its own."""
    floor = _floor_of()
    found = set()
    for module, targets in edges.items():
        part = _server_part(module)
        if part is None:
            continue
        for target in targets:
            other = _server_part(target)
            if other is not None and floor[other] > floor[part]:
                found.add((module, target))
    return found


def _file_of(module: str) -> str:
    path = _modules()[module]
    return str(path.relative_to(SRC / "stepwatch" / "server"))


def test_every_part_of_the_server_is_on_a_floor() -> None:
    parts = {_server_part(m) for m in _modules()} - {None}
    floor = _floor_of()
    assert len(floor) == sum(len(f) for f in SERVER_FLOORS), "a part is on two floors"
    assert parts == set(floor), (
        f"not on a floor: {sorted(parts - set(floor))}; no such part: {sorted(set(floor) - parts)}"
    )


def test_the_server_imports_down_its_floors_but_the_listed_ones() -> None:
    edges = _graph(every=True)
    found = _back_up(edges)
    new = found - set(SERVER_BACK_UP)
    assert not new, (
        "imports up a floor (see SERVER_FLOORS; move what is imported down, or the importer up):\n"
        + "\n".join(f"    {_file_of(m)}: {m} imports {t}" for m, t in sorted(new))
    )
    gone = set(SERVER_BACK_UP) - found
    assert not gone, "these listed imports no longer go up: take them off SERVER_BACK_UP\n" + "\n".join(
        f"    {m} imports {t}" for m, t in sorted(gone)
    )


def test_each_listed_back_up_import_says_where_and_why() -> None:
    for (module, _target), why in SERVER_BACK_UP.items():
        assert why.startswith(_file_of(module) + ": "), f"{module}: the reason starts with its file"
