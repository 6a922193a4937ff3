"""Every S3 key the launcher and the EC2 node agent both use is named once, in backends/ec2/layout.py."""

from __future__ import annotations

import ast
from pathlib import Path

from distrain_cloud.launcher.backends.ec2 import layout

REPO = Path(__file__).resolve().parents[4]
EC2 = REPO / "launcher" / "backends" / "ec2"
# The names of layout's key parts: its module-level string constants.
KEY_NAMES = {name: value for name, value in vars(layout).items() if name.isupper() and isinstance(value, str) and value}


def test_no_other_module_names_a_key_part_of_its_own():
    """A constant spelling one of layout's key parts anywhere else in the EC2 backend (as
    recovery.py and agent/elastic.py each spelled `attempts` and `lineage.json`) is a second
    definition that can drift from the first."""
    again = []
    for path in sorted(EC2.rglob("*.py")):
        if path.name == "layout.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            constant = isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            if constant and node.value.value in KEY_NAMES.values():
                again.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not again, again


def test_the_boot_script_spells_the_keys_as_layout_names_them():
    """boot.py runs before the bundle (and layout.py in it) is unpacked: it spells the keys it
    writes itself, and they must be layout's."""
    source = (EC2 / "boot.py").read_text(encoding="utf-8")
    assert f'"/{layout.NODES}/"' in source
    assert f'"/{layout.STOP}"' in source
    assert f"/{layout.FAILURES}/{{slot}}.json" in source
    assert f'/{layout.LINEAGE_RECORD}"' in source


def test_an_attempts_keys_sit_in_its_jobs_folder():
    assert layout.attempt_job("run-1", 3) == "run-1/attempts/3"
    assert layout.attempt_key("p", "run-1", 3, layout.CLAIMS, "0.json") == "p/jobs/run-1/attempts/3/claims/0.json"
    assert layout.attempt_key("", "run-1", 2, layout.STOP) == "jobs/run-1/attempts/2/stop"
    assert layout.job_key("p", "run-1", layout.LINEAGE_RECORD) == "p/jobs/run-1/lineage.json"
    job_output = "s3://b/p/jobs/run-1/output/"
    assert layout.attempt_output_uri(job_output, 2) == "s3://b/p/jobs/run-1/attempts/2/output/"
