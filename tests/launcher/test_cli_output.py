"""What the CLI prints: --json is JSON only on stdout; a failed plan check ends with one error line."""

from __future__ import annotations

import json
import os

import pytest


def json_objects(text: str) -> list[dict]:
    """Every JSON value in `text`, which must hold nothing else."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        while text[at].isspace():
            at += 1
        value, at = decoder.raw_decode(text, at)
        objects.append(value)
    return objects


@pytest.mark.slow
def test_submit_json_prints_the_plan_then_one_result_and_logs_on_stderr(cli, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = cli(
        "submit",
        "--instance",
        "local",
        "--json",
        "--",
        "--max-steps",
        "2",
        "--report-to",
        "none",
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    plan, result = json_objects(r.stdout)  # raises on anything that is not JSON
    root = tmp_path / "runs" / plan["job_name"]
    assert result == {
        "job": plan["job_name"],
        "backend": "local",
        "status": "Completed",
        "exit_code": 0,
        "model": str(root / "model"),
        "detail": None,
    }
    assert "model_saved=" in r.stderr  # the training log, on stderr


def test_submit_json_refused_by_a_check_still_ends_with_a_result(cli, tmp_path):
    r = cli("submit", "--instance", "local", "--json", "--", "--lr", "-1", cwd=tmp_path)
    plan, result = json_objects(r.stdout)
    assert r.returncode == 2 and result["status"] == "NotSubmitted" and result["exit_code"] == 2
    assert result["job"] == plan["job_name"] and "learning rate is positive" in result["error"]
    assert r.stderr.splitlines() == ["error: " + result["error"]]


def test_a_dry_run_with_a_failed_check_ends_with_one_error_line(cli, tmp_path):
    r = cli("submit", "--instance", "local", "--dry-run", "--", "--lr", "-1", cwd=tmp_path)
    assert r.returncode == 1 and "[FAIL] learning rate is positive" in r.stdout
    assert r.stderr.splitlines() == [
        "error: plan check failed, nothing was created: learning rate is positive "
        "(--lr -1.0: give a positive rate, e.g. 3e-4)"
    ]
    ok = cli("submit", "--instance", "local", "--dry-run", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stderr == ""
