"""Flags mean what they say (issue 39): each refused in one line that names the flag and what to
give instead, before anything is created or paid for, through the real CLI in this process."""

from __future__ import annotations

import json

import pytest
from clirun import run_cli


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _failed(err: str) -> str:
    """The one `error:` line of a refused plan."""
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    return line


def test_a_train_file_that_is_a_directory_says_so_and_what_to_pass(here, capsys):
    (here / "data").mkdir()
    code, out, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--", "--train-file", "data")
    assert code == 1 and "no such file" not in out + err
    assert _failed(err) == (
        f"error: plan check failed, nothing was created: --train-file {here / 'data'} is a file (it is a directory: "
        f"give one data file in it (csv, json, jsonl, parquet or txt), or the folder as --dataset {here / 'data'})"
    )
    assert not (here / "runs").exists()


def test_the_job_itself_says_a_train_file_is_a_directory(here):
    # The job's own check, for a spec planned elsewhere: the same words, not "no such file".
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.contract import Contract
    from distrain_cloud.training.data import DataError, resolve_sources

    (here / "data").mkdir()
    contract = Contract(model_dir=here / "m", output_dir=here / "o", checkpoint_dir=here / "c")
    with pytest.raises(DataError, match=r"^--train-file: .*/data is a directory: give one data file in it "):
        resolve_sources(parse_args(["--train-file", str(here / "data")]), contract)


@pytest.mark.parametrize(
    "typo, hint",
    [
        ("--max-stpes", " (did you mean --max-steps?)"),
        ("--lrr=3", " (did you mean --lr?)"),
        ("--zzzzzz", ""),
        # a prefix is no flag: argparse's abbreviations would take it while it is unique, and a
        # later flag that shares it would change what a saved command means
        ("--max-step", " (did you mean --max-steps?)"),
        ("--rope-table", " (did you mean --rope-tables?)"),
    ],
)
def test_a_mistyped_training_flag_gets_a_did_you_mean(here, capsys, typo, hint):
    code, out, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--", typo, "5")
    assert (code, out) == (2, "")
    assert err == f"error: training arguments: unrecognized arguments: {typo} 5{hint}\n"


LONG = "a" * 300  # longer than a file name may be (255 bytes): stat() fails with ENAMETOOLONG


@pytest.mark.parametrize(
    "instance, flags, code, says",
    [
        # a local job's data paths are made absolute first: the check names the path it looked at
        ("local", ["--train-file", LONG], 1, "plan check failed, nothing was created: --train-file /"),
        ("ml.p3.8xlarge", ["--train-file", LONG], 1, f"plan check failed, nothing was created: --train-file {LONG}"),
        ("local", ["--model-config", f"{LONG}.json"], 0, None),  # no size to estimate; the job says what is missing
        ("ml.p3.8xlarge", ["--model", LONG], 0, None),  # a Hub id, as far as this machine can tell
        ("local", ["--dataset", f"./{LONG}"], 1, "plan check failed, nothing was created: --dataset /"),
    ],
    ids=["train-file-local", "train-file-cloud", "model-config", "model", "dataset"],
)
def test_a_path_too_long_for_a_file_name_is_a_path_that_is_not_there(here, capsys, instance, flags, code, says):
    """Found by the EC2 plan's property test: pathlib raised for a name too long where it answers
    False for a missing one, and the plan ended in a traceback."""
    got, out, err = run_cli(capsys, "submit", "--instance", instance, "--dry-run", "--", "--task", "causal-lm", *flags)
    assert "Traceback" not in out + err and "OSError" not in out + err
    assert got == code, err
    assert says is None or says in err


def test_a_config_override_of_the_wrong_type_names_the_key_the_value_and_the_type(here, capsys):
    pytest.importorskip("transformers")
    flags = ["--task", "causal-lm", "--config-overrides", "n_layer=abc"]
    code, out, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--", *flags)
    assert code == 1 and "invalid literal" not in out + err
    assert _failed(err) == (
        "error: plan check failed, nothing was created: --config-overrides fit the model's config "
        "(--config-overrides n_layer=abc: n_layer takes an integer (now 2), not 'abc')"
    )


def _checkpoint(runs, job: str, step: int, state: bytes) -> None:
    folder = runs / job / "checkpoints" / f"checkpoint-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "COMPLETE").touch()
    (folder / "trainer_state.json").write_bytes(state)


def test_resuming_with_max_steps_at_or_below_the_checkpoints_step_is_refused_at_plan_time(here, capsys):
    _checkpoint(here / "runs", "earlier-1", 50, json.dumps({"step": 50, "strategy": "ddp"}).encode())
    for steps in ("20", "50"):
        code, out, err = run_cli(
            capsys, "submit", "--instance", "local", "--resume-from", "earlier-1", "--", "--max-steps", steps
        )
        assert code == 2, err
        assert _failed(err) == (
            "error: plan check failed, nothing was created: --max-steps is beyond the checkpoint's step (the "
            f"checkpoint is at step 50 and --max-steps {steps} trains nothing further: give more, e.g. --max-steps 100)"
        )
    assert sorted(p.name for p in (here / "runs").iterdir()) == ["earlier-1"]  # no Failed job folder
    code, out, err = run_cli(
        capsys, "submit", "--instance", "local", "--resume-from", "earlier-1", "--dry-run", "--", "--max-steps", "60"
    )
    assert code == 0 and "[ok  ] --max-steps is beyond the checkpoint's step: 50 -> 60" in out, err


@pytest.mark.parametrize(
    "state",
    [
        b"[" * 100_000,
        b'{"step": "50"}',
        b'{"step": true}',
        b"\xff\xfe",
        b'{"step": 50, "pad": "' + b"x" * (2 << 20) + b'"}',
    ],
    ids=["deep", "string-step", "bool-step", "not-utf8", "huge"],
)
def test_a_checkpoint_state_that_is_not_one_refuses_nothing_and_breaks_nothing(here, capsys, state):
    _checkpoint(here / "runs", "earlier-1", 50, state)
    code, out, err = run_cli(
        capsys, "submit", "--instance", "local", "--resume-from", "earlier-1", "--dry-run", "--", "--max-steps", "20"
    )
    assert code == 0, err
    assert "[FAIL]" not in out  # a state that is not one: the job, which verifies its checkpoint, decides


# ---------------------------------------------------------------------------- what a user sees


def _running(runs, log: bytes):
    """A local job folder whose status.json names a live process (started in the folder) and
    whose job.log holds `log`; the process, to end."""
    import socket
    import subprocess
    import sys

    from distrain_cloud.training.stopping import _start_time

    root = runs / "job-1"
    root.mkdir(parents=True)
    (root / "job.json").write_text("{}")
    (root / "job.log").write_bytes(log)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=root)
    status = {"status": "InProgress", "exit_code": None, "pid": proc.pid, "host": socket.gethostname()}
    (root / "status.json").write_text(json.dumps({**status, "started": _start_time(proc.pid), "updated": 1.0}))
    return proc


STEP_LINE = (
    b"2026-11-28T17:30:00.000Z step=40 train_loss=2.3100 lr=0.0003 tokens_per_sec=1234 progress=40/100 "
    b"elapsed=0:00:40 eta=0:01:00 time=2026-11-28T17:30:00Z\n"
)


def test_status_of_a_running_local_job_shows_where_it_stands_not_its_record(here, capsys):
    import time

    proc = _running(here / "runs", b"2026-11-28T17:29:00.000Z loading\n" + STEP_LINE + b"eval_loss=2.5\n")
    try:
        code, out, err = run_cli(capsys, "status", "job-1")
        assert (code, err) == (0, "")
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((here / "runs/job-1/job.json").stat().st_mtime))
        assert out.splitlines()[:7] == [
            "job_name: job-1",
            "status: InProgress",
            "step: 40/100",
            "loss: 2.3100",
            "elapsed: 0:00:40",
            "eta: 0:01:00",
            f"created: {created}",
        ]
        assert "None" not in out and "started:" not in out and "terminal:" not in out
        code, out, _ = run_cli(capsys, "status", "job-1", "--json")  # scripts keep every field
        info = json.loads(out)
        assert (info["step"], info["eta"], info["exit_code"], info["terminal"]) == ("40/100", "0:01:00", None, False)
        assert isinstance(info["started"], int)
    finally:
        proc.kill()
        proc.wait()


def test_a_step_line_in_a_log_is_read_as_anyones_bytes(here, capsys):
    from distrain_cloud.launcher.backends.local import last_progress

    hostile = b"step=1 progress=\x1b]0;owned\x07" + b"9" * 10_000 + b" train_loss=\xff\xfe eta=1\n"
    log = here / "job.log"
    log.write_bytes(STEP_LINE + hostile + b"x" * (70 << 10))  # the step lines before the tail read
    assert last_progress(log, running=True) == {}
    log.write_bytes(STEP_LINE + hostile)
    shown = last_progress(log, running=True)
    assert shown["step"].startswith("\x1b]0;owned\x07999") and len(shown["step"]) == 40
    assert shown["loss"] == "\ufffd\ufffd" and shown["eta"] == "1"
    assert "eta" not in last_progress(log, running=False)  # an ended job has no ETA
    assert last_progress(here / "absent.log", running=True) == {}


def test_ls_finds_local_jobs_submitted_from_another_folder_and_says_where_it_looks(here, capsys, job_records):
    elsewhere = here / "project" / "runs"
    for name in ("job-1", "job-2"):
        (elsewhere / name).mkdir(parents=True)
        (elsewhere / name / "job.json").write_text("{}")
        (elsewhere / name / "status.json").write_text('{"status": "Completed", "exit_code": 0}')
    job_records.mkdir(parents=True, exist_ok=True)
    # What submit records (jobs.write_record), for job-1 only; a record naming a path is skipped.
    (job_records / "job-1.json").write_text(
        json.dumps({"name": "job-1", "backend": "local", "workdir": str(elsewhere)})
    )
    (job_records / "x.json").write_text(json.dumps({"name": "../..", "backend": "local", "workdir": str(elsewhere)}))
    (here / "other").mkdir()
    code, out, err = run_cli(capsys, "ls", "--backend", "local", "--workdir", str(here / "other" / "runs"), "--json")
    assert (code, err) == (0, "")
    assert [(j["job_name"], j["workdir"]) for j in json.loads(out)] == [("job-1", str(elsewhere))]
    code, out, err = run_cli(capsys, "ls", "--backend", "local", "--workdir", str(elsewhere), "--json")
    assert sorted(j["job_name"] for j in json.loads(out)) == ["job-1", "job-2"]  # job-1 once
    (job_records / "job-1.json").unlink()
    code, out, err = run_cli(capsys, "ls", "--backend", "local", "--workdir", str(here / "other" / "runs"))
    assert code == 0 and err == (
        f"note: no jobs; local ones are looked for in {here / 'other' / 'runs'} and in the folders this machine's "
        f"records ({job_records}) name: --workdir FOLDER for another folder\n"
    )


def test_ls_at_80_columns_puts_a_long_detail_under_its_row_not_a_word_per_line(here, capsys, monkeypatch):
    name = "distrain-20261128-172300-abc123"
    detail = f"stopped on request (distrain-cloud cancel); resume with --resume-from {name}"
    for job, text in ((name, detail), ("short-1", "")):
        (here / "runs" / job).mkdir(parents=True)
        (here / "runs" / job / "job.json").write_text("{}")
        (here / "runs" / job / "status.json").write_text(json.dumps({"status": "Stopped", "detail": text}))
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(capsys, "ls", "--backend", "local")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80 and lines[0].split() == ["job", "backend", "status", "created"]
    row = next(i for i, line in enumerate(lines) if line.startswith(name))
    under = [line.strip() for line in lines[row + 1 :] if line.startswith("    ")]
    assert " ".join(under) == detail and under[-1] == name  # whole words, the job name unbroken
    assert lines[row].split()[1:3] == ["local", "Stopped"]
    assert any(line.startswith("short-1 ") for line in lines)
    monkeypatch.setenv("COLUMNS", "200")  # room enough: the detail is a column again
    code, out, _ = run_cli(capsys, "ls", "--backend", "local")
    assert out.splitlines()[0].split()[-1] == "detail" and detail in out


@pytest.fixture
def no_aws_calls(no_aws_config, monkeypatch):
    import botocore.client

    def refuse(self, operation_name, api_params):
        raise AssertionError(f"an offline dry run called AWS: {operation_name}")

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", refuse)


@pytest.mark.parametrize("region", [None, "eu-west-1"])
def test_infra_up_dry_run_without_aws_shows_the_template_and_says_what_needs_aws(no_aws_calls, capsys, region):
    flags = ["--region", region] if region else []
    code, out, err = run_cli(capsys, "infra", "up", "--dry-run", "--parameter", "EnableSsm=true", *flags)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    missing = "no AWS credentials are configured" if region else "no AWS region is configured"
    where = f"in {region}" if region else "in your default region"
    assert lines[0] == (
        f"dry run, offline ({missing}): the resources stack 'distrain-cloud' {where} holds when created from "
        "infra/stack.yaml; not a change set"
    )
    assert "  Bucket                    AWS::S3::Bucket" in lines
    assert "  NodeSecurityGroup         AWS::EC2::SecurityGroup" in lines
    assert "  parameter EnableSsm = true" in lines and "  parameter LogRetentionDays = 30 (default)" in lines
    assert lines[-1].startswith("needs AWS: whether the stack exists and what an update would change or replace")
    # The parameters are checked as a real run checks them.
    code, out, err = run_cli(capsys, "infra", "up", "--dry-run", "--parameter", "Nope=1")
    assert code == 2 and out == "" and err.startswith("error: --parameter Nope: the stack has no such parameter")


# A job's processes as the node launcher behaves on a stop: SIGTERM ends it at its step's end with
# a checkpoint, exit STOP_EXIT_CODE (training/contract.py); until then it trains.
_TRAINS_UNTIL_STOPPED = (
    "import signal, sys, time\n"
    "from distrain_cloud.training.contract import STOP_EXIT_CODE\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('stopped=SIGTERM step=7 checkpoint_saved=1', flush=True), "
    "sys.exit(STOP_EXIT_CODE)))\n"
    "print('step=7 train_loss=2.5 progress=7/1000', flush=True)\n"
    "time.sleep(60)\n"
)


def test_max_run_on_a_local_job_stops_it_as_cancel_does_with_a_checkpoint(here, capsys):
    import sys
    import time

    from distrain_cloud.launcher.api import plan_job, submit_job
    from distrain_cloud.launcher.spec import load_spec

    plan = plan_job(load_spec(None, {"instance": "local", "max_run": "1s"}), dry_run=True)
    assert plan.request["max_run_s"] == 1
    assert plan.summary["max_run"] == "1 s, then it stops with a checkpoint, as cancel does"
    plan.request["command"] = [sys.executable, "-c", _TRAINS_UNTIL_STOPPED]  # the stop, not a training run
    began = time.monotonic()
    code = submit_job(plan)
    assert time.monotonic() - began < 40  # the limit ended it, not its 60 s
    _, err = capsys.readouterr()
    assert f"job {plan.job_name}: --max-run 1 s reached: stopping it with a checkpoint" in err
    assert err.rstrip().endswith(f"; continue it: distrain-cloud resume {plan.job_name}")  # the last line
    status_code, out, _ = run_cli(capsys, "status", plan.job_name, "--json")
    info = json.loads(out)
    assert (status_code, info["status"], info["exit_code"]) == (0, "Stopped", code)
    assert info["detail"] == f"stopped at its --max-run limit; resume with --resume-from {plan.job_name}"
    # the kill that a stop arms (80 s after it) went with the job: no timer of it outlives submit
    import threading

    for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
        timer.join(timeout=5)
        assert not timer.is_alive(), timer


def test_without_max_run_a_local_job_has_no_limit(here):
    # The 24 h default bounds a cloud bill; a local job runs until it ends unless told otherwise.
    from distrain_cloud.launcher.api import plan_job
    from distrain_cloud.launcher.spec import load_spec

    plan = plan_job(load_spec(None, {"instance": "local"}), dry_run=True)
    assert "max_run_s" not in plan.request and "max_run" not in plan.summary


@pytest.mark.slow  # a real training run, stopped by its limit: ~21 s (its start, ~5 s, well inside)
def test_max_run_stops_a_real_local_run_with_a_checkpoint(cli, tmp_path):
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = cli("submit", "--instance", "local", "--max-run", "20s", "--", "--max-steps", "100000", "--report-to", "none",
            cwd=tmp_path, env=env)  # fmt: skip
    assert r.returncode == 143, r.stderr[-2000:]
    (root,) = (tmp_path / "runs").iterdir()
    assert [p.name for p in (root / "checkpoints").glob("checkpoint-*")], r.stderr[-2000:]
    assert "checkpoint_saved=1" in r.stdout and f"distrain-cloud resume {root.name}" in r.stderr.splitlines()[-1]
    status = json.loads(cli("status", root.name, "--json", cwd=tmp_path).stdout)
    assert status["status"] == "Stopped" and status["detail"].startswith("stopped at its --max-run limit; ")


@pytest.mark.slow  # eight plans with their code bundles: ~6 s
def test_every_readme_and_ec2_doc_line_naming_the_cloud_example_plans_offline(no_aws_calls, capsys, monkeypatch):
    """README's cloud lines name a spec file that ships (examples/), and each plans as written."""
    import re
    import shlex
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    pattern = re.compile(r"(distrain-cloud [^`#\n]*examples/cloud-gpt2-emotion\.yaml[^`#\n]*)")
    commands = [m.strip() for doc in ("README.md", "docs/ec2.md") for m in pattern.findall((repo / doc).read_text())]
    assert len(commands) >= 8 and not re.search(r"\bjob\.yaml\b", (repo / "README.md").read_text())
    for command in commands:
        argv = [a for a in shlex.split(command)[1:] if a not in ("--wait", "--yes", "--dry-run")]
        if argv[0] == "submit":
            argv += ["--dry-run", "--region", "us-east-1"]
        code, out, err = run_cli(capsys, *argv)
        assert code == 0 and out, f"{command}: {err}"
