"""`distrain-cloud logs`: text as the job printed it, or with --json one JSON object per line
(time, host, message) and nothing else on stdout. Cloud jobs: test_sagemaker_lifecycle.py and
test_ec2_lifecycle.py."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from clirun import run_cli

from distrain_cloud.launcher.logs import LogLine, iso_utc, split_lines


def json_lines(out: str) -> list[dict]:
    """Every stdout line as JSON: json.loads raises on any line that is not."""
    records = [json.loads(line) for line in out.splitlines()]
    assert all(set(r) == {"time", "host", "message"} for r in records)
    return records


def local_job(runs: Path, log: bytes, status: str = "Completed", name: str = "job-1") -> Path:
    """A local job's folder as `submit` leaves it: plan, status and log."""
    root = runs / name
    root.mkdir(parents=True)
    (root / "job.json").write_text("{}")
    alive = {"pid": os.getpid(), "host": socket.gethostname()} if status == "InProgress" else {}
    (root / "status.json").write_text(json.dumps({"status": status, "exit_code": None, **alive}))
    (root / "job.log").write_bytes(log)
    return root


def test_a_cloudwatch_event_is_one_record_per_line_with_its_time():
    assert list(split_lines("a\r\nb\n", "algo-1", "t")) == [LogLine("t", "algo-1", "a"), LogLine("t", "algo-1", "b")]
    assert list(split_lines("", "algo-1")) == [LogLine(None, "algo-1", "")]  # an empty line stays a line
    assert iso_utc(1732600000123) == "2024-11-26T05:46:40.123Z"
    assert LogLine(None, "algo-2", "x").text() == "[algo-2] x" and LogLine(None, "local", "x").text() == "x"


def test_local_logs_as_text_and_as_json_lines(tmp_path, capsys):
    runs = tmp_path / "runs"
    local_job(runs, b'step=10 train_loss=2.0\r\nnot utf-8: \xff\n\n{"a": 1}\nlast line, no newline')
    code, out, err = run_cli(capsys, "logs", "job-1", "--workdir", str(runs))
    assert (code, err) == (0, "")
    assert out == 'step=10 train_loss=2.0\nnot utf-8: \ufffd\n\n{"a": 1}\nlast line, no newline\n'
    code, out, err = run_cli(capsys, "logs", "job-1", "--workdir", str(runs), "--json")
    assert (code, err) == (0, "")
    assert json_lines(out) == [
        {"time": None, "host": "local", "message": m}
        for m in ["step=10 train_loss=2.0", "not utf-8: \ufffd", "", '{"a": 1}', "last line, no newline"]
    ]


def test_local_logs_follow_json_prints_whole_lines_until_the_job_ends(tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    root = local_job(runs, b"step=10 train_loss=2.0\nstep=20 tra", status="InProgress")

    def job_goes_on(seconds: float) -> None:
        with open(root / "job.log", "ab") as log:
            log.write(next(more))
        if log_ends.pop(0):
            (root / "status.json").write_text(json.dumps({"status": "Completed", "exit_code": 0}))

    more = iter([b"in_loss=1.5\n", b"model_saved=model\n"])
    log_ends = [False, True]
    monkeypatch.setattr(time, "sleep", job_goes_on)
    code, out, err = run_cli(capsys, "logs", "job-1", "--workdir", str(runs), "--follow", "--json")
    assert (code, err, log_ends) == (0, "", [])
    assert [r["message"] for r in json_lines(out)] == [
        "step=10 train_loss=2.0",
        "step=20 train_loss=1.5",  # written in two pieces, printed once whole
        "model_saved=model",
    ]


def test_logs_of_an_unknown_local_job_is_one_error_line_on_stderr(tmp_path, capsys):
    code, out, err = run_cli(capsys, "logs", "nope", "--backend", "local", "--workdir", str(tmp_path), "--json")
    assert code != 0 and out == ""
    assert err.startswith("error: no local job 'nope'") and len(err.splitlines()) == 1


def test_local_lines_carry_the_time_the_job_wrote_them(tmp_path, capsys, monkeypatch):
    # node_launch stamps each line it writes to a local job's log; `logs` gives the time apart.
    from distrain_cloud.training.node_launch import LOG_TIMES_ENV, stamped

    monkeypatch.setenv(LOG_TIMES_ENV, "1")
    written = stamped("step=10 train_loss=2.0\n")
    when = written.split(" ", 1)[0]
    assert len(when) == len("2026-11-28T01:23:45.678Z") and when.endswith("Z")
    monkeypatch.delenv(LOG_TIMES_ENV)
    assert stamped("x\n") == "x\n"  # other backends' logs have times of their own
    runs = tmp_path / "runs"
    # A line written without one (the secret wrapper's, an older job's) has none.
    local_job(runs, written.encode() + b"unstamped line\n2026-11-28T01:23:45.678Z model_saved=model")
    code, out, err = run_cli(capsys, "logs", "job-1", "--workdir", str(runs), "--json")
    assert (code, err) == (0, "")
    assert json_lines(out) == [
        {"time": when, "host": "local", "message": "step=10 train_loss=2.0"},
        {"time": None, "host": "local", "message": "unstamped line"},
        {"time": "2026-11-28T01:23:45.678Z", "host": "local", "message": "model_saved=model"},
    ]
    code, out, err = run_cli(capsys, "logs", "job-1", "--workdir", str(runs))
    assert out == "step=10 train_loss=2.0\nunstamped line\nmodel_saved=model\n"
