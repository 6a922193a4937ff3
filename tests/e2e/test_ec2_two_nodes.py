"""Rehearse a two-node EC2 job on this machine: the user data that was sent to (mocked) EC2 is read
back and run with bash once per node, and the tiny job trains across both nodes on CPU.

Stand-ins: a moto server for S3, EC2 and CloudWatch Logs; one fake IMDSv2 server per node
(tests/imds.py) giving each its instance id, launch index, reservation id and role credentials,
exactly as an instance's metadata service does (the node processes hold no keys). The rehearsal
switches (docs/ec2.md) point the user data at this venv's python, a work folder per node, and a
power-off that records itself and terminates the instance in moto. Everything else (bundle fetch
and sha256 check, node agent, rendezvous, checkpoint union in S3, node launcher, gloo DDP across
the two nodes, logs, records) runs as it would on EC2.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not a package
from imds import FakeImds  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
BUCKET = "distrain-e2e-bucket"
PREFIX = "distrain"
LOG_GROUP = "/distrain-cloud/e2e"
NODE_TIMEOUT_S = 300
# Long enough for a spot notice to land mid-run; a checkpoint every 3 steps and at the stop.
FLAGS = ["--max-steps", "24", "--save-every", "3", "--log-every", "1", "--report-to", "none"]
# Variables of this process that would change what a node does.
_STRIPPED_PREFIXES = ("AWS_", "DISTRAIN_", "SM_", "WANDB_", "ACCELERATE_", "DS_", "TORCHELASTIC_", "SKYPILOT_")
_STRIPPED = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}


@pytest.fixture(scope="module")
def moto_url():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws(service: str, url: str):
    import boto3

    return boto3.client(
        service,
        region_name=REGION,
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@dataclass
class NodeRun:
    rank: int
    instance_id: str
    returncode: int
    output: str
    work: Path


class Rehearsal:
    """Launches jobs into moto and runs each instance's user data as a local 'node'."""

    def __init__(self, url: str, root: Path) -> None:
        self.url, self.root = url, root
        self.s3, self.ec2, self.logs = aws("s3", url), aws("ec2", url), aws("logs", url)
        self.s3.create_bucket(Bucket=BUCKET)
        self.logs.create_log_group(logGroupName=LOG_GROUP)  # the infra stack's, in real life
        self.caches = root / "caches"

    # -- what the launcher does (until `distrain-cloud submit` renders EC2 jobs)

    def launch(self, job: str, lineage: str, attempt: int, flags: list[str]) -> list[dict]:
        from distrain_cloud.launcher.bundle import build_bundle, bundle_key

        bundle = build_bundle(REPO)
        code_key = bundle_key(PREFIX, bundle.sha256)
        self.s3.put_object(Bucket=BUCKET, Key=code_key, Body=bundle.data)
        job_prefix = f"{PREFIX}/jobs/{job}"
        description = {
            "job": job,
            "lineage": lineage,
            "attempt": attempt,
            "nodes": 2,
            "processes_per_node": 1,
            "train_argv": flags,
            "secrets": {},
            "region": REGION,
            "bucket": BUCKET,
            "prefix": PREFIX,
            "code_sha256": bundle.sha256,
            "deadline": time.time() + 3600,
            "log_group": LOG_GROUP,
            "stack_tag": {"Key": "distrain-cloud:stack", "Value": "e2e"},
            "rendezvous_timeout_s": 120,
            "checkpoint_uri": f"s3://{BUCKET}/{PREFIX}/checkpoints/{lineage}/",
            "model_uri": f"s3://{BUCKET}/{job_prefix}/model/",
            "output_uri": f"s3://{BUCKET}/{job_prefix}/output/",
            "main_port": _free_port(),
        }
        self.s3.put_object(Bucket=BUCKET, Key=f"{job_prefix}/job.json", Body=json.dumps(description).encode())
        user_data = _user_data(f"s3://{BUCKET}/{job_prefix}/job.json", code_key, bundle.sha256)
        ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        reservation = self.ec2.run_instances(
            ImageId=ami,
            MinCount=2,
            MaxCount=2,
            InstanceType="g4dn.12xlarge",
            UserData=user_data,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "distrain-cloud:job", "Value": job}]}],
        )
        return sorted(reservation["Instances"], key=lambda i: i["AmiLaunchIndex"])

    # -- what EC2 does

    def run_nodes(
        self,
        instances: list[dict],
        *,
        env: dict[int, dict[str, str]] | None = None,
        when_line: tuple[int, str, Callable[[list[FakeImds]], None]] | None = None,
    ) -> list[NodeRun]:
        """Run every instance's user data with bash, at once; `when_line` = (rank, text, fn): call
        fn(the nodes' metadata servers) when that node first prints a line containing text."""
        fakes, procs, outputs = [], [], []
        try:
            for inst in instances:
                rank = inst["AmiLaunchIndex"]
                fake = FakeImds(
                    instance_id=inst["InstanceId"],
                    launch_index=rank,
                    reservation_id=self._reservation(inst["InstanceId"]),
                    local_ipv4="127.0.0.1",
                    region=REGION,
                ).start()
                fakes.append(fake)
                user_data = self.user_data(inst["InstanceId"])
                work = self.root / f"{inst['InstanceId']}"
                node_env = self.node_env(fake.endpoint, work, inst["InstanceId"], (env or {}).get(rank, {}))
                procs.append(
                    subprocess.Popen(
                        ["bash", "-c", user_data],
                        env=node_env,
                        cwd=self.root,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        start_new_session=True,
                    )
                )
            readers = []
            for rank, proc in enumerate(procs):
                lines: list[str] = []
                outputs.append(lines)
                watch = when_line if when_line and when_line[0] == rank else None
                readers.append(threading.Thread(target=_collect, args=(proc, lines, watch, fakes), daemon=True))
                readers[-1].start()
            deadline = time.monotonic() + NODE_TIMEOUT_S
            for proc in procs:
                proc.wait(timeout=max(1, deadline - time.monotonic()))
            for t in readers:
                t.join(10)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
            for fake in fakes:
                fake.stop()
        return [
            NodeRun(
                inst["AmiLaunchIndex"],
                inst["InstanceId"],
                proc.returncode,
                "".join(out),
                self.root / inst["InstanceId"],
            )
            for inst, proc, out in zip(instances, procs, outputs, strict=True)
        ]

    def user_data(self, instance_id: str) -> str:
        import base64

        attr = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return base64.b64decode(attr["UserData"]["Value"]).decode()

    def _reservation(self, instance_id: str) -> str:
        return self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["ReservationId"]

    def node_env(self, imds: str, work: Path, instance_id: str, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED_PREFIXES) and k not in _STRIPPED}
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        (home / "empty").write_text("")
        terminate = (
            "import boto3; boto3.client('ec2', region_name='us-east-1')"
            f".terminate_instances(InstanceIds=['{instance_id}'])"
        )
        env.update(
            {
                # Credentials come from the fake IMDS only, as on an instance.
                "AWS_ENDPOINT_URL": self.url,
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds,
                "AWS_CONFIG_FILE": str(home / "empty"),
                "AWS_SHARED_CREDENTIALS_FILE": str(home / "empty"),
                "HOME": str(home),
                # The rehearsal switches.
                "DISTRAIN_EC2_HARD_STOP": "true",
                "DISTRAIN_EC2_PYTHON": sys.executable,
                "DISTRAIN_EC2_WORK": str(work),
                "DISTRAIN_EC2_POWEROFF": (
                    f'touch {shlex.quote(str(work))}/powered-off; {shlex.quote(sys.executable)} -c "{terminate}"'
                ),
                "DISTRAIN_EC2_POLL_S": "0.5",
                "DISTRAIN_EC2_HEARTBEAT_S": "2",
                # Training on two cores: one thread per process, no downloads.
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "HF_HOME": str(self.caches / "hf"),
                "PYTHONUNBUFFERED": "1",
                **extra,
            }
        )
        return env

    # -- what the user sees

    def record(self, job: str, rank: int) -> dict:
        key = f"{PREFIX}/jobs/{job}/nodes/{rank}.json"
        return json.loads(self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def keys(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def losses(self, job: str) -> dict[int, float]:
        """step -> train_loss from the job's metrics.jsonl in S3 (rank 0 uploads it)."""
        body = self.s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/{job}/output/metrics.jsonl")["Body"].read()
        records = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}

    def states(self, instances: list[dict]) -> list[str]:
        ids = [i["InstanceId"] for i in instances]
        described = self.ec2.describe_instances(InstanceIds=ids)["Reservations"]
        return sorted(i["State"]["Name"] for r in described for i in r["Instances"])


def _collect(proc: subprocess.Popen, lines: list[str], watch, fakes: list[FakeImds]) -> None:
    assert proc.stdout is not None
    fired = False
    for line in iter(proc.stdout.readline, ""):
        lines.append(line)
        if watch and not fired and watch[1] in line:
            fired = True
            watch[2](fakes)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user_data(job_uri: str, code_key: str, sha256: str) -> str:
    """A stand-in for the launcher's user data, following the contract (docs/ec2.md)."""
    return f"""#!/bin/bash
${{DISTRAIN_EC2_HARD_STOP:-shutdown -h}} +70 || true
set -euo pipefail
export AWS_DEFAULT_REGION={REGION} AWS_REGION={REGION}
PY="${{DISTRAIN_EC2_PYTHON:-/opt/pytorch/bin/python}}"
export WORK="${{DISTRAIN_EC2_WORK:-/opt/distrain}}"
POWEROFF="${{DISTRAIN_EC2_POWEROFF:-shutdown -h now}}"
mkdir -p "$WORK/code"
"$PY" - <<'DISTRAIN_FETCH' || {{ $POWEROFF; exit 1; }}
import boto3, hashlib, io, os, sys, tarfile
data = boto3.client("s3").get_object(Bucket={BUCKET!r}, Key={code_key!r})["Body"].read()
if hashlib.sha256(data).hexdigest() != {sha256!r}:
    sys.exit("bundle hash mismatch")
tarfile.open(fileobj=io.BytesIO(data)).extractall(os.path.join(os.environ["WORK"], "code"))
DISTRAIN_FETCH
export PYTHONPATH="$WORK/code"
exec "$PY" -m distrain_cloud.training.node_agent --job {job_uri}
"""


@pytest.fixture(scope="module")
def rehearsal(moto_url, tmp_path_factory) -> Rehearsal:
    return Rehearsal(moto_url, tmp_path_factory.mktemp("ec2"))


@pytest.fixture(scope="module")
def completed(rehearsal):
    """An uninterrupted two-node job: the baseline of the interruption test too."""
    instances = rehearsal.launch("e2e-full-a1", "e2e-full", 1, FLAGS)
    nodes = rehearsal.run_nodes(instances)
    return instances, nodes


def describe(nodes: list[NodeRun]) -> str:
    return "\n".join(f"--- node {n.rank} exit {n.returncode}\n{n.output[-4000:]}" for n in nodes)


def test_two_nodes_train_from_the_user_data_and_leave_everything_in_s3(rehearsal, completed):
    instances, nodes = completed
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    job = "e2e-full-a1"
    for rank in (0, 1):
        record = rehearsal.record(job, rank)
        assert (record["status"], record["exit_code"]) == ("Completed", 0), record
    # The code that ran is the bundle's copy, unpacked by the user data on each node.
    for n in nodes:
        assert f"code={n.work / 'code' / 'distrain_cloud' / 'training'}" in n.output, describe(nodes)
    # Both nodes trained together: one world of 2 processes, rank 1 reaching the main node's port.
    assert "node_launch node_rank=1 nodes=2 processes=2" in nodes[1].output
    assert sorted(rehearsal.losses(job)) == list(range(1, 25))
    # The model, and complete checkpoints holding every node's files.
    assert f"{PREFIX}/jobs/{job}/model/model.safetensors" in rehearsal.keys(f"{PREFIX}/jobs/{job}/model/")
    ckpt = rehearsal.keys(f"{PREFIX}/checkpoints/e2e-full/")
    complete = sorted({k.split("/")[3] for k in ckpt if k.endswith("/COMPLETE")})
    assert complete == ["checkpoint-00000021", "checkpoint-00000024"]  # --keep-checkpoints 2
    for name in complete:
        files = {k.rsplit("/", 1)[1] for k in ckpt if f"/{name}/" in k}
        assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"} <= files
    # One CloudWatch stream per node, with the training output in it.
    for rank in (0, 1):
        events = rehearsal.logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=f"{job}/node-{rank}")
        messages = [e["message"] for e in events["events"]]
        assert any("final status Completed" in m for m in messages), messages[-5:]
    assert any(m.startswith("step=24 ") for m in messages_of(rehearsal, job, 0))
    # Every instance powered itself off and is terminated.
    assert all((n.work / "powered-off").is_file() for n in nodes)
    assert rehearsal.states(instances) == ["terminated", "terminated"]


def messages_of(rehearsal: Rehearsal, job: str, rank: int) -> list[str]:
    pages = rehearsal.logs.get_paginator("filter_log_events").paginate(
        logGroupName=LOG_GROUP, logStreamNames=[f"{job}/node-{rank}"]
    )
    return [e["message"] for page in pages for e in page["events"]]


def test_a_spot_notice_on_one_node_checkpoints_both_and_resume_matches_the_uninterrupted_run(rehearsal, completed):
    baseline = rehearsal.losses("e2e-full-a1")
    first = rehearsal.launch("e2e-spot-a1", "e2e-spot", 1, FLAGS)
    # The notice comes to node 1 once node 0 has trained a few steps.
    nodes = rehearsal.run_nodes(first, when_line=(0, "step=4 ", lambda fakes: fakes[1].set_spot_notice()))
    for rank in (0, 1):
        record = rehearsal.record("e2e-spot-a1", rank)
        assert (record["status"], record["exit_code"]) == ("Interrupted", 143), describe(nodes)
        assert record["reason"].startswith("spot interruption notice on node 1")
    assert rehearsal.states(first) == ["terminated", "terminated"]
    interrupted = rehearsal.losses("e2e-spot-a1")
    stopped_at = max(interrupted)
    assert 4 <= stopped_at < 24
    assert f"{PREFIX}/checkpoints/e2e-spot/checkpoint-{stopped_at:08d}/COMPLETE" in rehearsal.keys(
        f"{PREFIX}/checkpoints/e2e-spot/"
    )

    # A new attempt of the same lineage, on new instances: both nodes restore, training goes on.
    second = rehearsal.launch("e2e-spot-a2", "e2e-spot", 2, FLAGS)
    nodes = rehearsal.run_nodes(second)
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    for n in nodes:
        assert f"restored checkpoint-{stopped_at:08d}" in n.output
    resumed = rehearsal.losses("e2e-spot-a2")
    assert min(resumed) == stopped_at + 1
    assert {**interrupted, **resumed} == baseline  # exact, step by step
