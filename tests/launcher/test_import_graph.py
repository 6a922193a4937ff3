"""No import circles inside distrain_cloud: a property of the house, asserted over its source.

The rule. A module depends on every module it imports anywhere: at module level, inside a
function (a lazy import, which only moves the circle to run time) and under `if TYPE_CHECKING:`
(types are part of a module's design). Two modules that depend on each other, directly or round
a longer loop, cannot be read, changed or moved apart, so none may. A circle is broken by moving
the shared piece into a module below both (or the piece that needs both into one above them),
never by hiding the import.

What an import statement names: `import a.b` and `from a import b` name `a.b` when that is a
module of ours, else the package `a` (whose `__init__.py` defines `b`). Parent packages that
Python runs on the way are not counted: they are not what the writer asked for.
`backends.get_backend`'s `importlib.import_module` is the backend registry (a name looked up at
run time), not an import statement, and is not counted either.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("launcher", "training", "infra")  # installed as distrain_cloud.<root> (setup.py)


def _modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in (REPO / root).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found["distrain_cloud." + ".".join(parts)] = path
    return found


def _named(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (every import statement, wherever it stands)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _named(name, path.name == "__init__.py", node, modules):
                while target and target not in modules:  # `import a.b.Thing`: the module a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_of_ours_imports_itself_round_a_circle():
    graph = import_graph()
    found = circles(graph)
    shown = [
        "; ".join(f"{a} -> {b}" for a in circle for b in sorted(graph[a]) if b in circle)
        for circle in (sorted(c) for c in found)
    ]
    assert not found, "import circles:\n" + "\n".join(s.replace("distrain_cloud.", "") for s in shown)


def test_the_graph_sees_every_kind_of_import():
    """The rule's three kinds (module level, lazy, TYPE_CHECKING) and both spellings are edges, so
    the test above can fail: a circle made of each is found."""
    graph = import_graph()
    # module level, `from . import x`: the EC2 backend imports its layout module
    assert "distrain_cloud.launcher.backends.ec2.layout" in graph["distrain_cloud.launcher.backends.ec2.backend"]
    # lazy, inside a function: api.submit_job imports the lease
    assert "distrain_cloud.launcher.lease" in graph["distrain_cloud.launcher.api"]
    # under TYPE_CHECKING: the Backend protocol names the Plan type
    assert "distrain_cloud.launcher.plan" in graph["distrain_cloud.launcher.backends"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
