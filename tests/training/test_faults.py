"""The test hooks of the product live in one module, training/faults.py, and each is documented
there: a `DISTRAIN_TEST_*` variable read anywhere else is a hook nobody lists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAULTS = REPO / "training" / "faults.py"


def hook_names(path: Path) -> set[str]:
    """Every string constant of `path` that names a test hook's variable."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"DISTRAIN_TEST_\w+", n.value)
    }


def test_every_test_hook_of_the_product_is_in_training_faults():
    elsewhere = {
        f"{path.relative_to(REPO)}: {name}"
        for root in ("launcher", "training", "infra")
        for path in (REPO / root).rglob("*.py")
        if path != FAULTS
        for name in hook_names(path)
    }
    assert not elsewhere, "test hooks outside training/faults.py (move them there and list them):\n" + "\n".join(
        sorted(elsewhere)
    )


def test_each_hook_is_listed_in_the_modules_docstring():
    names = hook_names(FAULTS)
    assert len(names) == 8
    listed = set(re.findall(r"`(DISTRAIN_TEST_\w+)=", ast.get_docstring(ast.parse(FAULTS.read_text())) or ""))
    assert names == listed


def test_the_check_sees_a_hook_elsewhere(tmp_path):
    stray = tmp_path / "x.py"
    stray.write_text('import os\nif os.environ.get("DISTRAIN_TEST_BOOM"):\n    pass\n')
    assert hook_names(stray) == {"DISTRAIN_TEST_BOOM"}
