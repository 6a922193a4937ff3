"""What a W&B run records beyond the flags: its lineage as the group, tags, and where and with what
code it ran. Pure: no W&B process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from distrain_cloud.training.args import ArgumentError, parse_args
from distrain_cloud.training.contract import Contract
from distrain_cloud.training.tracking import choose_wandb_run_id, code_hash, wandb_settings


def contract(root: Path, source: str) -> Contract:
    return Contract(root / "model", root / "output", root / "first-job" / "checkpoints", source=source)


def test_a_resumed_local_job_joins_its_lineage_group(tmp_path):
    # --precision given: without it the entry point resolves one for the GPUs before W&B starts
    args = parse_args(["--run-name", "second-job", "--strategy", "zero2", "--task", "causal-lm", "--precision", "no"])
    s = wandb_settings(args, contract(tmp_path, "distrain"), {})
    # The lineage's checkpoint folder is the first job's: both jobs land in its group.
    assert s["group"] == "first-job" and s["config"]["lineage"] == "first-job"
    assert s["tags"] == ["causal-lm", "zero2", "no", "distrain"]
    assert s["config"]["job"] == "second-job"
    assert (
        wandb_settings(args, contract(tmp_path, "distrain"), {"DISTRAIN_INSTANCE_TYPE": "local"})["config"]["instance"]
        == "local"
    )
    assert s["config"]["code_hash"] == code_hash() and len(code_hash()) == 12


def test_a_sagemaker_job_names_its_instance_and_image(tmp_path):
    args = parse_args(["--run-name", "job-1"])
    env = {"SM_CURRENT_INSTANCE_TYPE": "ml.g5.2xlarge", "DISTRAIN_IMAGE_URI": "example.invalid/train:1"}
    s = wandb_settings(args, contract(tmp_path, "sagemaker"), env)
    assert s["group"] == "job-1"  # /opt/ml/checkpoints names no lineage: the job is its own group
    assert (s["config"]["instance"], s["config"]["image"]) == ("ml.g5.2xlarge", "example.invalid/train:1")
    # A backend that knows the lineage says so.
    assert wandb_settings(args, contract(tmp_path, "sagemaker"), {"DISTRAIN_LINEAGE": "first"})["group"] == "first"


def test_hub_private_needs_a_repo():
    with pytest.raises(ArgumentError, match="--hub-private applies to the repo --push-to-hub REPO creates"):
        parse_args(["--hub-private"])
    assert parse_args(["--hub-private", "--push-to-hub", "me/tiny"]).hub_private


def test_hub_revision_needs_a_repo_and_a_branch_name():
    with pytest.raises(ArgumentError, match="--hub-revision names a branch of the --push-to-hub REPO"):
        parse_args(["--hub-revision", "v2"])
    assert parse_args(["--push-to-hub", "me/tiny", "--hub-revision", "exp/lr-3e-4"]).hub_revision == "exp/lr-3e-4"
    for bad in ("a..b", "-x", "v2/", "refs/pr/1", "has space"):
        with pytest.raises(ArgumentError, match=f"--hub-revision '{bad}': "):
            parse_args(["--push-to-hub", "me/tiny", f"--hub-revision={bad}"])


def test_the_run_id_is_the_checkpoints_then_the_launchers_then_a_new_one():
    chosen = {"DISTRAIN_WANDB_RUN_ID": "job-20250101-000000-abcdef"}
    assert choose_wandb_run_id("a1b2c3d4", chosen) == "a1b2c3d4"  # a resumed job appends to its run
    assert choose_wandb_run_id(None, chosen) == "job-20250101-000000-abcdef"  # the URL the launcher printed
    fresh = choose_wandb_run_id(None, {})
    assert len(fresh) == 8 and int(fresh, 16) >= 0 and fresh != choose_wandb_run_id(None, {})
    # One W&B would refuse: a run still starts, under an id of its own.
    assert "/" not in choose_wandb_run_id(None, {"DISTRAIN_WANDB_RUN_ID": "a/b"})
