"""Every shipped example is loaded and planned, and README's commands name only files that exist.

Each example starts with the command that runs it (a comment); here its plan is made the way
that command's dry run makes it (no AWS call), so an example a release breaks fails here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_example_loads_plans_and_names_its_own_command(path, no_aws_config):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# distrain-cloud submit ") and f"examples/{path.name}" in first, first
    # The flags the command gives (an example may leave where and how long to them), as the CLI maps them.
    words = shlex.split(first[2:])[2:]
    flags = dict(zip(words[0::2], words[1::2], strict=False)) if words[0].startswith("--") else {}
    overrides = {"instance": flags.get("--instance"), "max_run": flags.get("--max-run")}
    spec = load_spec(path, overrides)
    plan = plan_job(spec, dry_run=True)
    failed = [c for c in plan.checks if c.ok is False]
    assert failed == [], failed


def test_readme_commands_name_files_that_exist():
    readme = (REPO / "README.md").read_text()
    assert "job.yaml" not in readme, "README names a job.yaml that does not ship: point at examples/"
    named = set(re.findall(r"examples/[\w.-]+\.yaml", readme))
    assert named and all((REPO / n).is_file() for n in named), named
    for line in readme.splitlines():  # every submit of an example parses as a command line
        if "distrain-cloud submit" in line and "examples/" in line:
            shlex.split(line.split("#")[0].strip("` |").split("`")[0])
