"""The launcher's common floor names no backend: a property of the house, asserted over its source.

The rule. A module of `launcher/` outside `launcher/backends/` (the floor: cli, api, lease, jobs,
export, checks, ...) reaches a backend only through `backends.get_backend(name)` and the Backend
protocol's questions (`cancel(job, now=...)`, `find`, `holder_state`, `billed`, ...), so adding a
backend is its folder plus one registration (docs/adding-a-backend.md). So the floor never
- imports a backend's module (`backends.ec2...`, `backends.sagemaker...`, `backends.local`),
  at module level, lazily or under TYPE_CHECKING; `backends` itself and `backends.cloud` (what the
  cloud backends share) are not a backend;
- compares something's `.backend` to a backend's name ("ec2", "sagemaker"), which is what a
  floor that asks "which backend is this?" instead of asking the backend looks like.
`spec.py` defines the names (the spec's `Literal`, INSTANCE_KINDS) and is allowed. "local" is
allowed: `plan.backend == "local"` is the honest question "this machine, not billed?".

A plain grep cannot do it: "ec2" and "sagemaker" are also AWS service names (`aws.client("ec2")`,
`ServiceCode="sagemaker"`), and a backend's name appears in help text and messages.
"""

from __future__ import annotations

import ast
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
BACKEND_MODULES = ("ec2", "sagemaker", "local")  # the folders and module under launcher/backends/
NAMED = {"ec2", "sagemaker"}  # compared to `.backend`: a question for the backend, not the floor
ALLOWED = {"spec.py"}  # defines the names


def _floor() -> list[Path]:
    return sorted(
        p for p in LAUNCHER.rglob("*.py") if "backends" not in p.relative_to(LAUNCHER).parts and p.name not in ALLOWED
    )


def _imported(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement reaches, relative to launcher/ ("backends.ec2.backend")."""
    if isinstance(node, ast.Import):
        return [a.name.removeprefix("distrain_cloud.launcher.") for a in node.names]
    if node.level:
        package = list(path.relative_to(LAUNCHER).parent.parts)
        package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        base = ".".join([*package, *([node.module] if node.module else [])])
    else:
        base = (node.module or "").removeprefix("distrain_cloud.launcher")
        base = base.removeprefix(".")
    return [f"{base}.{a.name}" if base else a.name for a in node.names]


def _is_backend(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[0] == "backends" and parts[1] in BACKEND_MODULES


def _names_backend(node: ast.Compare) -> bool:
    """`x.backend == "ec2"`, `"sagemaker" != y.backend`, `x.backend in ("ec2", ...)`, `x["backend"] == "ec2"`."""

    def is_backend(e: ast.expr) -> bool:
        if isinstance(e, ast.Attribute):
            return e.attr == "backend"
        if isinstance(e, ast.Subscript):
            return isinstance(e.slice, ast.Constant) and e.slice.value == "backend"
        return False

    def names(e: ast.expr) -> bool:
        if isinstance(e, ast.Constant):
            return e.value in NAMED
        if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
            return any(names(x) for x in e.elts)
        return False

    sides = [node.left, *node.comparators]
    return any(is_backend(s) for s in sides) and any(names(s) for s in sides)


def violations(path: Path, source: str) -> list[str]:
    """`file:line: what` for each import of a backend module and each `.backend` compared to a name."""
    found = []
    where = path.relative_to(LAUNCHER)
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [f"{where}:{node.lineno}: imports {n}" for n in _imported(path, node) if _is_backend(n)]
        elif isinstance(node, ast.Compare) and _names_backend(node):
            found.append(f"{where}:{node.lineno}: asks which backend: {ast.unparse(node)}")
    return found


def test_no_floor_module_imports_a_backend_or_asks_which_backend_it_holds():
    found = [v for path in _floor() for v in violations(path, path.read_text(encoding="utf-8"))]
    assert not found, "the floor names a backend (ask get_backend(name) and the Backend protocol):\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_violation():
    """Every spelling the rule forbids is found (so the test above can fail), and the allowed ones are not."""
    cli = LAUNCHER / "cli.py"
    assert violations(cli, "from .backends.ec2.backend import BACKEND") != []
    assert violations(cli, "def f():\n    from .backends.local import BACKEND") != []
    assert violations(cli, "from .backends import sagemaker") != []
    assert violations(cli, "import distrain_cloud.launcher.backends.ec2.rehearse") != []
    assert violations(LAUNCHER / "agent_like" / "x.py", "from ..backends.ec2 import layout") != []
    assert violations(cli, "if ref.backend != 'ec2': pass") != []
    assert violations(cli, "ok = 'sagemaker' == plan.backend") != []
    assert violations(cli, "ok = body['backend'] in ('ec2', 'sagemaker')") != []
    # allowed: the registry, what the cloud backends share, "this machine?", an AWS service name
    assert violations(cli, "from .backends import BACKENDS, get_backend\nfrom .backends.cloud import repo_root") == []
    assert violations(cli, "if plan.backend == 'local': pass") == []
    assert violations(cli, "aws.client('ec2', region); q.get_paginator('x').paginate(ServiceCode='sagemaker')") == []
