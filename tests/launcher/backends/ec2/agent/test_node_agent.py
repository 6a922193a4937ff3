"""The EC2 node agent (launcher/backends/ec2/agent/) against moto in-process and fake metadata servers.

Agents run on threads here with a stand-in for the node launcher (a small script that prints
steps, writes checkpoint files like the trainer and exits 143 on SIGTERM), so rendezvous, stops,
checkpoint sync and records are tested in seconds; tests/e2e/test_ec2_two_nodes.py runs the real
launcher and trainer across two simulated instances.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # tests/ is not a package
from imds import FakeImds  # noqa: E402

from distrain_cloud.launcher.backends.ec2.agent import node as node_agent  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.checkpoints import (  # noqa: E402
    CheckpointSync,
    restore_checkpoint,
    restore_compile_cache,
)
from distrain_cloud.launcher.backends.ec2.agent.imds import Imds  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.job import (  # noqa: E402
    MAX_MESSAGE_BYTES,
    Job,
    NodeFailure,
    NodeIdentity,
    Settings,
)
from distrain_cloud.launcher.backends.ec2.agent.logs import LogSink, log_batches, log_event  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.node import Agent, Stop, outcome, unexplained_failure  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.rendezvous import rendezvous  # noqa: E402
from distrain_cloud.launcher.backends.ec2.agent.store import Store  # noqa: E402
from distrain_cloud.launcher.backends.ec2.user_data import NODE_AGENT  # noqa: E402

REGION = "us-east-1"
BUCKET = "distrain-test-bucket"
CKPT = "distrain/checkpoints/lin/"
LOG_GROUP = "/distrain/test"


def make_job(**overrides) -> Job:
    base = dict(
        job="job-a1",
        lineage="lin",
        attempt=1,
        nodes=2,
        processes_per_node=1,
        train_argv=["--max-steps", "10"],
        region=REGION,
        bucket=BUCKET,
        prefix="distrain",
        code_sha256="0" * 64,
        deadline=time.time() + 3600,
        log_group=LOG_GROUP,
        checkpoint_uri=f"s3://{BUCKET}/{CKPT}",
        model_uri=f"s3://{BUCKET}/distrain/jobs/job-a1/model/",
        output_uri=f"s3://{BUCKET}/distrain/jobs/job-a1/output/",
        rendezvous_timeout_s=20,
    )
    return Job.from_dict({**base, **overrides})


def node(index: int) -> NodeIdentity:
    return NodeIdentity(f"i-{index:017x}", index, "r-0123456789abcdef0", f"10.0.0.{10 + index}")


@pytest.fixture
def s3(mocked_aws):
    import boto3

    client = boto3.client("s3", region_name=REGION)
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def store(s3) -> Store:
    return Store(BUCKET, REGION, s3)


def keys(s3, prefix: str = "") -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


# ----------------------------------------------------------------------------- job.json and IMDS


def test_job_description_names_what_it_lacks():
    with pytest.raises(NodeFailure, match="job.json lacks nodes, checkpoint_uri"):
        Job.from_dict({k: v for k, v in make_job().__dict__.items() if k not in ("nodes", "checkpoint_uri")})
    # Keys a newer launcher adds are ignored, not fatal.
    assert Job.from_dict({**make_job().__dict__, "something_new": 1}).nodes == 2
    assert make_job().key("nodes", "1.json") == "distrain/jobs/job-a1/nodes/1.json"
    assert make_job(prefix="").key("stop") == "jobs/job-a1/stop"


@pytest.mark.parametrize(
    "key, value",
    [("nodes", "2"), ("nodes", 0), ("train_argv", "--max-steps 10"), ("secrets", {"HF_TOKEN": 1}), ("job", None),
     ("deadline", True), ("env", ["A=1"])],
)  # fmt: skip
def test_a_job_description_of_the_wrong_shape_is_one_line_naming_the_key(key, value):
    with pytest.raises(NodeFailure, match=f"^job.json's {key} is not "):
        Job.from_dict({**make_job().__dict__, key: value})
    with pytest.raises(NodeFailure, match="^job.json is not a JSON object"):
        Job.from_dict([make_job().__dict__])  # type: ignore[arg-type]


def test_the_trainer_gets_the_job_descriptions_variables_under_the_contracts(tmp_path):
    env = {"DISTRAIN_LINEAGE": "lin", "DISTRAIN_INSTANCE_TYPE": "g5.xlarge", "DISTRAIN_WANDB_RUN_ID": "lin"}
    # A description may not move the contract's folders: those are the agent's to say.
    job = make_job(env={**env, "DISTRAIN_MODEL_DIR": "/elsewhere"})
    agent = Agent(job, node(0), Settings(work=tmp_path), store=None, imds=None, sink=None)  # type: ignore[arg-type]
    launched = agent.launch_env()
    assert {k: launched[k] for k in env} == env
    assert launched["DISTRAIN_MODEL_DIR"] == str(tmp_path / "model")
    assert make_job().env == {}  # a description from before the key: nothing added


def test_imds_v2_identity_and_spot_notice():
    with FakeImds(instance_id="i-0aaa", launch_index=1, reservation_id="r-0bbb", local_ipv4="10.1.2.3") as fake:
        # IMDSv2 only: a request without a token is refused, as on an instance that requires them.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(fake.endpoint + "latest/meta-data/instance-id", timeout=2)
        assert refused.value.code == 401
        imds = Imds(fake.endpoint)
        assert imds.identity() == NodeIdentity("i-0aaa", 1, "r-0bbb", "10.1.2.3", REGION)
        assert imds.spot_notice() is None  # 404 until AWS sets it
        fake.set_spot_notice()
        assert (imds.spot_notice() or {}).get("action") == "terminate"
        assert fake.identity.requests[1] == "PUT /latest/api/token"  # after the refused GET


def test_botocore_takes_role_credentials_from_the_fake_imds(monkeypatch, no_aws_config):
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    with FakeImds() as fake:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.endpoint)
        import boto3

        creds = boto3.session.Session(region_name=REGION).get_credentials()
        assert creds is not None and creds.method == "iam-role"
        assert creds.get_frozen_credentials().access_key.startswith("ASIAFAKE")


# ----------------------------------------------------------------------------- rendezvous


def test_rendezvous_ranks_by_launch_index_whatever_the_arrival_order(store):
    job = make_job(nodes=3)
    results: dict[int, list] = {}

    def join(i: int) -> None:
        results[i] = rendezvous(store, job, node(i), poll_s=0.05)

    # The last node boots first, the main node last.
    threads = []
    for i in (2, 1, 0):
        threads.append(threading.Thread(target=join, args=(i,)))
        threads[-1].start()
        time.sleep(0.2)
    for t in threads:
        t.join(10)
    assert sorted(results) == [0, 1, 2]
    for records in results.values():
        assert [r["launch_index"] for r in records] == [0, 1, 2]
        assert records[0]["ip"] == "10.0.0.10"  # the main node is launch index 0
    # Keyed by the reservation: a relaunch (new reservation id) never reads these.
    assert keys(store.s3, "distrain/jobs/job-a1/rendezvous/")[0].startswith(
        "distrain/jobs/job-a1/rendezvous/r-0123456789abcdef0/"
    )


def test_rendezvous_timeout_names_the_missing_node(store):
    ticks = iter(range(0, 10_000, 5))
    with pytest.raises(NodeFailure) as failed:
        job = make_job(rendezvous_timeout_s=30)
        rendezvous(store, job, node(0), poll_s=5, clock=lambda: next(ticks), sleep=lambda s: None)
    assert str(failed.value).startswith("node 1 of 2 never joined the rendezvous within 30 s")


def test_rendezvous_counts_only_the_expected_indices_with_valid_records(store):
    """Strays in the rendezvous folder (an extra index, a name that is no index, a malformed body, an
    address that is no IP) are ignored and named once; the real nodes still meet."""
    job = make_job(nodes=2)
    folder = job.key("rendezvous", node(0).reservation_id) + "/"
    valid = {"ip": "10.0.0.99", "instance_id": "i-0planted", "launch_index": 5, "time": 1.0}
    strays = {
        "5.json": json.dumps(valid).encode(),  # an index >= nodes
        "abc.json": json.dumps(valid).encode(),  # no index at all
        "-1.json": json.dumps(valid).encode(),
        "01.json": json.dumps({**valid, "launch_index": 1}).encode(),  # index 1 twice
        "notes.txt": b"hello",
        # index 1 before node 1 writes it: no JSON, then an address that would reach a shell
        "1.json": b"\xff not json",
    }
    for name, body in strays.items():
        store.s3.put_object(Bucket=BUCKET, Key=folder + name, Body=body)
    logged: list[str] = []

    def node1_joins() -> None:
        time.sleep(0.3)
        store.put_json(folder + "1.json", {**valid, "ip": "10.0.0.11; reboot", "launch_index": 1})
        time.sleep(0.3)
        store.put_json(folder + "1.json", {"ip": "10.0.0.11", "instance_id": "i-1", "launch_index": 1, "time": 2.0})

    threading.Thread(target=node1_joins, daemon=True).start()
    records = rendezvous(store, job, node(0), poll_s=0.05, log=logged.append)
    assert [(r["launch_index"], r["ip"]) for r in records] == [(0, "10.0.0.10"), (1, "10.0.0.11")]
    for name in ("5.json", "abc.json", "-1.json", "01.json", "notes.txt"):
        assert sum(f"{folder}{name}" in line for line in logged) == 1, (name, logged)
    # The two bad bodies of index 1, once each (it is read again only when it changes).
    assert sum(f"{folder}1.json" in line for line in logged) == 2, logged
    assert len(logged) == 7 and all(line.startswith("ignored ") for line in logged), logged


def test_rendezvous_gives_up_when_told_to_stop(store):
    def stop_check() -> None:
        raise node_agent.StopRequested("cancel", "cancelled")

    with pytest.raises(node_agent.StopRequested):
        rendezvous(store, make_job(), node(0), poll_s=0.01, stop_check=stop_check)


# ----------------------------------------------------------------------------- checkpoints


def write_checkpoint(root: Path, step: int, rank: int, complete: bool = True, content: str = "a") -> Path:
    """What the trainer leaves on one node: rank 0 the model state and the marker, others their RNG."""
    folder = root / f"checkpoint-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"random_states_{rank}.pkl").write_text(f"rng {rank} {content}")
    if rank == 0:
        (folder / "model.safetensors").write_text(f"weights {step} {content}")
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
        (folder / "MANIFEST.json").write_text("{}")
        if complete:
            (folder / "COMPLETE").write_text(str(step))
    return folder


class RecordingStore(Store):
    """A Store that notes every key it writes, in order."""

    def __init__(self, store: Store, written: list[str]) -> None:
        super().__init__(store.bucket, REGION, store.s3)
        self.written = written

    def upload(self, path: Path, key: str) -> None:
        self.written.append(key)
        super().upload(path, key)

    def put_json(self, key: str, value) -> None:
        self.written.append(key)
        super().put_json(key, value)


def syncs(store: Store, tmp_path: Path, written: list[str], job: str = "job-a1", keep: int = 2):
    roots = [tmp_path / f"node{r}" for r in range(2)]
    logged: list[str] = []
    make = [
        CheckpointSync(
            RecordingStore(store, written), CKPT, roots[r], rank=r, nodes=2, job=job, keep=keep, log=logged.append
        )
        for r in range(2)
    ]
    return roots, make


def test_checkpoint_union_reaches_s3_with_complete_uploaded_last(store, tmp_path):
    written: list[str] = []
    roots, (rank0, rank1) = syncs(store, tmp_path, written)
    write_checkpoint(roots[0], 2, 0)
    write_checkpoint(roots[1], 2, 1)
    name = "checkpoint-00000002"

    assert rank1.tick() == [name]  # rank 0's part is not there yet: rank 1 waits
    assert rank0.tick() == [name]  # rank 0 uploaded its part, waits for rank 1's
    assert f"{CKPT}{name}/COMPLETE" not in keys(store.s3)
    assert rank1.tick() == []
    assert rank0.tick() == []
    remote = keys(store.s3, CKPT + name)
    assert [k.rsplit("/", 1)[1] for k in remote] == [
        "COMPLETE", "MANIFEST.json", "model.safetensors", "random_states_0.pkl", "random_states_1.pkl",
        "trainer_state.json", "uploaded-0", "uploaded-1",
    ]  # fmt: skip
    assert written[-1] == f"{CKPT}{name}/COMPLETE"
    assert written.index(f"{CKPT}{name}/uploaded-1") < written.index(f"{CKPT}{name}/COMPLETE")


def test_the_compiler_cache_travels_with_the_checkpoints(store, tmp_path):
    """Rank 0 uploads the cache kept beside the checkpoints once one is complete; a restore brings it back."""
    roots, (rank0, rank1) = syncs(store, tmp_path, [])
    cache = roots[0] / "compile-cache" / "fxgraph" / "ab" / "entry"
    cache.parent.mkdir(parents=True)
    cache.write_bytes(b"kernel")
    write_checkpoint(roots[0], 2, 0)
    write_checkpoint(roots[1], 2, 1)
    for sync in (rank0, rank1, rank0):
        sync.tick()
    assert f"{CKPT}compile-cache/fxgraph/ab/entry" in keys(store.s3)
    fresh = tmp_path / "fresh"
    assert restore_compile_cache(store, CKPT, fresh) == 1
    assert (fresh / "compile-cache" / "fxgraph" / "ab" / "entry").read_bytes() == b"kernel"


def test_restore_takes_the_newest_complete_checkpoint_and_ignores_incomplete_ones(store, tmp_path):
    roots, (rank0, rank1) = syncs(store, tmp_path, [])
    for step in (2, 4):
        write_checkpoint(roots[0], step, 0)
        write_checkpoint(roots[1], step, 1)
    for sync in (rank0, rank1, rank0):
        sync.tick()
    # Step 6: rank 0's part only (rank 1's never came): no COMPLETE in S3.
    write_checkpoint(roots[0], 6, 0)
    rank0.tick()
    assert f"{CKPT}checkpoint-00000006/model.safetensors" in keys(store.s3)

    fresh = tmp_path / "fresh"
    assert restore_checkpoint(store, CKPT, fresh) == "checkpoint-00000004"
    got = sorted(p.name for p in (fresh / "checkpoint-00000004").iterdir())
    # every node's files (the union), not the per-node upload markers
    assert got == [
        "COMPLETE", "MANIFEST.json", "model.safetensors", "random_states_0.pkl", "random_states_1.pkl",
        "trainer_state.json",
    ]  # fmt: skip
    assert [p.name for p in fresh.iterdir()] == ["checkpoint-00000004"]
    assert restore_checkpoint(store, "distrain/checkpoints/other-lineage/", tmp_path / "none") is None


# Keys under a lineage's checkpoints that a job's own code (or anyone with write access there) may
# plant: each maps to a local path outside its folder, or to no file at all.
PLANTED = {
    "dotdot": "../../escaped-dotdot",
    "backslash": "..\\..\\escaped-backslash",
    "nul": "a\x00b",
    "folder marker": "sub/",
    "dot": "./x",
    "through a link": "linked/escaped-link",
}


def test_a_restore_writes_nothing_outside_its_folder_whatever_the_keys(store, tmp_path):
    """A planted key is refused with one line naming it; the checkpoint's own files are restored."""
    roots, (rank0, rank1) = syncs(store, tmp_path, [])
    write_checkpoint(roots[0], 4, 0)
    write_checkpoint(roots[1], 4, 1)
    for sync in (rank0, rank1, rank0):
        sync.tick()
    name = "checkpoint-00000004"
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = {**PLANTED, "absolute": "/" + str(outside / "escaped-absolute")}
    for rel in planted.values():
        store.s3.put_object(Bucket=BUCKET, Key=f"{CKPT}{name}/{rel}", Body=b"planted")
        store.s3.put_object(Bucket=BUCKET, Key=f"{CKPT}compile-cache/{rel}", Body=b"planted")
    store.s3.put_object(Bucket=BUCKET, Key=f"{CKPT}compile-cache/fx/entry", Body=b"kernel")
    # Inside the folder, but a file of the checkpoint cannot also be a folder: skipped, not fatal.
    clash = f"{CKPT}{name}/model.safetensors/x"
    store.s3.put_object(Bucket=BUCKET, Key=clash, Body=b"planted")
    fresh = tmp_path / "deep" / "fresh"
    # A link already inside the folder that points out of it (resolved, not just read as a string).
    for folder in (fresh / name, fresh / "compile-cache"):
        folder.mkdir(parents=True)
        (folder / "linked").symlink_to(outside, target_is_directory=True)
    logged: list[str] = []

    assert restore_checkpoint(store, CKPT, fresh, log=logged.append) == name
    assert restore_compile_cache(store, CKPT, fresh, log=logged.append) == 1
    got = sorted(p.name for p in (fresh / name).iterdir())
    assert got == [
        "COMPLETE", "MANIFEST.json", "linked", "model.safetensors", "random_states_0.pkl", "random_states_1.pkl",
        "trainer_state.json",
    ]  # fmt: skip
    assert (fresh / "compile-cache" / "fx" / "entry").read_bytes() == b"kernel"
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["fresh"]
    assert not any(p.name.startswith("escaped") for p in tmp_path.rglob("*"))
    for rel in planted.values():  # one line for each refused key, naming it
        for key in (f"{CKPT}{name}/{rel}", f"{CKPT}compile-cache/{rel}"):
            named = [line for line in logged if repr(key) in line]
            assert len(named) == 1 and named[0].startswith("refused "), (key, logged)
    assert [line for line in logged if repr(clash) in line][0].startswith(f"could not restore {clash!r} (")
    assert len(logged) == 2 * len(planted) + 1
    assert (fresh / name / "model.safetensors").read_text() == "weights 4 a"


def test_markers_of_an_earlier_attempt_are_not_trusted(store, tmp_path):
    # Attempt 1 got as far as uploading both parts of step 2 but never its COMPLETE.
    roots, (old0, old1) = syncs(store, tmp_path / "a1", [], job="job-a1")
    write_checkpoint(roots[0], 2, 0, complete=True, content="old")
    write_checkpoint(roots[1], 2, 1, content="old")
    old0.tick()
    old1.tick()
    store.s3.delete_object(Bucket=BUCKET, Key=f"{CKPT}checkpoint-00000002/COMPLETE")  # (not there anyway)

    roots, (new0, new1) = syncs(store, tmp_path / "a2", [], job="job-a2")
    write_checkpoint(roots[0], 2, 0, content="new")
    write_checkpoint(roots[1], 2, 1, content="new")
    assert new1.tick() == ["checkpoint-00000002"]  # attempt 1's uploaded-0 does not count
    assert new0.tick() == ["checkpoint-00000002"]  # nor its uploaded-1: the stale files were cleared
    assert "checkpoint-00000002/random_states_1.pkl" not in " ".join(keys(store.s3, CKPT))
    new1.tick()
    new0.tick()
    body = store.s3.get_object(Bucket=BUCKET, Key=f"{CKPT}checkpoint-00000002/random_states_1.pkl")["Body"].read()
    assert body == b"rng 1 new"


def test_old_checkpoints_are_pruned_in_s3_and_on_other_nodes(store, tmp_path):
    roots, (rank0, rank1) = syncs(store, tmp_path, [], keep=2)
    for step in (2, 4, 6, 8):
        write_checkpoint(roots[0], step, 0)
        write_checkpoint(roots[1], step, 1)
        for sync in (rank0, rank1, rank0):
            sync.tick()
    names = {k[len(CKPT) :].split("/")[0] for k in keys(store.s3, CKPT)}
    assert names == {"checkpoint-00000006", "checkpoint-00000008"}
    # Rank 1's trainer never prunes (no marker there): the agent keeps keep+1 folders.
    assert sorted(p.name for p in roots[1].iterdir()) == [f"checkpoint-{s:08d}" for s in (4, 6, 8)]


# ----------------------------------------------------------------------------- logs and outcomes


def test_log_batches_respect_cloudwatch_limits_and_time_order():
    events = [{"timestamp": 1000 - i, "message": "x" * 100} for i in range(25)]
    batches = list(log_batches(events, max_bytes=3 * 126, max_events=10))
    assert [len(b) for b in batches] == [3] * 8 + [1]
    flat = [e["timestamp"] for b in batches for e in b]
    assert flat == sorted(flat)
    assert [len(b) for b in log_batches(events, max_events=10)] == [10, 10, 5]
    assert log_event("")["message"] == " "  # CloudWatch refuses empty messages
    huge = log_event("é" * 300_000)["message"]
    assert len(huge.encode()) <= MAX_MESSAGE_BYTES and huge.endswith("[line truncated]")


@pytest.mark.parametrize(
    "code, stop, failure, status, exit_code, reason",
    [
        (0, None, None, "Completed", 0, ""),
        (0, Stop("spot-interruption", "notice"), None, "Completed", 0, ""),  # finished first
        (143, Stop("spot-interruption", "notice on node 1"), None, "Interrupted", 143, "notice on node 1"),
        # torchrun reports a worker's 143 as 1 when its launcher was not signalled in time
        (1, Stop("deadline", "max-run reached"), None, "Stopped", 143, "max-run reached"),
        (1, Stop("peer-failed", "node 1 failed: x"), "disk full", "Failed", 1, "disk full"),
        # this node's collective lost the failed peer before its agent stopped it (gloo's words)
        (
            -15,
            Stop("peer-failed", "node 1 failed: x"),
            "error: RuntimeError: [pair.cc:537] Read error [127.0.0.1]:9103: Connection reset by peer. ...",
            "Stopped",
            143,
            "node 1 failed: x",
        ),
        (2, None, "unknown model", "Failed", 2, "unknown model"),
        (1, None, None, "Failed", 1, "training exited with code 1: boom"),
    ],
)
def test_outcome_of_a_launcher_exit(code, stop, failure, status, exit_code, reason):
    got = outcome(code, stop, failure, f"training exited with code {code}: boom")
    assert (got.status, got.exit_code, got.reason) == (status, exit_code, reason)


# The end of what node_launch prints when torchrun reports a worker that died (as seen in the rehearsal).
TORCHRUN_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
distrain_cloud.training FAILED
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 23508)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 23508
======================================================
"""


def test_an_unexplained_failure_is_told_by_the_workers_exception_or_signal():
    assert unexplained_failure(1, TORCHRUN_REPORT.splitlines()) == (
        "training exited with code 1: Signal 9 (SIGKILL) received by PID 23508"
    )
    oom = ["Traceback (most recent call last):", '  File "x.py", line 1', "torch.OutOfMemoryError: CUDA out of memory."]
    assert unexplained_failure(1, oom + TORCHRUN_REPORT.replace("Signal 9", "To enable").splitlines()) == (
        "training exited with code 1: torch.OutOfMemoryError: CUDA out of memory."
    )
    assert unexplained_failure(3, ["", "====="]) == "training exited with code 3"


# ----------------------------------------------------------------------------- agents on threads

# Stands in for node_launch: a step every 50 ms. On SIGTERM it stops like the real trainers do, all
# at one step (they agree collectively; here through a file in FAKE_SHARED), writes its part of that
# step's checkpoint and exits 143, or 1 where its own launcher was not signalled (torchrun's report).
# FAKE_FAIL_AT=<step> fails like bad input instead; FAKE_PEER_LOST_AT=<step> dies of a lost peer.
FAKE_TRAINER = r"""
import json, os, signal, sys, time
from pathlib import Path
rank = int(os.environ["DISTRAIN_NODE_RANK"])
agreed = Path(os.environ["FAKE_SHARED"]) / "stop-step"
signalled = []
signal.signal(signal.SIGTERM, lambda *a: signalled.append(1))
def save(step):
    folder = Path(os.environ["DISTRAIN_CHECKPOINT_DIR"]) / f"checkpoint-{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"random_states_{rank}.pkl").write_text(str(step))
    if rank == 0:
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
        (folder / "COMPLETE").write_text(str(step))
root = Path(os.environ["DISTRAIN_CHECKPOINT_DIR"])
start = max([int(p.name.split("-")[1]) for p in root.glob("checkpoint-*")] or [0])
secrets = os.environ["DISTRAIN_SECRETS"]
print(f"main_addr={os.environ['DISTRAIN_MAIN_ADDR']} resumed={start} secrets={secrets}", flush=True)
for step in range(start + 1, int(os.environ.get("FAKE_STEPS", "1000")) + 1):
    time.sleep(0.05)
    print(f"step={step} train_loss=1.0", flush=True)
    if os.environ.get("FAKE_STUCK"):  # deaf to SIGTERM, with a worker in a session of its own (as torchrun's)
        import subprocess
        deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        worker = subprocess.Popen([sys.executable, "-c", deaf], start_new_session=True)
        Path(os.environ["FAKE_STUCK"]).write_text(str(worker.pid))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    if os.environ.get("FAKE_PEER_LOST_AT") == str(step):  # what gloo says when the other node's process died
        print("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1", flush=True)
        sys.exit(1)
    if os.environ.get("FAKE_FAIL_AT") == str(step):
        out = Path(os.environ["DISTRAIN_OUTPUT_DIR"]); out.mkdir(parents=True, exist_ok=True)
        (out / "failure").write_text("error: fake trainer failed on purpose\n")
        sys.exit(2)
    (agreed.parent / f"at.{rank}.tmp").write_text(str(step))  # where this node is, for the agreement below
    os.replace(agreed.parent / f"at.{rank}.tmp", agreed.parent / f"at.{rank}")
    if signalled and not agreed.exists():  # atomically, and the first node's step wins (both may get here)
        # Past every node's step (a loaded machine lets one node run ahead): all stop at the same step.
        ahead = max(int(p.read_text()) for p in agreed.parent.glob("at.[0-9]*") if not p.name.endswith(".tmp"))
        (agreed.parent / f"stop-step.{rank}").write_text(str(ahead + 3))
        try:
            os.link(agreed.parent / f"stop-step.{rank}", agreed)  # fails where the other node's is there
        except FileExistsError:
            pass
    if agreed.exists() and step >= int(agreed.read_text()):
        save(step)
        print(f"stopped=SIGTERM step={step}", flush=True)
        sys.exit(143 if signalled else 1)
if rank == 0:
    model = Path(os.environ["DISTRAIN_MODEL_DIR"]); model.mkdir(parents=True, exist_ok=True)
    (model / "model.safetensors").write_text("weights")
    out = Path(os.environ["DISTRAIN_OUTPUT_DIR"]); out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
"""


class Cluster:
    """N agents of one job, each with its own instance in moto, fake IMDS, work folder and thread."""

    def __init__(self, tmp_path: Path, store: Store, job: Job, steps: int) -> None:
        import boto3

        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.logs = boto3.client("logs", region_name=REGION)
        if not self.logs.describe_log_groups(logGroupNamePrefix=LOG_GROUP)["logGroups"]:
            self.logs.create_log_group(logGroupName=LOG_GROUP)  # the stack's, in real life
        ami = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        reservation = self.ec2.run_instances(ImageId=ami, MinCount=job.nodes, MaxCount=job.nodes)
        self.instances = sorted(reservation["Instances"], key=lambda i: i["AmiLaunchIndex"])
        self.imds = [
            FakeImds(
                instance_id=i["InstanceId"],
                launch_index=i["AmiLaunchIndex"],
                reservation_id=reservation["ReservationId"],
                local_ipv4="127.0.0.1",
            ).start()
            for i in self.instances
        ]
        self.tmp_path, self.store, self.job = tmp_path, store, job
        self.settings = Settings(poll_s=0.1, heartbeat_s=0.2, stop_grace_s=10, final_sync_s=10, log_flush_s=0.2)
        self.results: dict[int, node_agent.Outcome] = {}
        self.sinks: dict[int, LogSink] = {}
        shared = tmp_path / "shared"
        shared.mkdir(parents=True)
        self.env = {i: {"FAKE_STEPS": str(steps), "FAKE_SHARED": str(shared)} for i in range(job.nodes)}

    def agent(self, rank: int) -> Agent:
        import boto3

        settings = dataclasses.replace(self.settings, work=self.tmp_path / f"node{rank}")
        sink = LogSink(settings.work / "node-agent.log")
        sink.to_cloudwatch(self.logs, LOG_GROUP, self.job.stream(rank), settings.log_flush_s)
        self.sinks[rank] = sink
        imds = Imds(self.imds[rank].endpoint)
        command = ["env", *(f"{k}={v}" for k, v in self.env[rank].items()), sys.executable, "-c", FAKE_TRAINER]
        agent = Agent(
            self.job,
            imds.identity(),
            settings,
            store=self.store,
            imds=imds,
            sink=sink,
            ec2=boto3.client("ec2", region_name=REGION),
            command=command,
        )
        return agent

    def run(self, ranks: list[int] | None = None, timeout: float = 60) -> dict[int, node_agent.Outcome]:
        agents = {r: self.agent(r) for r in (ranks if ranks is not None else range(self.job.nodes))}

        def go(rank: int) -> None:
            result = agents[rank].run()
            agents[rank].finish(result)
            self.sinks[rank].close()
            self.results[rank] = result

        threads = [threading.Thread(target=go, args=(r,), daemon=True) for r in agents]
        for t in threads:
            t.start()
        return_by = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.1, return_by - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "an agent did not finish"
        return self.results

    def once_training(self, action: Callable[[], object], timeout: float = 60) -> None:
        """Do `action` once every node's trainer has logged a step, on a thread. A fixed delay raced
        the trainers' start on a loaded machine: a SIGTERM before the fake trainer installs its
        handler kills it with no checkpoint (seen once in CI)."""
        logs = [self.tmp_path / f"node{rank}" / "node-agent.log" for rank in range(self.job.nodes)]

        def stepping(log: Path) -> bool:
            return log.is_file() and " train_loss=" in log.read_text()

        def wait_then_act() -> None:
            give_up = time.monotonic() + timeout
            while not all(stepping(log) for log in logs) and time.monotonic() < give_up:
                time.sleep(0.05)
            action()

        threading.Thread(target=wait_then_act, daemon=True).start()

    def record(self, rank: int) -> dict:
        return self.store.get_json(self.job.key("nodes", f"{rank}.json"))

    def tags(self, rank: int) -> dict[str, str]:
        described = self.ec2.describe_instances(InstanceIds=[self.instances[rank]["InstanceId"]])
        tags = described["Reservations"][0]["Instances"][0].get("Tags", [])
        return {t["Key"]: t["Value"] for t in tags}

    def close(self) -> None:
        for fake in self.imds:
            fake.stop()


@pytest.fixture
def cluster(tmp_path, store):
    made: list[Cluster] = []

    def make(steps: int = 1000, **job_overrides) -> Cluster:
        made.append(Cluster(tmp_path / f"cluster{len(made)}", store, make_job(**job_overrides), steps))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.mark.slow
def test_a_job_that_completes_records_uploads_and_tags_every_node(cluster, s3):
    c = cluster(steps=6, secrets={"HF_TOKEN": "ssm:/team/hf"})
    results = c.run()
    assert {r: o.status for r, o in results.items()} == {0: "Completed", 1: "Completed"}
    for rank in (0, 1):
        rec = c.record(rank)
        assert rec["status"] == "Completed" and rec["exit_code"] == 0
        assert rec["instance_id"] == c.instances[rank]["InstanceId"]
        assert c.tags(rank)["distrain-cloud:status"] == "Completed"
        assert f"distrain/jobs/job-a1/output/logs/node-{rank}.log" in keys(s3)
    assert c.record(0)["step"] == 6  # the last step=N line rank 0's trainer printed
    assert "distrain/jobs/job-a1/model/model.safetensors" in keys(s3)
    assert "distrain/jobs/job-a1/output/metrics.jsonl" in keys(s3)
    assert keys(s3, "distrain/jobs/job-a1/stop") == []  # nothing asked anyone to stop
    # Both nodes found the main node's address; only references reached the environment.
    lines = (c.tmp_path / "node1" / "node-agent.log").read_text()
    assert 'main_addr=127.0.0.1 resumed=0 secrets={"HF_TOKEN": "ssm:/team/hf"}' in lines
    # One CloudWatch stream per node, with the training output in it.
    for rank in (0, 1):
        events = c.logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=f"job-a1/node-{rank}")["events"]
        messages = [e["message"] for e in events]
        assert any(m.startswith("step=6 ") for m in messages), messages[-5:]
        assert any("final status Completed" in m for m in messages)


@pytest.mark.slow
def test_a_spot_notice_on_one_node_stops_every_node_with_a_complete_checkpoint(cluster, s3):
    c = cluster()
    c.once_training(c.imds[1].set_spot_notice)
    results = c.run()
    assert {r: o.status for r, o in results.items()} == {0: "Interrupted", 1: "Interrupted"}
    marker = json.loads(s3.get_object(Bucket=BUCKET, Key="distrain/jobs/job-a1/stop")["Body"].read())
    assert marker["reason"] == "spot-interruption" and marker["by"] == c.instances[1]["InstanceId"]
    for rank in (0, 1):
        rec = c.record(rank)
        assert (rec["status"], rec["exit_code"]) == ("Interrupted", 143)
        assert rec["reason"].startswith("spot interruption notice on node 1")
    # Every node's part of the checkpoint it stopped at reached S3, then COMPLETE.
    restored = restore_checkpoint(c.store, CKPT, c.tmp_path / "restore")
    assert restored is not None
    assert {p.name for p in (c.tmp_path / "restore" / restored).iterdir()} == {
        "COMPLETE", "trainer_state.json", "random_states_0.pkl", "random_states_1.pkl",
    }  # fmt: skip
    assert "distrain/jobs/job-a1/model/model.safetensors" not in keys(s3)  # no model from a stopped run


@pytest.mark.slow
def test_a_resumed_attempt_starts_every_node_from_the_checkpoint(cluster, s3):
    c = cluster()
    c.once_training(lambda: c.store.put_json(c.job.key("stop"), {"reason": "cancel", "by": "cli"}))
    first = c.run()
    assert {o.status for o in first.values()} == {"Stopped"}
    assert first[0].reason == "cancelled"
    restored = restore_checkpoint(c.store, CKPT, c.tmp_path / "peek")
    assert restored is not None
    stopped_at = int(restored.split("-")[1])

    # Keys planted beside the checkpoint aim at the code the agent runs next (work/code, two folders
    # up from a checkpoint's): refused, each with one line; the resume goes on from the real files.
    planted = [f"{CKPT}{restored}/../../code/planted.py", f"{CKPT}compile-cache/../../code/cached.py"]
    for key in planted:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"import os; os.system('reboot')")
    again = cluster(steps=stopped_at + 3, job="job-a2", attempt=2)  # same lineage, same checkpoint_uri
    results = again.run()
    assert {o.status for o in results.values()} == {"Completed"}
    for rank in (0, 1):
        log = (again.tmp_path / f"node{rank}" / "node-agent.log").read_text()
        assert f"restored checkpoint-{stopped_at:08d}" in log
        assert f"resumed={stopped_at} " in log
        assert not (again.tmp_path / f"node{rank}" / "code").exists()
        for key in planted:
            assert log.count(f"refused {key!r}") == 1, log


@pytest.mark.slow
def test_a_node_that_fails_stops_the_others(cluster):
    c = cluster()
    c.env[1]["FAKE_FAIL_AT"] = "8"
    results = c.run()
    assert (results[1].status, results[1].reason) == ("Failed", "fake trainer failed on purpose")
    assert (results[0].status, results[0].reason) == ("Stopped", "node 1 failed: fake trainer failed on purpose")
    assert c.tags(0)["distrain-cloud:status"] == "Stopped"
    assert c.tags(1)["distrain-cloud:status"] == "Failed"


def ec2_requests(monkeypatch) -> list[tuple[str, dict]]:
    """(operation, params) of every EC2 request the clients made from now on will send."""
    from awscalls import on_every_client

    sent: list[tuple[str, dict]] = []
    on_every_client(
        monkeypatch, "provide-client-params.ec2", lambda model, params, **_: sent.append((model.name, params))
    )
    return sent


def tag_job(c: Cluster, job: str = "job-a1") -> None:
    """What RunInstances does for a launched job: every instance carries the job's name."""
    ids = [i["InstanceId"] for i in c.instances]
    c.ec2.create_tags(Resources=ids, Tags=[{"Key": node_agent.JOB_TAG, "Value": job}])


def states(c: Cluster, ids: list[str]) -> list[str]:
    found = c.ec2.describe_instances(InstanceIds=ids)["Reservations"]
    by_id = {i["InstanceId"]: i["State"]["Name"] for r in found for i in r["Instances"]}
    return [by_id[i] for i in ids]


@pytest.mark.slow
def test_a_node_that_never_joins_fails_the_rendezvous_and_leaves_a_stop_marker(cluster, s3, monkeypatch):
    from distrain_cloud.launcher.apimodel import problems

    c = cluster(rendezvous_timeout_s=1)
    tag_job(c)
    ami = c.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tags = [{"ResourceType": "instance", "Tags": [{"Key": node_agent.JOB_TAG, "Value": "job-b1"}]}]
    other = c.ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, TagSpecifications=tags)["Instances"][0]
    sent = ec2_requests(monkeypatch)
    results = c.run(ranks=[0])
    assert results[0].status == "Failed"
    assert results[0].reason.startswith("node 1 of 2 never joined the rendezvous within 1 s")
    assert c.record(0)["reason"] == results[0].reason
    # Nothing trained, so node 0 ended the silent node (it has no agent and no hard stop) and says so.
    silent = c.instances[1]["InstanceId"]
    assert states(c, [silent]) == ["terminated"]
    assert states(c, [other["InstanceId"]]) == ["running"]  # another job's instance: never touched
    assert c.record(0)["gave_up"] is True
    log = (c.tmp_path / "node0" / "node-agent.log").read_text()
    assert f"node_agent: no node trains: terminating the job's other instance(s): {silent}\n" in log
    asked = [(op, params) for op, params in sent if op in ("DescribeInstances", "TerminateInstances")]
    assert [op for op, _ in asked] == ["DescribeInstances", "TerminateInstances"]
    assert all(problems("ec2", op, params) == [] for op, params in asked)  # what AWS would accept
    # A late node reads the marker and stops before it trains.
    marker = json.loads(s3.get_object(Bucket=BUCKET, Key="distrain/jobs/job-a1/stop")["Body"].read())
    assert marker["reason"] == "peer-failed"
    late = c.run(ranks=[1])
    assert late[1].status == "Stopped" and "node 0 failed: node 1 of 2 never joined" in late[1].reason


@pytest.mark.slow
def test_malformed_records_are_ignored_and_a_malformed_stop_marker_still_stops_cleanly(cluster, s3):
    """Bytes in the job's folder that no agent wrote: records of ranks the job does not have, bodies
    that are no JSON object, fields of the wrong type. None gives a traceback; the job trains on
    until a stop marker comes, and one that is no JSON object still stops every node cleanly."""
    c = cluster()
    planted = {
        "nodes/7.json": b"\xff not json",
        "nodes/8.json": b"[1, 2]",
        "nodes/9.json": json.dumps({"status": "Failed", "reason": "planted: a rank this job does not have"}).encode(),
        "nodes/x.json": b"{}",
    }
    # and in the rendezvous folder of this launch: an index >= nodes, names that are no index
    meeting = f"rendezvous/{c.imds[0].identity.reservation_id}/"
    entry = json.dumps({"ip": "10.9.9.9", "instance_id": "i-0planted", "launch_index": 5}).encode()
    planted.update({f"{meeting}5.json": entry, f"{meeting}abc.json": entry, f"{meeting}-1.json": b"[]"})
    for name, body in planted.items():
        s3.put_object(Bucket=BUCKET, Key=c.job.key(name), Body=body)
    stop_key = c.job.key("stop")
    c.once_training(lambda: s3.put_object(Bucket=BUCKET, Key=stop_key, Body=b'["cancel"]'))
    results = c.run()
    expected = f"the stop marker s3://{BUCKET}/{stop_key} is not a JSON object: stopped as if cancelled"
    assert {r: (o.status, o.reason) for r, o in results.items()} == {0: ("Stopped", expected), 1: ("Stopped", expected)}
    for rank in (0, 1):
        log = (c.tmp_path / f"node{rank}" / "node-agent.log").read_text()
        assert "Traceback" not in log
        for name in ("nodes/7.json", "nodes/8.json", "nodes/9.json"):
            assert log.count(f"ignored the node record 's3://{BUCKET}/{c.job.key(name)}'") == 1, log
        for name in ("5.json", "abc.json", "-1.json"):
            assert log.count(f"ignored {c.job.key(meeting + name)!r} in the rendezvous folder") == 1, log
        assert "main node 127.0.0.1:" in log  # not the planted address


@pytest.mark.slow
def test_a_node_that_may_not_end_the_job_says_so_in_one_line_and_still_records(cluster, monkeypatch):
    from botocore.exceptions import ClientError

    c = cluster(rendezvous_timeout_s=1)
    tag_job(c)

    def refuse(params, **_):
        error = {"Code": "UnauthorizedOperation", "Message": "You are not authorized to perform this operation."}
        raise ClientError({"Error": error}, "DescribeInstances")

    from awscalls import on_every_client

    on_every_client(monkeypatch, "before-call.ec2.DescribeInstances", refuse, first=True)
    results = c.run(ranks=[0])
    assert results[0].status == "Failed" and c.record(0)["gave_up"] is True
    lines = [line for line in (c.tmp_path / "node0" / "node-agent.log").read_text().splitlines() if "could not" in line]
    assert lines == [
        "node_agent: could not end the job's other instances (ClientError: An error occurred (UnauthorizedOperation) "
        "when calling the DescribeInstances operation: You are not authorized to perform this operation.); "
        "`distrain-cloud cancel job-a1 --now` ends them"
    ]
    assert states(c, [c.instances[1]["InstanceId"]]) == ["running"]  # `status` names it (test_ec2_lifecycle.py)


def test_an_agent_answers_a_stop_with_a_record_at_once(store, tmp_path):
    # A graceful `cancel` terminates the nodes whose record does not move: a live agent's must, at
    # once, not at its next heartbeat.
    job = make_job()
    with FakeImds(instance_id=node(0).instance_id) as fake:
        sink = LogSink(tmp_path / "node-agent.log")
        settings = Settings(work=tmp_path, heartbeat_s=3600)
        agent = Agent(job, node(0), settings, store=store, imds=Imds(fake.endpoint), sink=sink)
        agent.heartbeat("training", force=True)
        store.put_json(job.key("stop"), {"reason": "cancel", "by": "launcher"})
        agent.check_stop(training=True)
        sink.close()
    record = store.get_json(job.key("nodes", "0.json"))
    assert (record["status"], record["phase"]) == ("InProgress", "stopping (cancel)")


def test_two_nodes_that_stop_at_once_keep_the_first_word(s3, tmp_path):
    # Node 0's spot word lands in S3 just as node 1, on its deadline, writes its own (after any
    # look it took found none). Node 1 must not replace it: S3's conditional write refuses.
    job = make_job()
    spot = {"reason": "spot-interruption", "by": "i-0", "detail": "spot notice on node 0"}

    class PeerWritesFirst:
        def __getattr__(self, name):
            return getattr(s3, name)

        def put_object(self, **kwargs):
            if kwargs["Key"] == job.key("stop"):
                s3.put_object(Bucket=BUCKET, Key=kwargs["Key"], Body=json.dumps(spot).encode())
            return s3.put_object(**kwargs)

    store = Store(BUCKET, REGION, PeerWritesFirst())
    with FakeImds(instance_id=node(1).instance_id) as fake:
        sink = LogSink(tmp_path / "node-agent.log")
        settings = Settings(work=tmp_path, heartbeat_s=3600)
        agent = Agent(job, node(1), settings, store=store, imds=Imds(fake.endpoint), sink=sink)
        agent.request_stop("deadline", "max-run reached: the job ran until its deadline")
        sink.close()
    assert store.get_json(job.key("stop"))["reason"] == "spot-interruption"
    assert (agent.stop.reason, agent.stop.detail) == ("spot-interruption", "spot notice on node 0")


@pytest.mark.slow
def test_the_deadline_stops_every_node(cluster):
    c = cluster(deadline=time.time() + 2)
    results = c.run()
    assert {o.status for o in results.values()} == {"Stopped"}
    assert results[1].reason == "max-run reached: the job ran until its deadline"


@pytest.mark.slow
def test_a_peer_that_failed_to_boot_ends_the_rendezvous_at_once(cluster):
    # What the user data leaves when the bundle's sha256 is not the planned one.
    c = cluster(rendezvous_timeout_s=600)
    failed = {"status": "Failed", "exit_code": 1, "reason": "bundle hash mismatch", "step": None}
    c.store.put_json(c.job.key("nodes", "1.json"), failed)
    started = time.monotonic()
    results = c.run(ranks=[0])
    assert time.monotonic() - started < 10  # not the 600 s rendezvous timeout
    assert (results[0].status, results[0].reason) == ("Stopped", "node 1 failed: bundle hash mismatch")
    assert c.tags(0)["distrain-cloud:status"] == "Stopped"


@pytest.mark.slow
def test_a_node_that_lost_its_peer_lets_the_peer_that_failed_take_the_blame(cluster):
    # Node 0's training dies of the broken connection a moment before node 1 reports its real failure.
    c = cluster()
    c.env[0]["FAKE_PEER_LOST_AT"] = "5"
    c.env[1]["FAKE_FAIL_AT"] = "7"
    results = c.run()
    assert (results[1].status, results[1].reason) == ("Failed", "fake trainer failed on purpose")
    assert (results[0].status, results[0].reason) == ("Stopped", "node 1 failed: fake trainer failed on purpose")


@pytest.mark.slow
def test_sigterm_to_the_agent_stops_every_node(cluster):
    # What the hard stop (shutdown -h) or an operator's kill sends the agent itself.
    c = cluster()
    agents = {r: c.agent(r) for r in (0, 1)}
    c.once_training(agents[0].signalled.set)
    results = {}

    def go(rank: int) -> None:
        results[rank] = agents[rank].run()
        c.sinks[rank].close()

    threads = [threading.Thread(target=go, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {r: (o.status, o.reason) for r, o in results.items()} == {
        0: ("Stopped", "node 0's instance is shutting down"),
        1: ("Stopped", "node 0's instance is shutting down"),
    }


@pytest.mark.slow  # a spot notice and a 1 s grace: about 8 s on 2 busy cores
def test_a_launcher_deaf_to_the_stop_is_killed_with_every_process_below_it(cluster):
    """After stop_grace_s the agent kills the launcher's whole tree: a process that left the
    launcher's session (torchrun's workers lead their own) survived the kill of its group."""
    c = cluster(nodes=1)
    c.settings = dataclasses.replace(c.settings, stop_grace_s=1)
    pid_file = c.tmp_path / "worker.pid"
    c.env[0]["FAKE_STUCK"] = str(pid_file)
    c.once_training(c.imds[0].set_spot_notice)
    started = time.monotonic()
    results = c.run(timeout=60)
    worker = int(pid_file.read_text())
    try:
        assert not Path(f"/proc/{worker}").exists() or " Z" in Path(f"/proc/{worker}/stat").read_text()[:64]
    finally:
        subprocess.run(["kill", "-9", str(worker)], capture_output=True, check=False)
    assert results[0].status == "Interrupted"
    assert time.monotonic() - started < 30  # not the reader's 30 s wait on a pipe the worker held
    assert "did not stop within 1 s: killing its processes" in (c.tmp_path / "node0" / "node-agent.log").read_text()


def agent_process(env: dict[str, str], job_uri: str, job_sha256: str = "0" * 64) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DISTRAIN_"))}
    return subprocess.run(
        [sys.executable, "-m", NODE_AGENT, "--job", job_uri, "--job-sha256", job_sha256],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_the_agent_powers_off_on_every_path_even_before_it_knows_the_job(tmp_path):
    from moto.server import ThreadedMotoServer

    poweroff = f"echo powered-off >> {tmp_path}/poweroff.log"
    # No metadata service at all: nothing can be recorded, the instance still goes.
    closed = f"http://127.0.0.1:{_closed_port()}"
    r = agent_process(
        {"DISTRAIN_EC2_WORK": str(tmp_path / "a"), "DISTRAIN_EC2_POWEROFF": poweroff,
         "AWS_EC2_METADATA_SERVICE_ENDPOINT": closed},
        "s3://bucket/p/jobs/j/job.json",
    )  # fmt: skip
    assert r.returncode == 1
    assert "failed: the instance metadata is unreadable" in r.stdout
    assert (tmp_path / "poweroff.log").read_text() == "powered-off\n"

    # A job.json that is not there: the node records why beside it, then powers off.
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        import boto3

        s3 = boto3.client(
            "s3", region_name=REGION, endpoint_url=f"http://{host}:{port}",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        s3.create_bucket(Bucket=BUCKET)
        with FakeImds(instance_id="i-0abc", launch_index=1) as fake:
            r = agent_process(
                {"DISTRAIN_EC2_WORK": str(tmp_path / "b"), "DISTRAIN_EC2_POWEROFF": poweroff,
                 "AWS_EC2_METADATA_SERVICE_ENDPOINT": fake.endpoint, "AWS_ENDPOINT_URL": f"http://{host}:{port}"},
                f"s3://{BUCKET}/p/jobs/j/job.json",
            )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr  # its record says what happened
        record = json.loads(s3.get_object(Bucket=BUCKET, Key="p/jobs/j/nodes/1.json")["Body"].read())
        assert (record["status"], record["reason"]) == ("Failed", f"s3://{BUCKET}/p/jobs/j/job.json does not exist")
        assert record["instance_id"] == "i-0abc"

        # A job.json that is not the one the plan hashed (rewritten after submit): the node trusts
        # none of it, fails with one line, and stops its peers, as a swapped bundle does.
        import hashlib

        planned = json.dumps(make_job(bucket=BUCKET, prefix="p", job="k").__dict__).encode()
        rewritten = planned.replace(b'"train_argv": [', b'"train_argv": ["--evil", ')
        s3.put_object(Bucket=BUCKET, Key="p/jobs/k/job.json", Body=rewritten)
        with FakeImds(instance_id="i-0abd", launch_index=0) as fake:
            r = agent_process(
                {"DISTRAIN_EC2_WORK": str(tmp_path / "c"), "DISTRAIN_EC2_POWEROFF": poweroff,
                 "AWS_EC2_METADATA_SERVICE_ENDPOINT": fake.endpoint, "AWS_ENDPOINT_URL": f"http://{host}:{port}"},
                f"s3://{BUCKET}/p/jobs/k/job.json",
                hashlib.sha256(planned).hexdigest(),
            )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        record = json.loads(s3.get_object(Bucket=BUCKET, Key="p/jobs/k/nodes/0.json")["Body"].read())
        digest, pinned = hashlib.sha256(rewritten).hexdigest(), hashlib.sha256(planned).hexdigest()
        assert (record["status"], record["reason"]) == (
            "Failed",
            f"job.json hash mismatch: s3://{BUCKET}/p/jobs/k/job.json has sha256 {digest[:12]}..., "
            f"the plan hashed {pinned[:12]}...",
        )
        stop = json.loads(s3.get_object(Bucket=BUCKET, Key="p/jobs/k/stop")["Body"].read())
        assert (stop["reason"], stop["rank"]) == ("peer-failed", 0) and "job.json hash mismatch" in stop["detail"]
        assert "--evil" not in (tmp_path / "c" / "node-agent.log").read_text()
    finally:
        server.stop()
    assert (tmp_path / "poweroff.log").read_text() == "powered-off\n" * 3


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
