"""What the CLI prints: --json is JSON only on stdout; a failed plan check ends with one error line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from clirun import run_cli


@pytest.mark.slow
def test_submit_json_is_one_document_the_plan_and_its_result_with_metrics(cli, tmp_path):
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
    tool = subprocess.run([sys.executable, "-m", "json.tool"], input=r.stdout, capture_output=True, text=True)
    assert tool.returncode == 0, tool.stderr  # once "Extra data": a plan, then a result
    plan = json.loads(r.stdout)
    result = plan.pop("result")
    root = tmp_path / "runs" / plan["job_name"]
    metrics = result.pop("metrics")
    assert result == {
        "job": plan["job_name"],
        "backend": "local",
        "status": "Completed",
        "exit_code": 0,
        "model": str(root / "model"),
        "detail": None,
    }
    assert metrics["step"] == 2 and {"train_loss", "eval_loss", "eval_accuracy"} <= set(metrics), metrics
    assert plan["backend"] == "local" and plan["checks"]  # the plan, as --dry-run --json prints it
    assert "model_saved=" in r.stderr  # the training log, on stderr


def test_submit_json_refused_by_a_check_is_one_document_too(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "submit", "--instance", "local", "--json", "--", "--lr", "-1")
    plan = json.loads(out)
    result = plan["result"]
    assert code == 2 and result["status"] == "NotSubmitted" and result["exit_code"] == 2
    assert result["job"] == plan["job_name"] and "learning rate is positive" in result["error"]
    assert err.splitlines() == ["error: " + result["error"]]
    code, out, _ = run_cli(capsys, "submit", "--instance", "local", "--json", "--dry-run", "--", "--lr", "-1")
    assert code == 1 and "result" not in json.loads(out)  # a dry run's document is the plan alone


@pytest.mark.parametrize(
    "flags, exit_code, error",
    [
        (["--nodes", "abc"], 2, "Invalid value for '--nodes' / '-n': 'abc' is not a valid integer."),  # click's
        (["--strategy", "zz"], 2, "the command line: strategy (--strategy): unknown strategy 'zz'; choose one of: "),
        (["--", "--max-stpes", "5"], 2, "training arguments: unrecognized arguments: --max-stpes 5 (did you mean "),
        (["--instance", "ml.g5.xlarge", "--region", "us-east-1", "--yes"], 3, "no AWS credentials found: "),
    ],
    ids=["click", "spec", "training-flag", "no-credentials"],
)
def test_submit_json_refused_before_a_plan_is_one_document_too(tmp_path, monkeypatch, capsys, no_aws_config, flags,
                                                               exit_code, error):  # fmt: skip
    # A script reads stdout as one JSON document however the submit ends: the refusal's `result`,
    # shaped as a refused plan's, with no plan around it (none was made).
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "submit", "--json", *flags)
    document = json.loads(out)
    assert list(document) == ["result"] and code == exit_code
    result = document["result"]
    assert (result["job"], result["status"], result["exit_code"]) == (None, "NotSubmitted", exit_code)
    assert result["error"].startswith(error) and result["error"] in err  # the error line as before
    code, out, _ = run_cli(capsys, "resume", "no-such-job", "--json")
    assert code == 2 and json.loads(out)["result"]["job"] == "no-such-job"
    code, out, _ = run_cli(capsys, "submit", "--nodes", "abc")  # without --json: click's usage error alone
    assert (code, out) == (2, "")


def test_last_metrics_reads_a_hostile_metrics_file_as_numbers_only(tmp_path):
    from distrain_cloud.launcher.cli import last_metrics

    path = tmp_path / "metrics.jsonl"
    assert last_metrics(path) is None
    lines = [
        '{"step": 10, "train_loss": 2.5, "lr": 0.001}',
        "not json",
        "[1, 2]",
        '{"step": 20, "train_loss": 1.5, "eval_loss": NaN, "note": "text", "flag": true}',
        '{"step": 20, "eval_loss": 1.75, "eval_accuracy": 0.5}',
        "[" * 100_000,
    ]
    path.write_text("\n".join(lines))
    assert last_metrics(path) == {"step": 20, "train_loss": 1.5, "lr": 0.001, "eval_loss": 1.75, "eval_accuracy": 0.5}


def test_a_dry_run_with_a_failed_check_ends_with_one_error_line(cli, tmp_path):
    r = cli("submit", "--instance", "local", "--dry-run", "--", "--lr", "-1", cwd=tmp_path)
    assert r.returncode == 1 and "[FAIL] learning rate is positive" in r.stdout
    assert r.stderr.splitlines() == [
        "error: plan check failed, nothing was created: learning rate is positive "
        "(--lr -1.0: give a positive rate, e.g. 3e-4)"
    ]
    ok = cli("submit", "--instance", "local", "--dry-run", cwd=tmp_path)
    assert ok.returncode == 0 and ok.stderr == ""
