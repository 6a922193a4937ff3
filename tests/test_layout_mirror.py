"""The tests mirror the product's folders: a property of the tree, asserted over it.

The rules.
- A folder of tests/ that holds test files is the folder of the same path in the repository
  (tests/launcher/backends/ec2/agent/ tests launcher/backends/ec2/agent/, tests/bench/ tests
  bench/). tests/e2e/ is the one exception: it runs the whole product end to end, and is named for
  that. Data folders and shims hold no test files and are not asked.
- A test file directly in tests/launcher/backends/ tests one of that folder's modules
  (test_local_backend.py: backends/local.py): its name says which.
- A test file whose product imports (module level, the file's subjects) all lie in one backend
  (a home in launcher/backends/__init__.py's BACKENDS: `ec2/`, `sagemaker/`, `local.py`) tests that
  backend alone, and sits under tests/launcher/backends/. A file that also imports the floor, the
  trainer or another backend tests how they meet, and stays where its other subject is.
- Test file names are unique across tests/: pytest imports them by basename (no __init__.py,
  "prepend" import mode), and two of one name fail collection.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WHOLE_PRODUCT = {"e2e"}  # tests/ folders that run the whole product and mirror no one folder
BACKENDS_DIR = REPO / "launcher" / "backends"


def _test_files(root: Path) -> list[Path]:
    return sorted(root.rglob("test_*.py"))


def unmirrored(tests: Path, repo: Path) -> list[str]:
    """Folders under `tests` with test files and no folder of the same path in `repo`."""
    folders = {p.parent.relative_to(tests) for p in _test_files(tests)} - {Path(".")}
    return sorted(
        str(folder) for folder in folders if folder.parts[0] not in WHOLE_PRODUCT and not (repo / folder).is_dir()
    )


def unnamed_modules(tests_backends: Path, backends: Path) -> list[str]:
    """Test files directly in `tests_backends` whose name names no module or folder of `backends`."""
    homes = {p.stem for p in backends.iterdir() if p.suffix == ".py" or p.is_dir()} - {"__init__", "__pycache__"}
    return sorted(
        p.name
        for p in tests_backends.glob("test_*.py")
        if not any(f"{p.stem}_".startswith(f"test_{home}_") for home in homes)
    )


def product_imports(source: str) -> set[str]:
    """The distrain_cloud modules a test file imports at module level (its subjects), as dotted
    paths below distrain_cloud; `from A import b` counts as A.b (b may be a module or a name in A:
    either way it lies inside A)."""
    found: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("distrain_cloud.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("distrain_cloud."):
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name.removeprefix("distrain_cloud.") for name in found}


def backend_alone(source: str, homes: set[str]) -> str | None:
    """The one backend home (`ec2`, `local`, ...) every module-level product import of `source`
    lies in, or None where it imports none, or more than one backend, or anything else."""
    reached = set()
    for name in product_imports(source):
        parts = name.split(".")
        if parts[:2] != ["launcher", "backends"] or len(parts) < 3 or parts[2] not in homes:
            return None  # the floor, the trainer, infra, or the backends registry itself
        reached.add(parts[2])
    return reached.pop() if len(reached) == 1 else None


def _homes() -> set[str]:
    from distrain_cloud.launcher.backends import BACKENDS

    return {module.split(".")[0] for module in BACKENDS.values()}


def test_every_test_folder_mirrors_a_product_folder():
    assert unmirrored(TESTS, REPO) == []
    # and the rule can fail: a folder for a backend that does not exist is named
    assert unmirrored(TESTS, REPO / "nowhere") != []


def test_a_test_file_beside_the_backend_folders_names_its_module(tmp_path):
    assert unnamed_modules(TESTS / "launcher" / "backends", BACKENDS_DIR) == []
    # and the rule can fail: a name that is no module's, or only starts like one, is named
    for name in ("test_batch_backend.py", "test_localhost.py", "test_local.py"):
        (tmp_path / name).write_text("")
    assert unnamed_modules(tmp_path, BACKENDS_DIR) == ["test_batch_backend.py", "test_localhost.py"]


def test_a_test_of_one_backend_alone_sits_under_its_backend_folder():
    homes = _homes()
    misplaced = [
        f"{path.relative_to(TESTS)} (tests backends/{home} alone)"
        for path in _test_files(TESTS)
        if path.relative_to(TESTS).parts[0] not in WHOLE_PRODUCT
        and (home := backend_alone(path.read_text(), homes))
        and (TESTS / "launcher" / "backends") not in path.parents
    ]
    assert misplaced == []


def test_the_one_backend_rule_reads_imports_as_meant():
    homes = {"ec2", "sagemaker", "local"}
    assert backend_alone("from distrain_cloud.launcher.backends.ec2 import quotas\n", homes) == "ec2"
    assert backend_alone("import distrain_cloud.launcher.backends.ec2.agent.node\n", homes) == "ec2"
    assert backend_alone("from distrain_cloud.launcher.backends import local\n", homes) == "local"
    both = "from distrain_cloud.launcher.backends.ec2 import quotas\nfrom distrain_cloud.launcher import api\n"
    assert backend_alone(both, homes) is None  # the floor too: how they meet
    two = (
        "from distrain_cloud.launcher.backends.ec2 import quotas\n"
        + "from distrain_cloud.launcher.backends import local\n"
    )
    assert backend_alone(two, homes) is None
    assert backend_alone("from distrain_cloud.launcher.backends import BACKENDS\n", homes) is None  # the registry
    assert backend_alone("from distrain_cloud.launcher.backends.cloud import as_list\n", homes) is None  # shared
    lazy = "def test_x():\n    from distrain_cloud.launcher.backends.ec2 import quotas\n"
    assert backend_alone(lazy, homes) is None  # a lazy import is a helper's, not the file's subject


def test_test_file_names_are_unique():
    twice = [name for name, n in Counter(p.name for p in _test_files(TESTS)).items() if n > 1]
    assert twice == []
