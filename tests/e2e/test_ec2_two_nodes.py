"""Rehearse a two-node EC2 job on this machine: the user data that was sent to (mocked) EC2 is read
back and run with bash once per node, and the tiny job trains across both nodes on CPU.

The job goes through the real CLI (`infra up`, `submit`, `status`), each a process of
its own. Stand-ins: a moto server for S3, EC2 and CloudWatch Logs; one fake IMDSv2 server per node
(tests/imds.py) giving each its instance id, launch index, reservation id and the credentials of
its job's own role (the instance profile's, assumed through STS), exactly as an instance's metadata
service does (the node processes hold no keys). The rehearsal
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
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not a package
from imds import FakeImds  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiprocess,
    pytest.mark.filterwarnings("ignore:Tried to parse AWS:UserWarning"),  # infra up
]

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
PREFIX = "distrain-cloud"  # the spec's default ec2.prefix
AMI = "ami-dca37ea5"  # a Deep Learning AMI in moto's image list (moto cannot serve the DLAMI SSM parameters)
NODE_TIMEOUT_S = 300
# Long enough for a spot notice to land mid-run; a checkpoint every 3 steps and at the stop.
FLAGS = ["--max-steps", "24", "--save-every", "3", "--log-every", "1", "--report-to", "none"]
# A CPU instance type: the launcher renders one process per node, --precision no and gloo, which is
# what this machine can run (a GPU type such as g4dn.12xlarge renders 4 fp16 processes per node; its
# plans are tested in tests/launcher/backends/ec2/test_ec2_plan.py).
JOB_YAML = f"instance: c5.2xlarge\nnodes: 2\nmax_run: 30m\nregion: {REGION}\nec2:\n  ami_id: {AMI}\n"
SUBMIT = ["submit", "job.yaml", "--yes"]
# Variables of this process that would change what a node does.
_STRIPPED_PREFIXES = ("AWS_", "DISTRAIN_", "SM_", "WANDB_", "ACCELERATE_", "DS_", "TORCHELASTIC_", "SKYPILOT_")
_STRIPPED = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}


@pytest.fixture(scope="module")
def moto_url():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto's servers in one process share its state: start from none of the earlier tests' buckets
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).read()
    yield url
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
        self.caches = root / "caches"
        self.stack_up = False
        (root / "job.yaml").write_text(JOB_YAML)

    # -- what the user does: the real CLI, in its own process, against the moto server

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        home = self.root / "cli-home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DISTRAIN_"))}
        env.update(
            HOME=str(home),
            DISTRAIN_HOME=str(home / "distrain"),
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION=REGION,
            AWS_ENDPOINT_URL=self.url,
            AWS_EC2_METADATA_DISABLED="true",
        )
        return subprocess.run(
            [sys.executable, "-m", "distrain_cloud.launcher.cli", *args],
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def submit(self, *args: str) -> tuple[str, list[dict]]:
        """`distrain-cloud ARGS` (submit or resume) -> the new job's name and its instances."""
        if not self.stack_up:
            up = self.cli("infra", "up", "--yes")
            assert up.returncode == 0, up.stderr
            self.stack_up = True
        r = self.cli(*args)
        assert r.returncode == 0, r.stderr
        job = next(line.split()[1].rstrip(":") for line in r.stderr.splitlines() if line.startswith("submitted "))
        return job, self.instances(job)

    def instances(self, job: str) -> list[dict]:
        found = self.ec2.describe_instances(Filters=[{"Name": "tag:distrain-cloud:job", "Values": [job]}])
        return sorted((i for r in found["Reservations"] for i in r["Instances"]), key=lambda i: i["AmiLaunchIndex"])

    def status(self, job: str) -> dict:
        r = self.cli("status", job, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

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
            role, credentials = self.role_credentials(instances)
            for inst in instances:
                rank = inst["AmiLaunchIndex"]
                fake = FakeImds(
                    instance_id=inst["InstanceId"],
                    launch_index=rank,
                    reservation_id=self._reservation(inst["InstanceId"]),
                    local_ipv4="127.0.0.1",
                    region=REGION,
                    role=role,
                    credentials=credentials,
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

    def run_group(
        self, job: str, *, on_line: tuple[str, Callable[[dict[str, FakeImds], str], None]], env: dict[str, str]
    ) -> list[NodeRun]:
        """Play EC2's part for a lineage kept by an Auto Scaling group: boot every instance the group
        has (moto's group launches a replacement when one of its instances is terminated, as AWS's
        does), each with its own metadata server, until every node has ended and the group has
        nothing new. `on_line` = (text, fn): fn(metadata servers by instance id, the id of the node
        that printed it) the first time any node prints a line containing text. `env`: every node's."""
        role, credentials = self.role_credentials_of(job)
        fakes: dict[str, FakeImds] = {}
        procs: dict[str, subprocess.Popen] = {}
        outputs: dict[str, list[str]] = {}
        fired = threading.Event()

        def watch(instance_id: str, proc: subprocess.Popen) -> None:
            assert proc.stdout is not None
            for line in iter(proc.stdout.readline, ""):
                outputs[instance_id].append(line)
                if on_line[0] in line and not fired.is_set():
                    fired.set()
                    on_line[1](fakes, instance_id)

        deadline = time.monotonic() + 2 * NODE_TIMEOUT_S
        try:
            quiet = 0
            while quiet < 3:
                booted = False
                for inst in self.instances(job):
                    iid = inst["InstanceId"]
                    if inst["State"]["Name"] not in ("pending", "running") or iid in procs:
                        continue
                    fakes[iid] = FakeImds(
                        instance_id=iid,
                        launch_index=inst["AmiLaunchIndex"],
                        reservation_id=self._reservation(iid),
                        region=REGION,
                        role=role,
                        credentials=credentials,
                    ).start()
                    work = self.root / iid
                    outputs[iid] = []
                    procs[iid] = subprocess.Popen(
                        ["bash", "-c", self.user_data(iid)],
                        env=self.node_env(fakes[iid].endpoint, work, iid, env),
                        cwd=self.root,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        start_new_session=True,
                    )
                    threading.Thread(target=watch, args=(iid, procs[iid]), daemon=True).start()
                    booted = True
                ended = all(p.poll() is not None for p in procs.values())
                quiet = quiet + 1 if ended and not booted else 0
                assert time.monotonic() < deadline, "the lineage did not end in time"
                time.sleep(0.5)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                proc.wait()
            for fake in fakes.values():
                fake.stop()
        time.sleep(0.5)  # the readers' last lines
        return [NodeRun(-1, iid, p.returncode, "".join(outputs[iid]), self.root / iid) for iid, p in procs.items()]

    def role_credentials_of(self, job: str) -> tuple[str, dict]:
        """The job's own role (its instance profile is named after the job) and session credentials."""
        iam = aws("iam", self.url)
        (role,) = iam.get_instance_profile(InstanceProfileName=job)["InstanceProfile"]["Roles"]
        creds = aws("sts", self.url).assume_role(RoleArn=role["Arn"], RoleSessionName="node")["Credentials"]
        return role["RoleName"], creds

    def user_data(self, instance_id: str) -> str:
        import base64

        attr = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return base64.b64decode(attr["UserData"]["Value"]).decode()

    def role_credentials(self, instances: list[dict]) -> tuple[str, dict]:
        """(role name, session credentials) of the instance profile the job's instances were launched
        with: what EC2's metadata service hands each node (the job's own role). moto shows the
        profile on the first instance of a reservation only; the request named it for all."""
        (profile,) = {i["IamInstanceProfile"]["Arn"].rsplit("/", 1)[1] for i in instances if "IamInstanceProfile" in i}
        (role,) = aws("iam", self.url).get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
        creds = aws("sts", self.url).assume_role(RoleArn=role["Arn"], RoleSessionName="node")["Credentials"]
        return role["RoleName"], creds

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
                "DISTRAIN_EC2_PER_BOOT": str(work / "per-boot"),
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

    @property
    def bucket(self) -> str:
        """The stack's bucket (the only one in this moto server)."""
        return self.s3.list_buckets()["Buckets"][0]["Name"]

    def description(self, job: str) -> dict:
        """The job.json the launcher wrote for `job`."""
        key = f"{PREFIX}/jobs/{job}/job.json"
        return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def record(self, job: str, rank: int) -> dict:
        key = f"{PREFIX}/jobs/{job}/nodes/{rank}.json"
        return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def keys(self, uri: str) -> list[str]:
        """Every key under s3 `uri`, relative to it."""
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", []))

    def losses(self, job: str) -> dict[int, float]:
        """step -> train_loss from the job's metrics.jsonl in S3 (rank 0 uploads it)."""
        key = f"{PREFIX}/jobs/{job}/output/metrics.jsonl"
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        records = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}

    def log_lines(self, job: str, rank: int) -> list[str]:
        group = self.description(job)["log_group"]
        pages = self.logs.get_paginator("filter_log_events").paginate(
            logGroupName=group, logStreamNames=[f"{job}/node-{rank}"]
        )
        return [e["message"] for page in pages for e in page["events"]]

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


@pytest.fixture(scope="module")
def rehearsal(moto_url, tmp_path_factory) -> Rehearsal:
    return Rehearsal(moto_url, tmp_path_factory.mktemp("ec2"))


@pytest.fixture(scope="module")
def completed(rehearsal):
    """An uninterrupted two-node job: the baseline of the interruption test too."""
    job, instances = rehearsal.submit(*SUBMIT, "--", *FLAGS)
    return job, instances, rehearsal.run_nodes(instances)


def describe(nodes: list[NodeRun]) -> str:
    return "\n".join(f"--- node {n.rank} exit {n.returncode}\n{n.output[-4000:]}" for n in nodes)


def test_two_nodes_train_from_the_user_data_and_leave_everything_in_s3(rehearsal, completed):
    job, instances, nodes = completed
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    profiles = {i["IamInstanceProfile"]["Arn"] for i in instances if "IamInstanceProfile" in i}
    assert profiles == {f"arn:aws:iam::123456789012:instance-profile/distrain-cloud/distrain-cloud/{job}"}
    status = rehearsal.status(job)
    assert status["status"] == "Completed", (status, describe(nodes))
    # The nodes worked with their job's own role; `status` saw the job end and deleted it.
    assert job not in [r["RoleName"] for r in aws("iam", rehearsal.url).list_roles()["Roles"]]
    description = rehearsal.description(job)
    assert description["processes_per_node"] == 1
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
    assert "model.safetensors" in rehearsal.keys(description["model_uri"])
    ckpt = rehearsal.keys(description["checkpoint_uri"])
    complete = sorted(k.split("/")[0] for k in ckpt if k.endswith("/COMPLETE"))
    assert complete == ["checkpoint-00000021", "checkpoint-00000024"]  # --keep-checkpoints 2
    for name in complete:
        files = {k.split("/", 1)[1] for k in ckpt if k.startswith(name + "/")}
        assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"} <= files
    # One CloudWatch stream per node, with the training output in it.
    for rank in (0, 1):
        lines = rehearsal.log_lines(job, rank)
        assert any("final status Completed" in m for m in lines), lines[-5:]
    assert any(m.startswith("step=24 ") for m in rehearsal.log_lines(job, 0))
    # Every instance powered itself off and is terminated.
    assert all((n.work / "powered-off").is_file() for n in nodes)
    assert rehearsal.states(instances) == ["terminated", "terminated"]


def test_a_spot_lineage_recovers_on_aws_side_with_no_client_and_matches_the_uninterrupted_run(rehearsal, completed):
    """`submit --spot` without --wait: the CLI process has ended before any node boots. A spot
    notice on one node mid-run; the Auto Scaling group (moto's plays AWS's: it replaces a terminated
    instance) launches a replacement, the survivor and the replacement meet as attempt 2, restore
    the last complete checkpoint and train to the end, all without the client."""
    baseline = rehearsal.losses(completed[0])
    job, first = rehearsal.submit(*SUBMIT, "--spot", "--max-restarts", "2", "--", *FLAGS)
    assert len(first) == 2  # moto's group launched them at once (AWS's does so asynchronously)
    noticed: list[str] = []

    def notice_the_other(fakes: dict[str, FakeImds], printer: str) -> None:
        other = next(i for i in fakes if i != printer)  # the printer is training rank 0
        noticed.append(other)
        fakes[other].set_spot_notice()

    # The agents look at the notice every 0.5 s, and the 20 steps after step 4 take 0.5 s on an idle
    # machine: CI once saw the run end before any agent looked. At 0.1 s more a step they take 2 s
    # or more, four looks (the sleep changes no number, and the baseline has none).
    slow = {"DISTRAIN_TEST_STEP_SLEEP_S": "0.1"}
    nodes = rehearsal.run_group(job, on_line=("step=4 ", notice_the_other), env=slow)
    assert len(nodes) == 3 and all(n.returncode == 0 for n in nodes), describe(nodes)
    status = rehearsal.status(job)
    assert (status["status"], status["attempt"]) == ("Completed", 2), (status, describe(nodes))
    first_attempt, second = status["attempts"]
    assert first_attempt["status"] == "Interrupted" and "spot interruption notice" in first_attempt["why"], status[
        "attempts"
    ]
    assert noticed[0] in first_attempt["where"] and noticed[0] not in second["where"], status
    assert second["status"] == "Completed" and "spot" in second["where"], status
    assert status["cost_so_far"].startswith("at most $"), status
    # Every step once, each loss equal to the uninterrupted run's: attempt 2 resumed where 1 saved.
    root = f"{PREFIX}/jobs/{job}/attempts"
    losses = {}
    keys = rehearsal.keys(f"s3://{rehearsal.bucket}/{root}/")
    for k in (1, 2):
        assert f"{k}/output/metrics.jsonl" in keys, (keys, describe(nodes))
        body = rehearsal.s3.get_object(Bucket=rehearsal.bucket, Key=f"{root}/{k}/output/metrics.jsonl")["Body"]
        rows = [json.loads(line) for line in body.read().decode().splitlines() if line.strip()]
        steps = {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}
        assert not set(steps) & set(losses), (sorted(steps), sorted(losses))
        losses |= steps
    assert losses == baseline
    # The lineage's end: every node left the group, which `status` then deleted; nothing runs.
    groups = aws("autoscaling", rehearsal.url).describe_auto_scaling_groups(AutoScalingGroupNames=[job])
    assert groups["AutoScalingGroups"] == []
    assert set(rehearsal.states(rehearsal.instances(job))) == {"terminated"}


def test_a_node_whose_training_dies_fails_the_job_and_the_other_node_stops(rehearsal):
    job, instances = rehearsal.submit(*SUBMIT, "--", *FLAGS)
    # Node 1's training process is killed (kill -9) after step 5; node 0's loses its peer.
    nodes = rehearsal.run_nodes(instances, env={1: {"DISTRAIN_TEST_KILL_AT_STEP": "5"}})
    failed, stopped = rehearsal.record(job, 1), rehearsal.record(job, 0)
    assert failed["status"] == "Failed", describe(nodes)
    assert failed["reason"].startswith("a training process was killed by SIGKILL: likely the out-of-memory"), failed
    assert failed["reason"].endswith(f"`distrain-cloud resume {job}`") and failed["exit_code"] == 137, failed
    assert (stopped["status"], stopped["reason"]) == ("Stopped", f"node 1 failed: {failed['reason']}"), describe(nodes)
    status = rehearsal.status(job)
    assert status["status"] == "Failed", status
    assert rehearsal.states(instances) == ["terminated", "terminated"]


def test_a_swapped_bundle_fails_every_node_before_anything_runs(rehearsal):
    job, instances = rehearsal.submit(*SUBMIT, "--", *FLAGS)
    description = rehearsal.description(job)
    key = f"{PREFIX}/code/{description['code_sha256']}.tar.gz"
    rehearsal.s3.put_object(Bucket=rehearsal.bucket, Key=key, Body=b"not the planned bundle")
    nodes = rehearsal.run_nodes(instances)
    for rank in (0, 1):
        record = rehearsal.record(job, rank)
        assert record["status"] == "Failed" and record["reason"].startswith("bundle hash mismatch"), describe(nodes)
        assert "node_agent" not in nodes[rank].output  # nothing from the bundle ran
    assert rehearsal.status(job)["status"] == "Failed"
    assert rehearsal.states(instances) == ["terminated", "terminated"]
