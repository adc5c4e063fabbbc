"""The package import graph: every arrow points down, and no package cycle.

Every ``import`` of rayspec's own modules counts, wherever it is written: at the top, inside a
function (a lazy import) or under ``TYPE_CHECKING``. A node is a subpackage (``rayspec/search/``)
or a module at the top (``rayspec/_config.py``); the layers below are the house as drawn in
docs/CONTRACTS.md, lowest first. A new package goes into ``LAYERS`` where it belongs.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "rayspec"

# Lowest first: a node may import only nodes before it.
LAYERS = (
    "_version",
    "_plural",
    "_text",
    "_yaml",  # YAML documents bounded before they are built: imports yaml only
    "_secrets",  # which variables are secrets, and how a script reads them: stdlib only
    "_tls",  # one TLS context per process for the HTTP clients: stdlib only
    "_atomic",  # a study's files written atomically, never through a link: stdlib only
    "_exceptions",
    "_types",
    "_drafttree",  # EAGLE-3's draft-tree arithmetic, shared by twin and search
    "_rayerrors",  # Ray's errors as rayspec's: imports ray and _exceptions only
    "_popen",  # the one Popen: imports the standard library and _exceptions only
    "metrics",
    "store",
    "_schema",
    "engines",
    "_validate",
    "twin",
    "_config",
    "server",
    "bench",
    "screen",
    "search",
    "results",
    "report",
    "tune",
    "testing",
    "__init__",  # the package's own front: re-exports leaves, imported by no module of it
)


def _node(module: str) -> str:
    """The graph node of a dotted module name under rayspec."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _module_of(path: pathlib.Path) -> tuple[str, bool]:
    rel = path.relative_to(ROOT.parent).with_suffix("").parts
    if rel[-1] == "__init__":
        return ".".join(rel[:-1]), True
    return ".".join(rel), False


def _imported(path: pathlib.Path) -> set[str]:
    """Every rayspec module ``path`` imports, absolute, lazy and TYPE_CHECKING ones included."""
    module, is_package = _module_of(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
                found.add(name)
                if not node.module:  # "from . import x" imports the submodule x
                    found.update(f"{name}.{alias.name}" for alias in node.names)
            elif node.module:
                found.add(node.module)
    return {name for name in found if name == "rayspec" or name.startswith("rayspec.")}


def package_graph() -> dict[str, dict[str, list[str]]]:
    """node -> {imported node: [files of node that import it]}."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module, _ = _module_of(path)
        source = "__init__" if path == ROOT / "__init__.py" else _node(module)
        for name in _imported(path):
            target = _node(name)
            if target != source:
                where = str(path.relative_to(ROOT.parent))
                graph.setdefault(source, {}).setdefault(target, []).append(where)
    return graph


def test_every_node_has_a_layer() -> None:
    nodes = {
        "__init__" if p == ROOT / "__init__.py" else _node(_module_of(p)[0])
        for p in ROOT.rglob("*.py")
    }
    assert sorted(nodes - set(LAYERS)) == [], "add the new package to LAYERS where it belongs"


def test_no_arrow_points_up() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    up = [
        f"{source} -> {target} ({', '.join(sorted(files))})"
        for source, targets in package_graph().items()
        for target, files in targets.items()
        if rank.get(target, -1) >= rank.get(source, len(LAYERS))
    ]
    assert up == []


def test_no_package_cycle() -> None:
    graph = {s: set(t) for s, t in package_graph().items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == []


def _imports_of(package: str) -> list[tuple[str, str]]:
    """(file, imported rayspec module) for every import in ``rayspec/<package>/``."""
    return [
        (str(path.relative_to(ROOT.parent)), name)
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in sorted(_imported(path))
    ]


def test_the_search_does_not_import_the_twin() -> None:
    """The search's model is its own assumption, not the twin's code: the draft-tree arithmetic
    both use is in ``rayspec/_drafttree.py``, below both (docs/CONTRACTS.md, Search)."""
    found = [
        f"{f}: {n}" for f, n in _imports_of("search") if n.split(".")[:2] == ["rayspec", "twin"]
    ]
    assert found == []


@pytest.mark.parametrize("package", ["search", "tune"])
def test_no_private_module_of_the_twin_is_imported(package: str) -> None:
    """The driver reads the twin through ``rayspec.twin``'s public names only."""
    found = [
        f"{f}: {n}"
        for f, n in _imports_of(package)
        if n.startswith("rayspec.twin.") and n.split(".")[2].startswith("_")
    ]
    assert found == []


@pytest.mark.parametrize("name", ["optuna", "pyarrow"])
def test_report_reads_the_study_through_the_lower_packages(name: str) -> None:
    """report/ draws; opening a stored study (Optuna's journal, the Parquet files) is below it."""
    users = []
    for path in sorted((ROOT / "report").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n == name or n.startswith(name + ".") for n in names):
                users.append(f"{path.name}:{node.lineno}")
    assert users == []
