"""EC2 submit, status, ls, logs, cancel and resume against moto.

Most tests build the stack's resources by hand (a bucket, a security group in the default VPC,
an instance profile, a log group) and hand them to the backend in place of `infra.stack`'s
lookup; one runs the real `infra up` and the CLI against a moto server in another process,
which is the path the two-node rehearsal takes. moto cannot serve the public DLAMI parameters:
tests set ec2.ami_id (a Deep Learning AMI of moto's own list) or replace `ec2_preflight.resolve_ami`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from awscalls import calls as calls  # noqa: F401 -- the fixture
from clirun import run_cli

from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.stack import StackResources
from distrain_cloud.launcher.api import plan_job, submit_job
from distrain_cloud.launcher.backends.ec2 import backend as ec2
from distrain_cloud.launcher.backends.ec2 import preflight as ec2_preflight
from distrain_cloud.launcher.backends.ec2 import records as ec2_records
from distrain_cloud.launcher.backends.ec2 import request as ec2_request
from distrain_cloud.launcher.backends.ec2 import status as ec2_status
from distrain_cloud.launcher.plan import JobRef
from distrain_cloud.launcher.spec import load_spec

REGION = "us-east-1"
AMI = "ami-dca37ea5"  # "Deep Learning AMI Ubuntu Linux - 2.4_Oct2017" in moto's image list
LOG_GROUP = "/distrain-cloud/distrain-cloud/jobs"
REPO = Path(__file__).resolve().parents[4]
_real_resolve = ec2_preflight.resolve_ami  # the stack fixture replaces it

pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS::")


@pytest.fixture
def stack(mocked_aws, monkeypatch) -> StackResources:
    """The resources `infra up` makes, made by hand (a real stack takes seconds under moto)."""
    return hand_made_stack(monkeypatch)


def hand_made_stack(monkeypatch) -> StackResources:
    import boto3

    ec2_client = boto3.client("ec2", region_name=REGION)
    vpc = ec2_client.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    group = ec2_client.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc)["GroupId"]
    boundary = boto3.client("iam").create_policy(
        PolicyName="job-boundary",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )["Policy"]["Arn"]
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="stack-bucket")
    boto3.client("logs", region_name=REGION).create_log_group(logGroupName=LOG_GROUP)
    resources = StackResources(
        stack="distrain-cloud",
        region=REGION,
        bucket="stack-bucket",
        job_boundary_arn=boundary,
        security_group_id=group,
        log_group=LOG_GROUP,
        launcher_policy_arn="arn:aws:iam::123456789012:policy/launcher",
        account="123456789012",
    )
    monkeypatch.setattr(ec2_records, "stack_resources", lambda name, region: resources)
    monkeypatch.setattr(ec2_preflight, "resolve_ami", lambda parameter, region: AMI)
    return resources


@pytest.fixture
def moto_server():
    """A moto server in this process (its state is moto's global one: reset before and after)."""
    import urllib.request

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"

    def reset() -> None:
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).read()

    reset()
    yield url
    reset()
    server.stop()


# A spot job without recovery on AWS's side (launcher/backends/ec2/recovery.py): RunInstances, `resume` after
# an interruption, as `--max-restarts 0` makes it.
PLAIN_SPOT = {"ec2.max_restarts": 0}


def spec(**overrides):
    base = {"instance": "g4dn.12xlarge", "region": REGION, "max_run": "2h"}
    return load_spec(None, {**base, **overrides})


def submitted(**overrides) -> tuple[str, dict]:
    plan = plan_job(spec(**overrides))
    assert submit_job(plan) == 0
    return plan.job_name, plan


def ref(name: str) -> JobRef:
    return JobRef(name, "ec2", REGION)


def s3_json(key: str):
    import boto3

    return json.loads(boto3.client("s3").get_object(Bucket="stack-bucket", Key=key)["Body"].read())


def put_node(job: str, rank: int, **record) -> None:
    import boto3

    body = json.dumps({"time": time.time(), **record}).encode()
    boto3.client("s3").put_object(Bucket="stack-bucket", Key=f"distrain-cloud/jobs/{job}/nodes/{rank}.json", Body=body)


def instances(job: str) -> list[dict]:
    import boto3

    pages = boto3.client("ec2", region_name=REGION).describe_instances(
        Filters=[{"Name": "tag:distrain-cloud:job", "Values": [job]}]
    )
    return [i for r in pages["Reservations"] for i in r["Instances"]]


# ====================================================================== submit


@pytest.mark.slow
def test_submit_uploads_the_bundle_writes_the_job_description_then_launches_once(stack, calls, capsys):
    import boto3

    job, plan = submitted(nodes=2, spot=True, **PLAIN_SPOT)
    writes = [
        (op, p.get("Key"))
        for op, p in zip(calls.ops, calls.params, strict=True)
        if op.endswith(("PutObject", "RunInstances"))
    ]
    lease = f"distrain-cloud/leases/{job}.json"  # the first submit of a lineage takes its lease too
    code, description = plan.payload.code_key, f"distrain-cloud/jobs/{job}/job.json"
    assert writes == [
        ("s3.PutObject", lease),
        ("s3.PutObject", code),
        ("s3.PutObject", f"distrain-cloud/submitted/{job}.json"),  # the launcher's copy, out of the job's reach
        ("s3.PutObject", description),
        ("ec2.RunInstances", None),
    ]
    (taken,) = [p for op, p in zip(calls.ops, calls.params, strict=True) if p.get("Key") == lease]
    assert taken["IfNoneMatch"] == "*"  # created only if absent: one conditional write decides
    assert s3_json(lease) | {"time": 0} == {
        "job": job, "lineage": job, "attempt": 1, "backend": "ec2", "region": REGION,
        "bucket": "stack-bucket", "prefix": "distrain-cloud", "time": 0,
    }  # fmt: skip
    assert "launched" not in capsys.readouterr().out
    description = s3_json(f"distrain-cloud/jobs/{job}/job.json")
    assert description == json.loads(json.dumps(plan.payload.description))
    # The user data pins the very bytes uploaded, as it pins the bundle's.
    import hashlib

    uploaded = boto3.client("s3").get_object(Bucket="stack-bucket", Key=f"distrain-cloud/jobs/{job}/job.json")
    pin = hashlib.sha256(uploaded["Body"].read()).hexdigest()
    launchers = boto3.client("s3").get_object(Bucket="stack-bucket", Key=f"distrain-cloud/submitted/{job}.json")
    assert hashlib.sha256(launchers["Body"].read()).hexdigest() == pin  # the same bytes
    assert f" --job-sha256 {pin} " in plan.request["UserData"]
    assert description["bucket"] == "stack-bucket" and description["log_group"] == LOG_GROUP
    assert description["checkpoint_uri"] == f"s3://stack-bucket/distrain-cloud/checkpoints/{job}/"
    code = boto3.client("s3").head_object(Bucket="stack-bucket", Key=plan.payload.code_key)
    assert code["ContentLength"] == plan.bundle["size"]

    nodes = instances(job)
    assert len(nodes) == 2 and {n["InstanceType"] for n in nodes} == {"g4dn.12xlarge"}
    assert {n["ImageId"] for n in nodes} == {AMI}
    assert sorted(n["AmiLaunchIndex"] for n in nodes) == [0, 1]
    assert len({n["ClientToken"] for n in nodes}) == 1 and nodes[0]["ClientToken"] == f"{job}-a1"
    tags = {t["Key"]: t["Value"] for t in nodes[0]["Tags"]}
    assert tags["distrain-cloud:stack"] == "distrain-cloud" and tags["distrain-cloud:lineage"] == job
    assert nodes[0]["IamInstanceProfile"]["Arn"].endswith(
        f"instance-profile/distrain-cloud/distrain-cloud/{job}"
    )  # its own
    assert nodes[0]["MetadataOptions"]["HttpTokens"] == "required"
    assert nodes[0]["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert nodes[0]["InstanceLifecycle"] == "spot"
    user_data = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
        InstanceId=nodes[0]["InstanceId"], Attribute="userData"
    )["UserData"]["Value"]
    import base64

    assert base64.b64decode(user_data).decode() == plan.request["UserData"]  # byte for byte
    (sent,) = [p for op, p in zip(calls.ops, calls.params, strict=True) if op == "ec2.RunInstances"]
    assert sent["NetworkInterfaces"][0]["InterfaceType"] == "efa"  # two g4dn.12xlarge: EFA
    named = [{"Name": "group-name", "Values": [f"distrain-cloud-{job}"]}]  # the job's own (test_network.py)
    (own,) = boto3.client("ec2", region_name=REGION).describe_security_groups(Filters=named)["SecurityGroups"]
    assert sent["NetworkInterfaces"][0]["Groups"] == [own["GroupId"]]
    assert sent["Placement"] == {"GroupName": job}
    assert sent["InstanceInitiatedShutdownBehavior"] == "terminate"


def test_preflight_fills_in_what_only_aws_knows(stack):
    plan = plan_job(spec(nodes=2))
    where = plan.payload.where
    assert where.resolved and where.ami_id == AMI and where.bucket == "stack-bucket"
    assert where.subnets[0].startswith("subnet-") and len(where.subnets) > 1  # the default VPC's zones
    placeholder = re.compile(r"<(stack|newest|a default|lineage)")
    assert not placeholder.search(json.dumps(plan.request)) and not placeholder.search(json.dumps(plan.configs))
    names = {c.name: c for c in plan.checks}
    assert names["AMI exists"].ok and "Deep Learning AMI" in names["AMI exists"].detail
    assert names["subnet"].ok and names["bucket exists"].ok
    assert names["vCPU quota: on-demand G and VT instances"].ok is None  # moto has no EC2 quotas


def test_a_dry_run_with_check_asks_aws_and_sends_nothing(stack, calls, capsys):
    code, out, _ = run_cli(capsys, "submit", "--instance", "g5.xlarge", "--region", REGION, "--dry-run", "--check")
    assert code == 0 and "[ok  ] AMI exists" in out and "[skip] vCPU quota" in out
    assert not [op for op in calls.ops if op in ("s3.PutObject", "ec2.RunInstances", "s3.CreateBucket")]


def test_an_oss_driver_ami_id_on_a_v100_fails_the_check_and_launches_nothing(stack, calls):
    import boto3

    image = boto3.client("ec2", region_name=REGION).register_image(
        Name="Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04)", RootDeviceName="/dev/sda1"
    )["ImageId"]
    plan = plan_job(spec(instance="p3.8xlarge", ec2={"ami_id": image}))
    (failed,) = plan.failed_checks
    assert failed.name == "AMI drives the GPU" and "cannot run p3.8xlarge's V100" in failed.detail
    assert [c.name for c in plan.checks].count("AMI drives the GPU") == 1  # the family's verdict is replaced
    with pytest.raises(UserError, match="plan check failed, nothing was created: AMI drives the GPU"):
        submit_job(plan)
    assert "ec2.RunInstances" not in calls.ops


def test_a_missing_stack_is_one_line_saying_to_run_infra_up(mocked_aws, calls, capsys):
    code, out, err = run_cli(capsys, "submit", "--yes", "--instance", "g4dn.12xlarge", "--region", REGION)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: no distrain-cloud stack 'distrain-cloud' in us-east-1: run `distrain-cloud infra up`"
    ]
    assert not [op for op in calls.ops if not op.startswith("cloudformation.Describe")]


def test_a_missing_ami_parameter_names_the_keys_to_set(stack, monkeypatch):
    monkeypatch.setattr(ec2_preflight, "resolve_ami", _real_resolve)  # moto has none of the public DLAMI parameters
    with pytest.raises(UserError, match=r"SSM parameter /aws/service/deeplearning/.* does not exist in us-east-1"):
        plan_job(spec())


def test_an_ami_parameter_of_the_users_is_resolved_from_ssm(stack, monkeypatch):
    import boto3

    monkeypatch.setattr(ec2_preflight, "resolve_ami", _real_resolve)
    boto3.client("ssm", region_name=REGION).put_parameter(Name="/team/ami", Value=AMI, Type="String")
    plan = plan_job(spec(ec2={"ami_parameter": "/team/ami"}))
    assert plan.request["ImageId"] == AMI


def test_the_secret_value_is_in_no_request_and_no_object(stack, calls, capsys):
    import boto3

    value = "fake-token-value-0123456789"
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name="distrain-cloud/hf-token", SecretString=value
    )["ARN"]
    job, plan = submitted(secrets={"HF_TOKEN": arn}, **{"hub.repo_id": "me/model"})
    sent = json.dumps(
        [p for op, p in zip(calls.ops, calls.params, strict=True) if op != "secretsmanager.CreateSecret"], default=str
    )
    assert value not in sent and value not in plan.to_json()
    assert not [op for op in calls.ops if "GetSecretValue" in op]
    assert s3_json(f"distrain-cloud/jobs/{job}/job.json")["secrets"] == {"HF_TOKEN": arn}  # the reference travels
    assert arn not in plan.request["UserData"]
    out, err = capsys.readouterr()
    assert value not in out + err


def _capacity_error(zones_without: int):
    """A before-call hook: the first `zones_without` RunInstances calls meet no capacity."""
    from botocore.awsrequest import AWSResponse

    seen: list[dict] = []

    def answer(params, **_):
        seen.append(params["body"])  # the query-protocol form: "NetworkInterface.1.SubnetId", ...
        if len(seen) > zones_without:
            return None
        error = {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no g4dn.12xlarge capacity"}}
        return AWSResponse("https://ec2", 400, {}, None), error

    return answer, seen


@pytest.mark.slow
def test_no_capacity_in_one_zone_tries_the_next_with_a_new_token(stack, monkeypatch, capsys):
    from distrain_cloud.infra import aws

    answer, seen = _capacity_error(1)
    real = aws.client

    def client(service, region=None, **kw):
        c = real(service, region, **kw)
        if service == "ec2":
            c.meta.events.register_first("before-call.ec2.RunInstances", answer)
        return c

    monkeypatch.setattr(aws, "client", client)
    job, _ = submitted(nodes=2)
    assert [p["ClientToken"] for p in seen] == [f"{job}-a1", f"{job}-a1-z1"]
    first, second = (p["NetworkInterface.1.SubnetId"] for p in seen)
    assert first != second
    assert f"note: no capacity for 2 x g4dn.12xlarge in subnet {first}; trying {second} (another zone)" in (
        capsys.readouterr().err
    )
    assert len(instances(job)) == 2


@pytest.mark.slow
def test_no_capacity_anywhere_is_one_line_and_the_job_says_so(stack, monkeypatch, capsys):
    from distrain_cloud.infra import aws

    answer, seen = _capacity_error(100)
    real = aws.client

    def client(service, region=None, **kw):
        c = real(service, region, **kw)
        if service == "ec2":
            c.meta.events.register_first("before-call.ec2.RunInstances", answer)
        return c

    monkeypatch.setattr(aws, "client", client)
    plan = plan_job(spec(ec2={"subnet_id": stack_subnet()}))
    with pytest.raises(UserError) as e:
        submit_job(plan)
    assert len(seen) == 1  # a subnet the user named: no other zone is tried
    assert str(e.value).startswith("AWS has no capacity for 1 x g4dn.12xlarge right now (tried subnet(s) subnet-")
    assert str(e.value).endswith("nothing was launched: retry later, with fewer nodes, another region or --spot")
    info = ec2.BACKEND.status(ref(plan.job_name))
    assert (info["status"], info["detail"]) == ("Failed", "not launched: no capacity")


def stack_subnet() -> str:
    """The default subnet of the region's first zone. Not the lowest subnet id: moto's ids are
    random, and one zone of six (us-east-1e) does not offer g4dn.12xlarge, which preflight refuses
    before any launch (a test that failed one run in six)."""
    import boto3

    subnets = boto3.client("ec2", region_name=REGION).describe_subnets()["Subnets"]
    return min((s["AvailabilityZone"], s["SubnetId"]) for s in subnets if s.get("DefaultForAz"))[1]


# ====================================================================== status and ls


@pytest.mark.slow
def test_status_follows_the_nodes_from_launch_to_completion(stack, capsys):
    job, _ = submitted(nodes=2)
    info = ec2.BACKEND.status(ref(job))
    assert (info["status"], info["detail"], info["terminal"]) == (
        "InProgress",
        "starting: 2/2 instance(s) running",
        False,
    )
    put_node(job, 0, status="InProgress", phase="rendezvous 1/2", step=None)
    assert ec2.BACKEND.status(ref(job))["detail"] == "rendezvous 1/2"
    put_node(job, 0, status="InProgress", phase="training", step=40)
    put_node(job, 1, status="InProgress", phase="training", step=38)
    assert ec2.BACKEND.status(ref(job))["detail"] == "training, step 40"
    put_node(job, 0, status="Completed", exit_code=0, reason="", step=100, instance_id="i-1")
    assert ec2.BACKEND.status(ref(job))["status"] == "InProgress"  # one node still running
    put_node(job, 1, status="Completed", exit_code=0, reason="", step=100, instance_id="i-2")
    info = ec2.BACKEND.status(ref(job))
    assert (info["status"], info["terminal"]) == ("Completed", True)
    assert info["model_artifacts"] == f"s3://stack-bucket/distrain-cloud/jobs/{job}/model/"
    code, out, _ = run_cli(capsys, "status", job, "--json")
    assert code == 0 and json.loads(out)["status"] == "Completed" and json.loads(out)["backend"] == "ec2"


def test_status_of_an_unknown_job_is_one_line(stack, capsys):
    code, out, err = run_cli(capsys, "status", "nope-1", "--backend", "ec2", "--region", REGION)
    assert code == 2 and out == ""
    assert err.strip() == (
        "error: no EC2 job nope-1 in s3://stack-bucket/distrain-cloud/jobs/ (us-east-1); "
        "`distrain-cloud ls` lists the jobs"
    )


@pytest.mark.slow
def test_ls_lists_ec2_jobs_newest_first(stack, capsys):
    first, _ = submitted()
    time.sleep(1.01)  # job names carry the second they were made
    second, _ = submitted(nodes=2)
    rows = ec2.BACKEND.list_jobs(region=REGION, workdir=Path("runs"), limit=10)
    assert [r["job_name"] for r in rows] == [second, first]
    assert rows[0]["instance"] == "2 x g4dn.12xlarge" and rows[0]["status"] == "InProgress"
    code, out, _ = run_cli(capsys, "ls", "--backend", "ec2", "--json", "--region", REGION)
    assert code == 0 and [r["job_name"] for r in json.loads(out)] == [second, first]


def test_ls_of_an_account_without_a_stack_is_empty(mocked_aws):
    assert ec2.BACKEND.list_jobs(region=REGION, workdir=Path("runs"), limit=10) == []


# ====================================================================== logs


def test_logs_print_every_node_prefixed(stack, capsys):
    import boto3

    job, _ = submitted(nodes=2)
    logs = boto3.client("logs", region_name=REGION)
    now = int(time.time() * 1000)
    for rank, lines in ((0, ["node_launch node_rank=0", "step=10 train_loss=1.2"]), (1, ["node_launch node_rank=1"])):
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=f"{job}/node-{rank}")
        logs.put_log_events(
            logGroupName=LOG_GROUP,
            logStreamName=f"{job}/node-{rank}",
            logEvents=[{"timestamp": now + i, "message": m} for i, m in enumerate(lines)],
        )
    code, out, _ = run_cli(capsys, "logs", job)
    assert code == 0
    assert out.splitlines() == [
        "[node-0] node_launch node_rank=0",
        "[node-0] step=10 train_loss=1.2",
        "[node-1] node_launch node_rank=1",
    ]
    code, out, err = run_cli(capsys, "logs", job, "--json")
    records = [json.loads(line) for line in out.splitlines()]  # every stdout line is JSON
    assert (code, err) == (0, "")
    assert [(r["host"], r["message"]) for r in records] == [
        ("node-0", "node_launch node_rank=0"),
        ("node-0", "step=10 train_loss=1.2"),
        ("node-1", "node_launch node_rank=1"),
    ]
    assert records[0]["time"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 1000)) + f".{now % 1000:03d}Z"


# ====================================================================== cancel and resume


@pytest.mark.slow
def test_cancel_writes_the_stop_marker_and_now_terminates(stack, capsys, monkeypatch):
    job, _ = submitted(nodes=2)
    ids = sorted(n["InstanceId"] for n in instances(job))

    def agents_answer(seconds: float) -> None:  # what live agents write within one poll of the marker
        for rank, instance_id in enumerate(ids):
            put_node(job, rank, status="InProgress", phase="stopping (cancel)", step=7, instance_id=instance_id)

    # cancel's own wait (records.unanswered) sleeps through its module's `time`, patched there alone: a
    # process-wide time.sleep would also turn every other thread's sleep in this worker into S3 writes
    clock = types.SimpleNamespace(sleep=agents_answer, monotonic=time.monotonic, time=time.time)
    monkeypatch.setattr(ec2_records, "time", clock)
    code, out, _ = run_cli(capsys, "cancel", job)
    assert code == 0 and out.startswith(f"stopping {job}: every node saves a checkpoint")
    assert {n["State"]["Name"] for n in instances(job)} == {"running"}  # left to their agents
    stop = s3_json(f"distrain-cloud/jobs/{job}/stop")
    assert (stop["reason"], stop["by"]) == ("cancel", "launcher")
    assert ec2.BACKEND.status(ref(job))["detail"].startswith("stopping (cancel)")
    code, out, _ = run_cli(capsys, "cancel", job, "--now")
    assert code == 0 and out.startswith(f"terminating 2 instance(s) of {job}")
    assert {n["State"]["Name"] for n in instances(job)} <= {"shutting-down", "terminated"}
    info = ec2.BACKEND.status(ref(job))
    assert (info["status"], info["terminal"]) == ("Stopped", True)
    code, out, _ = run_cli(capsys, "cancel", job)
    assert out.strip() == f"{job} already ended: Stopped"


@pytest.mark.slow
def test_a_graceful_cancel_terminates_the_nodes_whose_agents_do_not_answer(stack, capsys, monkeypatch):
    """The agents wrote heartbeats, then died (OOM-killed, a hung host): nothing would act on the stop
    marker until the hard stop. cancel waits a bounded time for an answer, then terminates them."""
    job, _ = submitted(nodes=2)
    ids = sorted(n["InstanceId"] for n in instances(job))
    for rank, instance_id in enumerate(ids):
        put_node(job, rank, status="InProgress", phase="training", step=40, instance_id=instance_id)
    monkeypatch.setattr(ec2_records, "CANCEL_ANSWER_S", 1)  # 45 s for real
    monkeypatch.setattr(ec2_records, "CANCEL_POLL_S", 0.2)
    started = time.monotonic()
    code, out, err = run_cli(capsys, "cancel", job)
    assert code == 0 and time.monotonic() - started < 20
    assert out.splitlines() == [
        f"stopping {job}: no node agent answered the stop within 1 s on {', '.join(ids)}: "
        "terminated them, without a checkpoint"
    ]
    assert err.strip() == "note: waiting up to 1 s for the node agents to answer the stop"
    assert {n["State"]["Name"] for n in instances(job)} <= {"shutting-down", "terminated"}
    info = ec2.BACKEND.status(ref(job))
    assert (info["status"], info["terminal"]) == ("Stopped", True)


@pytest.mark.slow
def test_cancel_of_a_job_that_gave_up_ends_what_it_could_not(stack, capsys):
    import boto3

    job, _ = submitted(nodes=2)
    first, silent = sorted(n["InstanceId"] for n in instances(job))
    reason = "node 1 of 2 never joined the rendezvous within 600 s"
    put_node(job, 0, status="Failed", exit_code=1, reason=reason, step=None, instance_id=first, gave_up=True)
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[first])  # its own power-off
    info = ec2.BACKEND.status(ref(job))
    assert (info["status"], info["terminal"]) == ("Failed", True)
    assert info["detail"] == f"node 0: {reason}; still running: {silent}: `distrain-cloud cancel {job} --now` ends them"
    code, out, _ = run_cli(capsys, "cancel", job)
    assert code == 0 and out.strip() == f"{job} already ended (Failed); terminated what still ran: {silent}"
    assert {n["State"]["Name"] for n in instances(job)} <= {"shutting-down", "terminated"}


def test_cancel_now_is_refused_for_other_backends(mocked_aws, capsys):
    code, _, err = run_cli(capsys, "cancel", "job-1", "--now", "--backend", "sagemaker")
    assert code == 2 and "--now applies to EC2 and local jobs; job-1 is a sagemaker job: drop --now" in err


@pytest.mark.slow
def test_resume_is_a_new_attempt_of_the_lineage_from_its_checkpoints(stack, capsys, job_records):
    job, plan = submitted(nodes=2, spot=True, **PLAIN_SPOT, secrets={"HF_TOKEN": "ssm:/distrain-cloud/hf"})
    for rank in (0, 1):
        put_node(job, rank, status="Interrupted", exit_code=143, reason="spot-interruption", step=60)
    assert ec2.BACKEND.status(ref(job))["status"] == "Interrupted"
    code, _, err = run_cli(capsys, "resume", job, "--yes")
    assert code == 0, err
    new = next(line.split()[1].rstrip(":") for line in err.splitlines() if line.startswith("submitted "))
    assert new != job
    description = s3_json(f"distrain-cloud/jobs/{new}/job.json")
    assert (description["lineage"], description["attempt"]) == (job, 2)
    assert description["checkpoint_uri"] == plan.payload.description["checkpoint_uri"]
    assert description["secrets"] == {"HF_TOKEN": "ssm:/distrain-cloud/hf"} and description["nodes"] == 2
    (node, *_) = instances(new)
    assert node["ClientToken"] == f"{new}-a2" and node["InstanceLifecycle"] == "spot"
    assert {t["Key"]: t["Value"] for t in node["Tags"]}["distrain-cloud:lineage"] == job

    # From a machine with no record of it, the spec comes from the job description in S3: the
    # launcher's copy, not the job.json the job's own code may rewrite (here: 8 nodes of p4d, another lineage).
    for record in job_records.glob("*.json"):
        record.unlink()
    import boto3

    hostile = s3_json(f"distrain-cloud/jobs/{new}/job.json")
    hostile["spec"].update(nodes=8, instance="p4d.24xlarge")
    hostile.update(lineage="someone-elses", nodes=8)
    boto3.client("s3").put_object(
        Bucket="stack-bucket", Key=f"distrain-cloud/jobs/{new}/job.json", Body=json.dumps(hostile).encode()
    )
    assert s3_json(f"distrain-cloud/submitted/{new}.json")["spec"]["nodes"] == 2
    code, out, err = run_cli(capsys, "resume", new, "--backend", "ec2", "--region", REGION, "--dry-run")
    assert code == 0 and f"lineage: <lineage of {new}>, attempt <next>" in out, err  # known only to AWS
    # While attempt 2 runs, the lineage's lease (and its holder's status, read from S3) refuses a third.
    code, _, err = run_cli(capsys, "resume", new, "--backend", "ec2", "--region", REGION, "--yes")
    assert code == 2 and err.startswith(f"error: lineage {job} has a live attempt: {new} (attempt 2, "), err
    assert launched_jobs() == sorted([job, new])
    for rank in (0, 1):
        put_node(new, rank, status="Interrupted", exit_code=143, reason="spot-interruption", step=90)
    code, _, err = run_cli(capsys, "resume", new, "--backend", "ec2", "--region", REGION, "--yes")
    assert code == 0, err
    third = next(line.split()[1].rstrip(":") for line in err.splitlines() if line.startswith("submitted "))
    description = s3_json(f"distrain-cloud/jobs/{third}/job.json")
    assert (description["lineage"], description["attempt"], description["nodes"]) == (job, 3, 2)
    assert description["instance_type"] == "g4dn.12xlarge"


@pytest.mark.slow
def test_submit_spot_wait_resumes_an_interrupted_lineage_until_it_completes(stack, monkeypatch, capsys):
    """What the nodes would write, written whenever the launcher sleeps between polls: the first
    attempt is interrupted, the next completes."""
    import boto3

    from distrain_cloud.launcher.api import resume_spec
    from distrain_cloud.launcher.lease import LineageBusy

    s3 = boto3.client("s3")
    holders: list[tuple[str, int]] = []  # the lineage's lease, whenever the launcher polls

    def nodes_report(seconds: float) -> None:
        lease = json.loads(
            s3.get_object(Bucket="stack-bucket", Key=f"distrain-cloud/leases/{plan.job_name}.json")["Body"].read()
        )
        holders.append((lease["job"], lease["attempt"]))
        if lease["attempt"] == 2:  # the relaunch is live: a resume of the first attempt meanwhile is refused
            with pytest.raises(LineageBusy, match=f"has a live attempt: {lease['job']} \\(attempt 2, InProgress\\)"):
                submit_job(plan_job(resume_spec(ref(plan.job_name))))
        listed = s3.list_objects_v2(Bucket="stack-bucket", Prefix="distrain-cloud/jobs/")["Contents"]
        for key in [o["Key"] for o in listed if o["Key"].endswith("/job.json")]:
            job = json.loads(s3.get_object(Bucket="stack-bucket", Key=key)["Body"].read())
            outcome = "Interrupted" if job["attempt"] == 1 else "Completed"
            for rank in range(job["nodes"]):
                put_node(job["job"], rank, status=outcome, exit_code=0 if outcome == "Completed" else 143, reason="")

    monkeypatch.setattr("time.sleep", nodes_report)
    plan = plan_job(spec(nodes=2, spot=True, **PLAIN_SPOT))
    assert submit_job(plan, wait=True) == 0
    err = capsys.readouterr().err
    assert f"{plan.job_name}: spot capacity was reclaimed; resuming from its checkpoints" in err
    jobs = [line.split()[1].rstrip(":") for line in err.splitlines() if line.startswith("submitted ")]
    assert len(jobs) == 2 and jobs[0] == plan.job_name
    assert ec2.BACKEND.status(ref(jobs[1]))["status"] == "Completed"
    assert s3_json(f"distrain-cloud/jobs/{jobs[1]}/job.json")["lineage"] == plan.job_name
    assert holders == [(jobs[0], 1), (jobs[1], 2)]  # the relaunch took the first attempt's lease over
    assert len(launched_jobs()) == 2


class PerThread:
    """sys.stderr for CLIs run in threads: what each thread writes, kept apart by thread name."""

    encoding, errors = "utf-8", "strict"

    def __init__(self) -> None:
        self.text: dict[str, str] = {}

    def write(self, s: str) -> int:
        import threading

        name = threading.current_thread().name
        self.text[name] = self.text.get(name, "") + s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def resumes_at_once(monkeypatch, job: str, count: int = 2) -> dict[str, tuple[int, str]]:
    """`distrain-cloud resume JOB --yes`, `count` times at once (threads of this process, moto's
    in-process mock): thread name -> (exit code, stderr). Once the lineage has a lease, every
    resume's first takeover of it (If-Match on the ETag they read) waits for the others' (a barrier),
    so they race for it at one moment."""
    import threading

    import botocore.session

    from distrain_cloud.launcher import cli

    err = PerThread()
    monkeypatch.setattr(sys, "stderr", err)
    start, at_lease = threading.Barrier(count), threading.Barrier(count)
    real = botocore.session.Session.create_client

    met: set[str] = set()

    def meet(params, **_):
        name = threading.current_thread().name
        if "/leases/" in params.get("Key", "") and "IfMatch" in params and name not in met:
            met.add(name)
            try:
                at_lease.wait(timeout=20)
            except threading.BrokenBarrierError:
                pass  # the other resume never got this far

    def create_client(self, *args, **kwargs):
        client = real(self, *args, **kwargs)
        client.meta.events.register("provide-client-params.s3.PutObject", meet)
        return client

    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)
    results: dict[str, tuple[int, str]] = {}

    def resume() -> None:
        start.wait(timeout=20)
        try:
            cli.main(["resume", job, "--yes"])
        except SystemExit as e:
            name = threading.current_thread().name
            results[name] = (int(e.code or 0), err.text.get(name, ""))

    threads = [threading.Thread(target=resume, name=f"resume-{i}") for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    monkeypatch.setattr(botocore.session.Session, "create_client", real)
    return results


def launched_jobs() -> list[str]:
    """Every job with a job.json in the stack's bucket."""
    import boto3

    listed = boto3.client("s3").list_objects_v2(Bucket="stack-bucket", Prefix="distrain-cloud/jobs/")
    return sorted(o["Key"].split("/")[2] for o in listed.get("Contents", []) if o["Key"].endswith("/job.json"))


@pytest.mark.slow
def test_two_resumes_at_once_launch_one_attempt_and_refuse_the_other_naming_it(stack, monkeypatch):
    job, _ = submitted(nodes=1, spot=True, **PLAIN_SPOT)
    put_node(job, 0, status="Interrupted", exit_code=143, reason="spot-interruption", step=60)
    results = resumes_at_once(monkeypatch, job)
    assert len(results) == 2, results
    launched = [j for j in launched_jobs() if j != job]
    assert len(launched) == 1, f"{len(launched)} attempts launched on one lineage: {launched}"
    (live,) = launched
    codes = sorted(code for code, _ in results.values())
    assert codes == [0, 2], results
    (refused,) = [err for code, err in results.values() if code == 2]
    # The loser reads the lease before or after the winner's job.json is written: launching, or InProgress.
    (line,) = refused.strip().splitlines()
    assert re.fullmatch(
        rf"error: lineage {job} has a live attempt: {live} \(attempt 2, (launching|InProgress)\); one attempt "
        rf"runs at a time: `distrain-cloud status {live}`, or stop it \(`distrain-cloud cancel {live}`\) and "
        "resume again",
        line,
    ), line
    assert [i["Tags"] for i in instances(live)] and len(instances(live)) == 1  # the one launch, one node
    lease = s3_json(f"distrain-cloud/leases/{job}.json")
    assert (lease["job"], lease["attempt"], lease["lineage"]) == (live, 2, job)

    # A resume after the live attempt ended takes the lease over; the ended attempts stay as they were.
    put_node(live, 0, status="Interrupted", exit_code=143, reason="spot-interruption", step=90)
    capsys_free = resumes_at_once(monkeypatch, live, count=1)
    ((code, err),) = capsys_free.values()
    assert code == 0, err
    (third,) = [j for j in launched_jobs() if j not in (job, live)]
    lease = s3_json(f"distrain-cloud/leases/{job}.json")
    assert (lease["job"], lease["attempt"]) == (third, 3)


def test_resume_from_an_unknown_job_is_one_line(stack):
    with pytest.raises(UserError, match="--resume-from nope-1: no EC2 job of that name in s3://stack-bucket/"):
        plan_job(spec(resume_from="nope-1"))


# ====================================================================== status without moto


def description(nodes=2, submitted_ago=60.0, max_run=3600) -> dict:
    now = time.time()
    return {
        "job": "job-1",
        "nodes": nodes,
        "lineage": "job-1",
        "attempt": 1,
        "deadline": now - submitted_ago + max_run,
        "submitted": now - submitted_ago,
        "instance_type": "g4dn.12xlarge",
        "checkpoint_uri": "s3://b/p/checkpoints/job-1/",
        "model_uri": "s3://b/p/jobs/job-1/model/",
    }


RUNNING = [{"id": "i-1", "state": "running", "reason": ""}, {"id": "i-2", "state": "running", "reason": ""}]
ENDED = [{"id": "i-1", "state": "terminated", "reason": ""}, {"id": "i-2", "state": "terminated", "reason": ""}]
RESUME = "`distrain-cloud resume job-1` continues it"
STOPPING = ("InProgress", "stopping (cancel): every node saves a checkpoint, then ends")
SPOT_ENDED = [{"id": "i-1", "state": "terminated", "reason": ec2_status.SPOT_TERMINATION}]
GAVE_UP = "node 1 of 2 never joined the rendezvous within 600 s"
HEARTBEAT = {"status": "InProgress", "phase": "training", "step": 5}


def final(status: str, reason: str = "") -> dict:
    return {"status": status, "exit_code": 0 if status == "Completed" else 1, "reason": reason, "step": 5}


@pytest.mark.parametrize(
    "nodes, stop, instances, expected",
    [
        ({0: final("Completed"), 1: final("Completed")}, None, ENDED, ("Completed", "model in s3://b/p/jobs/job-1/model/")),
        (
            {0: final("Completed"), 1: final("Failed", "CUDA error: out of memory")},
            None,
            ENDED,
            ("Failed", "node 1: CUDA error: out of memory"),
        ),
        (
            {1: final("Failed", "bundle hash mismatch")},
            None,
            RUNNING,
            ("InProgress", "node 1 failed (bundle hash mismatch); the others are stopping"),
        ),
        (
            {0: final("Interrupted", "spot-interruption"), 1: final("Interrupted", "spot-interruption")},
            None,
            ENDED,
            ("Interrupted", "spot capacity was reclaimed; checkpoints saved: " + RESUME),
        ),
        (
            {0: final("Stopped", "deadline"), 1: final("Stopped", "deadline")},
            None,
            ENDED,
            ("Stopped", "stopped (deadline); checkpoints saved: " + RESUME),
        ),
        (
            {0: final("Completed")},
            None,
            ENDED,
            ("Lost", "node(s) 1 ended without a record: see `distrain-cloud logs job-1`"),
        ),
        ({}, None, ENDED, ("Lost", "its instances ended without a record: see `distrain-cloud logs job-1`")),
        (
            {},
            None,
            SPOT_ENDED,
            (
                "Interrupted",
                "spot capacity was reclaimed before the nodes reported; `distrain-cloud resume job-1` continues it",
            ),
        ),
        ({}, {"reason": "cancel"}, RUNNING, STOPPING),
        ({}, None, [], ("InProgress", "launching")),
        (
            {0: {**final("Failed", GAVE_UP), "gave_up": True}},
            {"reason": "peer-failed"},
            [ENDED[0], RUNNING[1]],
            ("Failed", f"node 0: {GAVE_UP}; still running: i-2: `distrain-cloud cancel job-1 --now` ends them"),
        ),
        (
            {0: HEARTBEAT, 1: HEARTBEAT},
            None,
            [],
            ("Lost", "its instances ended without a record: see `distrain-cloud logs job-1`"),
        ),
        (
            {0: HEARTBEAT},
            {"reason": "cancel"},
            [],
            ("Stopped", "stopped (cancel) before its nodes wrote a final record; its last checkpoint, if any, stays"),
        ),
    ],
    ids=[
        "completed", "failed", "failed-while-others-run", "interrupted", "deadline", "one-node-lost", "lost",
        "spot-before-records", "stopping", "launching", "gave-up-with-a-silent-node-left",
        "heartbeats-then-gone", "stopped-then-gone",
    ],
)  # fmt: skip
def test_job_status_from_records_and_instances(nodes, stop, instances, expected):
    info = ec2.job_status(description(), {"nodes": nodes, "stop": stop}, instances, now=time.time())
    assert (info["status"], info["detail"]) == expected
    assert info["terminal"] == (expected[0] != "InProgress")


def test_a_job_with_no_instance_long_after_submit_is_lost():
    info = ec2.job_status(description(submitted_ago=3600), {"nodes": {}}, [], now=time.time())
    assert info["status"] == "Lost"


@pytest.mark.parametrize(
    "submitted_ago, nodes, instances, expected",
    [
        (  # node 0's bundle check failed; node 1 never ran its user data, so no agent will end it
            1500,
            {0: {**final("Failed", "bundle hash mismatch"), "instance_id": "i-1"}},
            [ENDED[0], RUNNING[1]],
            (
                "Failed",
                "node 0: bundle hash mismatch; still running: i-2: `distrain-cloud cancel job-1 --now` ends them",
            ),
        ),
        (  # the same early on: node 1 may still be installing, and will see the stop marker
            300,
            {0: {**final("Failed", "bundle hash mismatch"), "instance_id": "i-1"}},
            [ENDED[0], RUNNING[1]],
            ("InProgress", "node 0 failed (bundle hash mismatch); the others are stopping"),
        ),
        (  # no node ever ran its user data: running, and said so
            1500,
            {},
            RUNNING,
            (
                "InProgress",
                "no node has reported 25 min after submit: their user data may not have run (see the instances' "
                "console output); `distrain-cloud cancel job-1 --now` ends them",
            ),
        ),
    ],
    ids=["failed-and-silent", "failed-and-booting", "all-silent"],
)
def test_nodes_that_never_report_are_named(submitted_ago, nodes, instances, expected):
    info = ec2.job_status(description(submitted_ago=submitted_ago), {"nodes": nodes}, instances, now=time.time())
    assert (info["status"], info["detail"]) == expected


def test_instances_past_the_deadline_are_flagged():
    info = ec2.job_status(description(submitted_ago=7200, max_run=3600), {"nodes": {}}, RUNNING, now=time.time())
    assert info["status"] == "InProgress"
    assert info["detail"].endswith("instances past the job's deadline: `distrain-cloud cancel job-1 --now`")


# ====================================================================== the real CLI, a moto server, a real stack


@pytest.mark.slow  # CLI processes and a stack on a moto server
def test_the_cli_submits_to_a_moto_server_with_a_stack_from_infra_up(tmp_path, moto_server):
    """The rehearsal's path: `infra up`, then `submit --instance g4dn.12xlarge` with an AMI override,
    each a separate process talking to a moto server over HTTP."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        HOME=str(tmp_path),
        DISTRAIN_HOME=str(tmp_path / "home"),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION=REGION,
        AWS_ENDPOINT_URL=moto_server,
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"instance: g4dn.12xlarge\nnodes: 2\nmax_run: 30m\nec2:\n  ami_id: {AMI}\n")

    def distrain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "distrain_cloud.launcher.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    up = distrain("infra", "up", "--yes")
    assert up.returncode == 0, up.stderr
    sub = distrain("submit", str(job_file), "--yes", "--", "--max-steps", "3")
    assert sub.returncode == 0, sub.stderr
    job = next(line.split()[1].rstrip(":") for line in sub.stderr.splitlines() if line.startswith("submitted "))
    status = distrain("status", job, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "InProgress" and len(json.loads(status.stdout)["instances"]) == 2


# ====================================================================== the user data, run here


WRAPPER = """#!/bin/bash
# The AMI's python, except that pip and the node agent only say how they were called, and
# torch (slow to import here) gives a version of its own.
case "$2" in *"import torch"*) echo "torch==2.7.0+cu128"; exit 0 ;; esac
for arg in "$@"; do
  case "$arg" in
    pip) echo "pip $*" >> "$REHEARSAL_LOG"; exit 0 ;;
    distrain_cloud.launcher.backends.ec2.agent)
      echo "agent $* cwd=$(pwd) PYTHONPATH=$PYTHONPATH" >> "$REHEARSAL_LOG"; exit 0 ;;
  esac
done
exec {python} "$@"
"""


@pytest.mark.slow  # runs the user data with bash
def test_the_user_data_runs_here_up_to_the_agent_and_a_swapped_bundle_stops_the_job(tmp_path, monkeypatch, moto_server):
    """Each node's user data, run by bash against a moto server and a fake metadata service (no
    keys in its environment): node 1 fetches and checks the bundle, installs and hands over to
    the agent; node 0, whose bundle was swapped after the plan, reports it, stops the job and
    terminates itself."""
    import base64

    import boto3

    sys.path.insert(0, str(REPO / "tests"))  # tests/ is not a package
    from imds import FakeImds

    url = moto_server
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    hand_made_stack(monkeypatch)
    job, plan = submitted(instance="c5.2xlarge", nodes=2, max_run="30m")
    nodes = sorted(instances(job), key=lambda i: i["AmiLaunchIndex"])
    ec2_client = boto3.client("ec2", region_name=REGION)
    python = tmp_path / "python"
    python.write_text(WRAPPER.format(python=sys.executable))
    python.chmod(0o755)
    log = tmp_path / "calls.log"

    def run_node(rank: int) -> subprocess.CompletedProcess[str]:
        node = nodes[rank]
        user_data = ec2_client.describe_instance_attribute(InstanceId=node["InstanceId"], Attribute="userData")
        script = base64.b64decode(user_data["UserData"]["Value"]).decode()
        with FakeImds(instance_id=node["InstanceId"], launch_index=rank, region=REGION) as imds:
            env = {
                "PATH": os.environ["PATH"],
                "HOME": str(tmp_path),
                "AWS_ENDPOINT_URL": url,
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
                "DISTRAIN_EC2_HARD_STOP": "echo hard-stop",
                "DISTRAIN_EC2_PYTHON": str(python),
                "DISTRAIN_EC2_WORK": str(tmp_path / f"node-{rank}"),
                "DISTRAIN_EC2_POWEROFF": "echo power-off",
                "DISTRAIN_EC2_PER_BOOT": str(tmp_path / f"node-{rank}-per-boot"),
                "REHEARSAL_LOG": str(log),
            }
            return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)

    good = run_node(1)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.splitlines()[0] == "hard-stop +40" and good.stdout.splitlines()[-1] == "power-off"
    pip, agent = log.read_text().splitlines()
    assert "-c " + str(tmp_path / "node-1" / "constraints.txt") in pip and "-r requirements.txt" in pip
    assert "transformers>=4.46" in pip
    code = tmp_path / "node-1" / "code"
    import hashlib

    uploaded = boto3.client("s3").get_object(Bucket="stack-bucket", Key=f"distrain-cloud/jobs/{job}/job.json")
    assert agent.startswith(
        f"agent -m distrain_cloud.launcher.backends.ec2.agent --job s3://stack-bucket/distrain-cloud/jobs/{job}/job.json"
        f" --job-sha256 {hashlib.sha256(uploaded['Body'].read()).hexdigest()} "
    )
    assert agent.endswith(f"cwd={code} PYTHONPATH={code}")
    assert (code / "distrain_cloud" / "launcher" / "backends" / "ec2" / "agent" / "__main__.py").is_file()
    assert (tmp_path / "node-1" / "constraints.txt").read_text() == "torch==2.7.0+cu128\n"  # the AMI's stays
    # A reboot does not run the user data again, so no agent runs after it: cloud-init runs the
    # per-boot hook the user data installed, which says so (boot.py fail) and powers off at once,
    # whatever time is left (the node idled until its deadline before).
    hook = tmp_path / "node-1-per-boot" / "distrain-hard-stop"
    assert hook.stat().st_mode & 0o111
    assert '"$BOOT" fail "the instance rebooted: its node agent does not survive a reboot"' in hook.read_text()
    assert f"BOOT={tmp_path / 'node-1' / 'boot.py'}" in hook.read_text()
    for minutes_later in (0, 15, 41):
        assert _reboot(hook, tmp_path, minutes_later).splitlines()[-1] == "power-off", minutes_later

    boto3.client("s3").put_object(Bucket="stack-bucket", Key=plan.payload.code_key, Body=b"other bytes")
    bad = run_node(0)
    assert bad.returncode == 1 and bad.stdout.splitlines()[-1] == "power-off", bad.stdout + bad.stderr
    record = s3_json(f"distrain-cloud/jobs/{job}/nodes/0.json")
    assert record["status"] == "Failed" and record["reason"].startswith("bundle hash mismatch: s3://stack-bucket/")
    stop = s3_json(f"distrain-cloud/jobs/{job}/stop")
    assert (stop["reason"], stop["rank"]) == ("peer-failed", 0) and "bundle hash mismatch" in stop["detail"]
    states = {i["InstanceId"]: i["State"]["Name"] for i in instances(job)}
    assert states[nodes[0]["InstanceId"]] in ("shutting-down", "terminated")
    info = ec2.BACKEND.status(ref(job))
    assert info["status"] == "InProgress" and info["detail"].startswith("node 0 failed (bundle hash mismatch")


# ====================================================================== nothing outlives its job


def _reboot(hook: Path, tmp_path: Path, minutes_later: float) -> str:
    """What the per-boot `hook` does at a boot `minutes_later` than now (a `date` that says so)."""
    import shutil

    clock = tmp_path / "clock"
    clock.mkdir(exist_ok=True)
    fake = clock / "date"
    fake.write_text(f"#!/bin/bash\necho $(( $({shutil.which('date')} +%s) + {int(minutes_later * 60)} ))\n")
    fake.chmod(0o755)
    env = {"PATH": f"{clock}:{os.environ['PATH']}"}
    return subprocess.run([str(hook)], env=env, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


# The AMI's python, except that pip and torch (slow here) only answer; the node agent runs for real.
AGENT_WRAPPER = """#!/bin/bash
case "$2" in *"import torch"*) echo "torch==2.7.0+cu128"; exit 0 ;; esac
for arg in "$@"; do
  case "$arg" in pip) exit 0 ;; esac
done
exec {python} "$@"
"""


def _on_the_moto_server(monkeypatch, url: str) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)


def _run_user_data(node: dict, tmp_path: Path, url: str, python: Path, **switches: str) -> subprocess.CompletedProcess:
    """Run `node`'s user data with bash as its instance would, with a fake IMDSv2 server of its own
    (credentials from there only) and a power-off that terminates the instance in moto."""
    import base64

    import boto3

    sys.path.insert(0, str(REPO / "tests"))  # tests/ is not a package
    from imds import FakeImds

    attr = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
        InstanceId=node["InstanceId"], Attribute="userData"
    )
    script = base64.b64decode(attr["UserData"]["Value"]).decode()
    rank, work = node["AmiLaunchIndex"], tmp_path / f"node-{node['AmiLaunchIndex']}"
    reservation = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[node["InstanceId"]])
    terminate = f"import boto3; boto3.client('ec2').terminate_instances(InstanceIds=['{node['InstanceId']}'])"
    with FakeImds(
        instance_id=node["InstanceId"],
        launch_index=rank,
        reservation_id=reservation["Reservations"][0]["ReservationId"],
        region=REGION,
    ) as imds:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "AWS_ENDPOINT_URL": url,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
            "DISTRAIN_EC2_HARD_STOP": "echo hard-stop",
            "DISTRAIN_EC2_PYTHON": str(python),
            "DISTRAIN_EC2_WORK": str(work),
            "DISTRAIN_EC2_PER_BOOT": str(work / "per-boot"),
            "DISTRAIN_EC2_POWEROFF": f'echo power-off; {sys.executable} -c "{terminate}"',
            "DISTRAIN_EC2_POLL_S": "0.2",
            "DISTRAIN_EC2_HEARTBEAT_S": "0.5",
            **switches,
        }
        return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # runs the user data and the real node agent
def test_a_node_that_never_runs_its_user_data_is_terminated_by_the_node_that_gives_up(
    tmp_path, monkeypatch, moto_server
):
    """Node 1 never runs its user data (no agent, no hard stop). Node 0's agent gives up on the
    rendezvous: it terminates every instance of its job, not only its own, and `status` says
    Failed with the reason instead of InProgress forever."""
    _on_the_moto_server(monkeypatch, moto_server)
    hand_made_stack(monkeypatch)
    monkeypatch.setattr(ec2_request, "RENDEZVOUS_TIMEOUT_S", 1)  # job.json carries it; 600 s on EC2
    job, _ = submitted(instance="c5.2xlarge", nodes=2, max_run="30m")
    nodes = sorted(instances(job), key=lambda i: i["AmiLaunchIndex"])
    python = tmp_path / "python"
    python.write_text(AGENT_WRAPPER.format(python=sys.executable))
    python.chmod(0o755)

    started = time.monotonic()
    run = _run_user_data(nodes[0], tmp_path, moto_server, python)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert time.monotonic() - started < 60
    assert {i["State"]["Name"] for i in instances(job)} <= {"shutting-down", "terminated"}, run.stdout[-3000:]
    assert "never joined the rendezvous within 1 s" in run.stdout
    assert f"terminating the job's other instance(s): {nodes[1]['InstanceId']}" in run.stdout
    info = ec2.BACKEND.status(ref(job))
    assert (info["status"], info["terminal"]) == ("Failed", True)
    assert info["detail"].startswith("node 0: node 1 of 2 never joined the rendezvous within 1 s")
