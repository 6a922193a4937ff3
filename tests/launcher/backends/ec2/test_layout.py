"""Every S3 key the launcher and the EC2 node agent both use is named once, in backends/ec2/layout.py."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

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


def test_the_recovery_block_round_trips_and_its_defaults_are_one_sides():
    """job.json's `recovery` is one record both sides read (recovery.py writes it, the node agent's
    elastic.py reads it back), so the replacement wait and the failure budget are defined once."""
    from distrain_cloud.launcher.backends.ec2 import recovery
    from distrain_cloud.launcher.backends.ec2.agent import elastic
    from distrain_cloud.launcher.spec import load_spec

    spec = load_spec(None, {"instance": "g4dn.12xlarge", "spot": True, "ec2": {"on_demand_after": 1}})
    written = recovery.description_block("job-a", 2, spec)
    block = layout.RecoveryBlock.from_json(written)
    assert block.to_json() == written and list(block.to_json()) == list(written)
    assert (block.replacement_wait_s, block.failure_budget) == (layout.REPLACEMENT_WAIT_S, layout.FAILURE_BUDGET)
    assert block.on_demand_request == written["on_demand_request"] and block.on_demand_after == 1
    # What a node reads when a value is left out: the launcher's defaults, not copies of them.
    job = types.SimpleNamespace(recovery={"group": "job-a", "max_restarts": 2})
    bounds = elastic.bounds_of(job)  # type: ignore[arg-type]
    assert (bounds.replacement_wait_s, bounds.failure_budget) == (layout.REPLACEMENT_WAIT_S, layout.FAILURE_BUDGET)
    assert (bounds.on_demand_after, bounds.on_demand_request) == (None, None)


@pytest.mark.parametrize(
    "block",
    [
        None,
        ["group"],
        {"max_restarts": 2},
        {"group": "job-a"},
        {"group": "job-a", "max_restarts": "two"},
        {"group": "job-a", "max_restarts": 2, "replacement_wait_s": [1800]},
        {"group": "job-a", "max_restarts": 2, "on_demand_after": "soon"},
        {"group": "job-a", "max_restarts": 2, "on_demand_after": 1, "on_demand_request": "update"},
    ],
)
def test_a_hostile_recovery_block_is_one_node_failure_line(block):
    """Every byte of job.json may be hostile: a block that is not what the launcher writes ends the
    node with one line, never a traceback."""
    from distrain_cloud.launcher.backends.ec2.agent import elastic
    from distrain_cloud.launcher.backends.ec2.agent.job import NodeFailure

    with pytest.raises(NodeFailure, match="job.json's recovery is not what the launcher writes"):
        elastic.bounds_of(types.SimpleNamespace(recovery=block))  # type: ignore[arg-type]


def test_a_hostile_failure_budget_is_at_least_one():
    block = layout.RecoveryBlock.from_json({"group": "g", "max_restarts": 1, "failure_budget": -5})
    assert block.failure_budget == 1
