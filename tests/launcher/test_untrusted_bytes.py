"""Bytes that come back to the user's machine are hostile until checked (issue 29, section 2).

A job's code writes its log lines, its node records, its metrics and its sample; whoever can
write a job's S3 prefix writes its job.json. None of it may drive the user's terminal (escape
sequences), inject markup into the report page, or turn `status`, `ls` or `report` into a
traceback. Each test runs the real CLI in this process (tests/clirun.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import time
from pathlib import Path

import pytest
from clirun import run_cli

from distrain_cloud.launcher.logs import printable

REGION = "us-east-1"
BUCKET = "stack-bucket"
LOG_GROUP = "/distrain-cloud/distrain-cloud/jobs"

# What a hostile line tries: set the window title (OSC 0), write the clipboard (OSC 52), clear
# the screen (CSI 2J) and home the cursor, the same through the one-byte C1 CSI, a carriage
# return that overwrites what the line showed, a bell, a backspace and a right-to-left override.
HOSTILE = (
    "\x1b]0;pwned\x07title \x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07clip \x1b[2J\x1b[Hclear "
    "\x9b2Jc1 fake\rreal\x08\x7f \u202eevil\u202c\tend"
)
# Bytes no terminal may receive from a remote line: C0 (but tab), DEL, C1, bidi overrides.
FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def assert_inert(text: str) -> None:
    """`text` as a terminal gets it: line breaks between lines, nothing else that moves or commands it."""
    for line in text.split("\n"):
        assert not FORBIDDEN.search(line), repr(line)


def test_printable_shows_every_control_and_keeps_the_rest():
    shown = printable(HOSTILE)
    assert_inert(shown)
    assert shown == (
        "\\x1b]0;pwned\\x07title \\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07clip \\x1b[2J\\x1b[Hclear "
        "\\x9b2Jc1 fake\\rreal\\x08\\x7f \\u202eevil\\u202c\tend"
    )
    assert printable("plain, tab\tand ünïcödé ✓") == "plain, tab\tand ünïcödé ✓"


# ====================================================================== terminal: local jobs


def local_job(runs: Path, name: str, log: bytes, status: dict) -> Path:
    root = runs / name
    root.mkdir(parents=True)
    (root / "job.json").write_text("{}")
    (root / "status.json").write_text(json.dumps(status))
    (root / "job.log").write_bytes(log)
    return root


def test_local_logs_and_status_print_controls_visibly_and_json_exactly(tmp_path, capsys):
    runs = tmp_path / "runs"
    detail = f"training exited: {HOSTILE}"
    local_job(runs, "job-1", HOSTILE.encode() + b"\nnext\n", {"status": "Failed", "exit_code": 1, "detail": detail})

    code, out, err = run_cli(capsys, "logs", "job-1", "--workdir", str(runs))
    assert (code, err) == (0, "")
    assert_inert(out)
    assert out.splitlines() == [printable(HOSTILE), "next"]
    code, out, err = run_cli(capsys, "logs", "job-1", "--workdir", str(runs), "--json")
    assert (code, err) == (0, "")
    assert [json.loads(line)["message"] for line in out.splitlines()] == [HOSTILE, "next"]  # exact

    code, out, err = run_cli(capsys, "status", "job-1", "--workdir", str(runs))
    assert (code, err) == (0, "")
    assert_inert(out)
    assert f"detail: {printable(detail)}" in out.splitlines()
    code, out, err = run_cli(capsys, "status", "job-1", "--workdir", str(runs), "--json")
    assert code == 0 and json.loads(out)["detail"] == detail

    code, out, err = run_cli(capsys, "ls", "--backend", "local", "--workdir", str(runs))
    assert code == 0 and "job-1" in out
    assert_inert(out)


def test_rich_markup_in_a_remote_detail_is_text_not_a_traceback(tmp_path, capsys):
    runs = tmp_path / "runs"
    detail = "[/bold] [link=https://example.invalid]click[/link] [red]"
    local_job(runs, "job-1", b"", {"status": "Failed", "exit_code": 1, "detail": detail})
    code, out, err = run_cli(capsys, "ls", "--backend", "local", "--workdir", str(runs))
    assert (code, err) == (0, "")
    assert "[/bold]" in out  # shown as written, not taken as markup


# ====================================================================== terminal + records: EC2


@pytest.fixture
def stack(mocked_aws, monkeypatch, job_records):
    """The bucket and log group of a stack (all that status, ls and logs read), made by hand."""
    import boto3

    from distrain_cloud.infra.stack import StackResources
    from distrain_cloud.launcher.backends.ec2 import records as ec2_records

    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    boto3.client("logs", region_name=REGION).create_log_group(logGroupName=LOG_GROUP)
    resources = StackResources(
        stack="distrain-cloud",
        region=REGION,
        bucket=BUCKET,
        job_boundary_arn="arn:aws:iam::123456789012:policy/boundary",
        security_group_id="sg-1",
        log_group=LOG_GROUP,
        launcher_policy_arn="arn:aws:iam::123456789012:policy/launcher",
    )
    monkeypatch.setattr(ec2_records, "stack_resources", lambda name, region: resources)
    # Every command below asks EC2 for the job's instances; moto's first EC2 call in a process
    # loads its catalogues (seconds): paid here, once, not inside the first test's timing.
    boto3.client("ec2", region_name=REGION).describe_instances()
    return resources


def put(key: str, body: bytes | dict | list) -> None:
    import boto3

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    boto3.client("s3", region_name=REGION).put_object(Bucket=BUCKET, Key=key, Body=data)


def ec2_job(name: str, *, nodes: int = 1, **changes) -> dict:
    """job.json of an EC2 job as submit writes it (the keys status, ls and logs read), in S3."""
    now = time.time()
    root = f"s3://{BUCKET}/distrain-cloud/jobs/{name}"
    description = {
        "job": name,
        "lineage": name,
        "attempt": 1,
        "nodes": nodes,
        "deadline": now + 3600,
        "log_group": LOG_GROUP,
        "checkpoint_uri": f"s3://{BUCKET}/distrain-cloud/checkpoints/{name}/",
        "model_uri": f"{root}/model/",
        "output_uri": f"{root}/output/",
        "instance_type": "g4dn.xlarge",
        "spot": False,
        "submitted": now - 60,
        **changes,
    }
    put(f"distrain-cloud/jobs/{name}/job.json", description)
    return description


def node(name: str, rank: int, record: bytes | dict | list) -> None:
    put(f"distrain-cloud/jobs/{name}/nodes/{rank}.json", record)


@pytest.mark.slow  # about ten CLI commands on moto's EC2, S3 and CloudWatch: 2.5-4.5 s
def test_ec2_logs_status_and_ls_print_remote_text_inert(stack, capsys):
    import boto3

    job = "evil-20250101-000000-abcdef"
    ec2_job(job)
    node(job, 0, {"status": "Failed", "exit_code": 1, "reason": HOSTILE, "step": 3, "instance_id": "i-1"})
    logs = boto3.client("logs", region_name=REGION)
    stream = f"{job}/node-0"
    logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    logs.put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName=stream,
        logEvents=[{"timestamp": int(time.time() * 1000), "message": HOSTILE}],
    )

    code, out, err = run_cli(capsys, "logs", job, "--backend", "ec2", "--region", REGION)
    assert (code, err) == (0, "")
    assert out == f"[node-0] {printable(HOSTILE)}\n"
    code, out, err = run_cli(capsys, "logs", job, "--backend", "ec2", "--region", REGION, "--json")
    assert json.loads(out)["message"] == HOSTILE

    code, out, err = run_cli(capsys, "status", job, "--backend", "ec2", "--region", REGION)
    assert (code, err) == (0, "")
    assert_inert(out)
    assert f"detail: node 0: {printable(HOSTILE)}" in out.splitlines()
    code, out, err = run_cli(capsys, "status", job, "--backend", "ec2", "--region", REGION, "--json")
    assert json.loads(out)["detail"] == f"node 0: {HOSTILE}"

    code, out, err = run_cli(capsys, "ls", "--backend", "ec2", "--region", REGION)
    assert code == 0 and "evil-" in out  # the table wraps the name
    assert_inert(out + err)

    code, out, err = run_cli(capsys, "wait", job, "--backend", "ec2", "--region", REGION)
    assert code == 1 and out == ""
    assert_inert(err)
    assert err.rstrip("\n").endswith(printable(HOSTILE))


# Each: (what is wrong, the job.json written, the node record written or None, words the line says).
BAD_JOBS = [
    ("not JSON", b"{not json", None, "not JSON"),
    ("not UTF-8", b'{"job": "\xff\xfe"}', None, "not JSON"),
    ("a list", [1, 2], None, "a JSON list, not an object"),
    ("nodes a string", "nodes", None, "'nodes'"),
    ("no deadline", "deadline", None, "'deadline'"),
    ("node record a list", None, [1], "nodes/0.json"),
    ("node record not JSON", None, b"\x00\x01", "nodes/0.json"),
    ("node status a dict", None, {"status": {"a": 1}, "step": 3}, "'status'"),
    ("node status unknown", None, {"status": "Pwned", "step": 3}, "'status'"),
    ("node step a dict", None, {"status": "InProgress", "step": {"a": 1}}, "'step'"),
    ("node step a bool", None, {"status": "InProgress", "step": True}, "'step'"),
    ("node reason a list", None, {"status": "Failed", "reason": ["x"], "exit_code": 1}, "'reason'"),
]


def write_bad_job(name: str, body, record) -> None:
    if isinstance(body, str) and body == "nodes":
        ec2_job(name, nodes="two")
    elif isinstance(body, str):
        description = ec2_job(name)
        description.pop(body)
        put(f"distrain-cloud/jobs/{name}/job.json", description)
    elif body is not None:
        put(f"distrain-cloud/jobs/{name}/job.json", body)
    else:
        ec2_job(name)
    if record is not None:
        node(name, 0, record)


@pytest.mark.slow  # about ten CLI commands on moto's EC2, S3 and CloudWatch: 2.5-4.5 s
def test_one_bad_ec2_record_is_one_line_in_status_and_a_note_in_ls_and_resume(stack, capsys):
    good = "good-20250101-000000-aaaaaa"
    ec2_job(good)
    bad = {f"bad{i}-20250102-000000-bbbbbb": case for i, case in enumerate(BAD_JOBS)}
    for name, (_, body, record, _) in bad.items():
        write_bad_job(name, body, record)

    code, out, err = run_cli(capsys, "ls", "--backend", "ec2", "--region", REGION, "--json")
    assert code == 0, err
    assert [j["job_name"] for j in json.loads(out)] == [good]
    notes = err.splitlines()
    assert len(notes) == len(bad), err
    for name, (what, _, _, says) in bad.items():
        (line,) = [n for n in notes if name in n]
        assert line.startswith("note: skipped EC2 job ") and says in line, (what, line)

    for name, (what, _, _, says) in bad.items():
        code, out, err = run_cli(capsys, "status", name, "--backend", "ec2", "--region", REGION)
        assert code != 0 and out == "", what
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and says in err, (what, err)
        assert "Traceback" not in err
    code, out, err = run_cli(capsys, "status", good, "--backend", "ec2", "--region", REGION, "--json")
    assert code == 0 and json.loads(out)["status"] == "InProgress"

    job = "spec-20250101-000000-cccccc"  # a job.json whose spec is none
    ec2_job(job, spec={"instance": 5, "nodes": "many"})
    code, out, err = run_cli(capsys, "resume", job, "--backend", "ec2", "--region", REGION, "--dry-run")
    assert code != 0 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "job.json" in err, err


# ====================================================================== records: this machine's


def test_one_bad_local_record_is_skipped_with_a_line_naming_it(tmp_path, capsys, job_records):
    runs = tmp_path / "runs"
    local_job(runs, "good-1", b"", {"status": "Completed", "exit_code": 0, "updated": 1.0})
    bad_status = {
        "bad-list": [1, 2],
        "bad-status": {"status": {"x": 1}},
        "bad-unknown": {"status": "Pwned"},
        "bad-pid": {"status": "InProgress", "pid": "1", "host": socket.gethostname()},
        "bad-updated": {"status": "Completed", "updated": "yesterday"},
    }
    for name, status in bad_status.items():
        local_job(runs, name, b"", status)
    (runs / "bad-bytes").mkdir()
    (runs / "bad-bytes" / "job.json").write_text("{}")
    (runs / "bad-bytes" / "status.json").write_bytes(b"\xff{")

    code, out, err = run_cli(capsys, "ls", "--backend", "local", "--workdir", str(runs), "--json")
    assert code == 0
    assert [j["job_name"] for j in json.loads(out)] == ["good-1"]
    notes = err.splitlines()
    assert len(notes) == len(bad_status) + 1, err
    for name in [*bad_status, "bad-bytes"]:
        (line,) = [n for n in notes if f"{name}/status.json" in n]
        assert line.startswith("note: skipped local job "), line
        code, out, err = run_cli(capsys, "status", name, "--workdir", str(runs))
        assert code != 0 and out == "" and len(err.splitlines()) == 1, (name, err)
        assert err.startswith("error: ") and f"{name}/status.json" in err, err


BAD_RECORDS = {
    "not-json": b"{nope",
    "not-utf8": b"\xff",
    "list": b"[1]",
    "backend-number": b'{"backend": 5}',
    "backend-unknown": b'{"backend": "nowhere"}',
    "bucket-list": b'{"backend": "ec2", "bucket": []}',
}


def test_a_bad_record_of_this_machine_is_one_line_in_status_and_skipped_in_ls(stack, capsys, job_records):
    job_records.mkdir(parents=True, exist_ok=True)
    for name, record in BAD_RECORDS.items():
        (job_records / f"{name}.json").write_bytes(record)
    good = "good-20250101-000000-aaaaaa"
    ec2_job(good)
    for name in BAD_RECORDS:
        code, out, err = run_cli(capsys, "status", name)
        assert code != 0 and out == ""
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and f"{name}.json" in err, err
    code, out, err = run_cli(capsys, "ls", "--backend", "ec2", "--region", REGION, "--json")
    assert code == 0 and [j["job_name"] for j in json.loads(out)] == [good]
    notes = err.splitlines()
    assert len(notes) == len(BAD_RECORDS) and all(n.startswith("note: skipped the record ") for n in notes), err


# ====================================================================== terminal: SageMaker


def test_a_sagemaker_failure_reason_is_printed_inert(stub_client, capsys):
    stub = stub_client("sagemaker", REGION)
    job = {
        "TrainingJobName": "job-1",
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:123456789012:training-job/job-1",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/x"},
        "TrainingJobStatus": "Failed",
        "SecondaryStatus": "Failed",
        "FailureReason": f"AlgorithmError: {HOSTILE}",
        "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "img"},
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
    }
    stub.add_response("describe_training_job", job, {"TrainingJobName": "job-1"})
    code, out, err = run_cli(capsys, "status", "job-1", "--backend", "sagemaker", "--region", REGION)
    assert (code, err) == (0, "")
    assert_inert(out)
    assert f"detail: AlgorithmError: {printable(HOSTILE)}" in out.splitlines()


# ====================================================================== the report page


def report_job(root: Path, metrics: bytes) -> Path:
    (root / "output").mkdir(parents=True)
    (root / "output" / "metrics.jsonl").write_bytes(metrics)
    return root


def rows(*items) -> bytes:
    return b"".join((i if isinstance(i, bytes) else json.dumps(i).encode()) + b"\n" for i in items)


def test_metric_names_are_escaped_and_their_plot_files_are_safe_distinct_slugs(tmp_path, capsys):
    names = [
        'eval_x"><script>alert(1)</script>',
        "eval_a/b",
        "eval_a-b",
        "eval_A-B",  # the same file as eval_a-b on a case-insensitive disk (macOS, Windows)
        "eval_../../../../escape",
        "eval_" + "n" * 400,
    ]
    root = report_job(tmp_path / "job-1", rows(*({"step": s, **{n: 0.5 + s for n in names}} for s in (1, 2))))
    code, out, err = run_cli(capsys, "report", str(root))
    assert (code, err) == (0, ""), err
    page = Path(out.strip()).read_text()
    assert "<script>" not in page and "alert(1)</script>" not in page
    ids = re.findall(r'<figure id="([^"]*)"', page)
    assert len(ids) == len(names) and all(re.fullmatch(r"plot-[a-z0-9_-]{1,80}", i) for i in ids), ids
    plots = sorted(p.name for p in (root / "report" / "plots").iterdir())
    assert len({p.lower() for p in plots}) == len(names) and all(
        re.fullmatch(r"[a-z0-9_-]{1,80}\.svg", p) for p in plots
    )
    assert sorted(f"plot-{p.removesuffix('.svg')}" for p in plots) == sorted(ids)
    assert not (tmp_path / "escape.svg").exists() and sorted(os.listdir(tmp_path)) == ["job-1"]


def test_bad_metric_rows_are_skipped_and_counted_in_one_line(tmp_path, capsys):
    good = [{"step": 1, "train_loss": 2.0}, {"step": 2, "train_loss": 1.5}]
    bad = [
        {"train_loss": 1.0},  # no step
        {"step": "3", "train_loss": 1.0},
        b'{"step": Infinity, "train_loss": 1.0}',
        b'{"step": NaN, "train_loss": 1.0}',
        b'{"step": 1e999, "train_loss": 1.0}',
        {"step": True, "train_loss": 1.0},
        {"step": 10**400, "train_loss": 1.0},
        {"step": None, "train_loss": 1.0},
        [1, 2],
        7,
        "row",
        b'{"step": 4, "train_loss": 1.0, "bytes": "\xff\xfe"}',  # not UTF-8
        b"[" * 100_000,  # deeper than json can nest
        b'{"step": 5, "train_loss": ' + b"9" * 5000 + b"}",  # more digits than Python parses
    ]
    odd_values = [
        {"step": 6, "train_loss": 10**400, "lr": True, "eval_loss": "x", "peak_mem_gb": [1]},  # values not plotted
        {"step": 7, "train_loss": 1e308, "eval_loss": -1e308},
    ]
    root = report_job(tmp_path / "job-1", rows(*good, *bad, *odd_values) + b"\n" + b'{"step": 8, "train')
    (root / "output" / "sample.txt").write_bytes(b"caf\xe9 <b>\xff")
    (root / "job.json").write_text(json.dumps({"summary": "x", "request": {"command": "python -- --lr 1"}}))
    (root / "status.json").write_text(json.dumps({"status": ["Completed"], "detail": {"a": "<i>"}}))
    code, out, err = run_cli(capsys, "report", str(root))
    assert code == 0, err
    assert err.splitlines() == [
        f"note: skipped {len(bad) + 1} of {len(good) + len(bad) + len(odd_values) + 1} rows "
        f"of {root / 'output' / 'metrics.jsonl'} that are not metric rows (the report shows the rest)"
    ]
    page = Path(out.strip()).read_text()
    assert "caf\ufffd &lt;b&gt;\ufffd" in page and "<i>" not in page
    assert "4 training log rows" in page


def test_a_metrics_file_of_no_rows_at_all_is_one_error_line(tmp_path, capsys):
    root = report_job(tmp_path / "job-1", b"\xff\xfe\x00garbage\n[1]\n")
    code, out, err = run_cli(capsys, "report", str(root))
    assert code != 0 and out == ""
    assert err.splitlines() == [
        f"error: {root / 'output' / 'metrics.jsonl'} holds no metric rows (2 lines, none a JSON object with a "
        "numeric step): is it a distrain-cloud job's metrics file?"
    ]


@pytest.mark.parametrize("plan", [b"[1]", b'{"request": "x"}', b'{"request": {"env": {"DISTRAIN_CHECKPOINT_DIR": 5}}}'])
def test_resume_from_a_local_job_whose_plan_is_not_one_uses_its_own_folder(tmp_path, plan):
    from distrain_cloud.launcher.backends import local

    (tmp_path / "job-1").mkdir()
    (tmp_path / "job-1" / "job.json").write_bytes(plan)
    assert local._lineage(tmp_path, "job-1") == ((tmp_path / "job-1" / "checkpoints").resolve(), "job-1")
