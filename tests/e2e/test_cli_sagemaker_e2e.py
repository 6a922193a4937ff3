"""The real `distrain-cloud` CLI, in a subprocess, against a moto server standing in for AWS.

Nothing is patched in the CLI process: it finds the server through AWS_ENDPOINT_URL, which
botocore honours natively, with fake credentials and no ~/.aws.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sagemaker-gpt2-emotion.yaml"
REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class _QuotasHandler(BaseHTTPRequestHandler):
    """Service Quotas' ListServiceQuotas, which moto does not answer for SageMaker (its 500s would be
    retried with back-off for ~8 s): one spot and one on-demand quota for ml.p3.8xlarge."""

    requests: list[str] = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        target = self.headers.get("X-Amz-Target", "")
        type(self).requests.append(target)
        quotas = [
            {"ServiceCode": "sagemaker", "QuotaCode": f"L-{i}", "QuotaName": name, "Value": value}
            for i, (name, value) in enumerate(
                (("ml.p3.8xlarge for training job usage", 1.0), ("ml.p3.8xlarge for spot training job usage", 2.0))
            )
        ]
        ok = target.endswith(".ListServiceQuotas")
        body = json.dumps({"Quotas": quotas} if ok else {"__type": "UnknownOperationException"}).encode()
        self.send_response(200 if ok else 400)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def quotas_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _QuotasHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def env(moto_server, quotas_server, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")  # no ~/.aws
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # AWS_DEFAULT_REGION as a configured profile would give it;
    # test_submit_with_only_region_flag_and_no_configured_region covers the case without it
    return {
        **base,
        "HOME": str(home),
        "AWS_ENDPOINT_URL": moto_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(home / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"),
        "AWS_ENDPOINT_URL_SERVICE_QUOTAS": quotas_server,
    }


def aws_client(service, moto_server):
    import boto3

    return boto3.client(
        service,
        region_name=REGION,
        endpoint_url=moto_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="module")
def role(moto_server):
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "sagemaker.amazonaws.com"}}
        ],
    }
    return aws_client("iam", moto_server).create_role(
        RoleName="distrain-cloud-sagemaker", AssumeRolePolicyDocument=json.dumps(policy)
    )["Role"]["Arn"]


def plan_and_result(text: str) -> tuple[dict, dict]:
    """`submit --json`'s stdout, one document: the plan with its `result`."""
    plan = json.loads(text)
    return plan, plan.pop("result")


@pytest.mark.slow  # seven CLI processes against a moto server
def test_submit_the_example_then_status_ls_logs_and_cancel(cli, moto_server, env, role, tmp_path):
    args = ["submit", str(EXAMPLE), "--region", REGION, "--role", role, "--max-cost", "100", "--json", "--yes"]
    r = cli(*args, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan, result = plan_and_result(r.stdout)
    assert (result["job"], result["exit_code"]) == (plan["job_name"], 0)
    job_name = plan["job_name"]
    assert f"submitted {job_name} (code bundle uploaded)" in r.stderr
    assert not [c for c in plan["checks"] if c["ok"] is False]
    checks = {c["name"]: (c["ok"], c["detail"]) for c in plan["checks"]}
    assert checks["role exists and trusts SageMaker"] == (True, role)
    quota = checks["quota: ml.p3.8xlarge for spot training job usage"]  # no job in progress before this one
    assert quota == (True, "2 allowed, 0 in use by 0 in-progress job(s), 1 needed")
    assert checks["bucket exists"][0] is True and checks["request fits the SageMaker API model"][0] is True
    assert (
        plan["request"]["StoppingCondition"]["MaxWaitTimeInSeconds"]
        >= plan["request"]["StoppingCondition"]["MaxRuntimeInSeconds"]
    )
    assert any(t.endswith(".ListServiceQuotas") for t in _QuotasHandler.requests)
    # one process per GPU: 4 x V100 on one ml.p3.8xlarge
    acc = plan["configs"]["accelerate_config (node 0)"]
    assert (acc["num_processes"], acc["num_machines"], acc["mixed_precision"]) == (4, 1, "fp16")
    assert plan["summary"]["processes"] == "4 per node, 4 in all"

    sm = aws_client("sagemaker", moto_server)
    job = sm.describe_training_job(TrainingJobName=job_name)
    algo = job["AlgorithmSpecification"]
    image = algo["TrainingImage"]
    assert "huggingface-pytorch-training" in image and "-cu12" in image and "cu13" not in image
    assert image == plan["request"]["AlgorithmSpecification"]["TrainingImage"]
    entry = algo["ContainerEntrypoint"]
    assert entry[:2] == ["/bin/bash", "-c"] and "distrain_cloud/training/job_entry.sh" in entry[2]
    assert entry == plan["request"]["AlgorithmSpecification"]["ContainerEntrypoint"]
    assert job["ResourceConfig"]["InstanceType"] == "ml.p3.8xlarge" and job["ResourceConfig"]["InstanceCount"] == 1
    assert job["RoleArn"] == role

    hp = job["HyperParameters"]
    assert hp == plan["request"]["HyperParameters"]
    assert {k: hp[k] for k in ("model", "dataset", "strategy", "precision", "push_to_hub", "run_name")} == {
        "model": "gpt2",
        "dataset": "dair-ai/emotion",
        "strategy": "zero2",
        "precision": "fp16",
        "push_to_hub": "my-org/gpt2-emotion",
        "run_name": job_name,
    }
    assert "HF_TOKEN" not in json.dumps(hp)

    bucket = f"distrain-cloud-123456789012-{REGION}"
    assert job["EnableManagedSpotTraining"] is True
    assert job["StoppingCondition"] == {"MaxRuntimeInSeconds": 6 * 3600, "MaxWaitTimeInSeconds": 8 * 3600}
    assert job["CheckpointConfig"] == {
        "S3Uri": f"s3://{bucket}/distrain-cloud/checkpoints/{job_name}/",
        "LocalPath": "/opt/ml/checkpoints",
    }
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]}
    sha = plan["bundle"]["sha256"]
    assert tags == {
        "distrain-cloud:code-sha256": sha,
        "distrain-cloud:lineage": job_name,
        "distrain-cloud:strategy": "zero2",
    }
    s3 = aws_client("s3", moto_server)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    # the code bundle, and the lineage's lease (one live attempt per lineage), beside its checkpoints
    assert keys == [f"distrain-cloud/code/{sha}.tar.gz", f"distrain-cloud/leases/{job_name}.json"]

    # status, ls, logs, cancel: each its own process, against the same server; the job's record
    # (written at submit) says where it runs, so neither --backend nor --region is needed
    r = cli("status", job_name, "--json", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["backend"] == "sagemaker"
    assert (info["status"], info["terminal"], info["instance"]) == ("Completed", True, "1 x ml.p3.8xlarge")
    assert info["checkpoints"] == job["CheckpointConfig"]["S3Uri"]

    r = cli("ls", "--json", "--region", REGION, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert job_name in {j["job_name"] for j in json.loads(r.stdout)}

    r = cli("logs", job_name, env=env, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "")  # moto writes no logs for its jobs

    r = cli("cancel", job_name, env=env, cwd=tmp_path)
    assert (r.returncode, r.stdout.strip()) == (0, f"{job_name} already ended: Completed")

    r = cli("wait", job_name, "--poll", "0", env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.rstrip().endswith(f"{job_name}: Completed / Completed"), r.stderr

    # the same code again: the bundle is already there
    r = cli("submit", str(EXAMPLE), "--region", REGION, "--role", role, "--yes", env=env, cwd=tmp_path)
    assert r.returncode == 0 and "(code bundle already in S3)" in r.stderr, r.stderr
    assert len(s3.list_objects_v2(Bucket=bucket, Prefix="distrain-cloud/code/")["Contents"]) == 1


def test_submit_over_budget_exits_non_zero_and_creates_no_job(cli, moto_server, env, role, tmp_path):
    sm = aws_client("sagemaker", moto_server)
    before = {j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]}
    r = cli("submit", str(EXAMPLE), "--region", REGION, "--role", role, "--max-cost", "20", env=env, cwd=tmp_path)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: plan check failed, nothing was created: cost <= --max-cost 20.0")
    assert {j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]} == before


def test_status_of_an_unknown_job_is_one_line(cli, env, tmp_path):
    r = cli("status", "no-such-job", "--region", REGION, env=env, cwd=tmp_path)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: no job named no-such-job is known (no record on this machine and no folder ")
    assert line.endswith(
        f"none on SageMaker in {REGION}); an EC2 job submitted from another machine: add --backend ec2"
    )


def test_submit_with_only_region_flag_and_no_configured_region(cli, moto_server, env, role, tmp_path):
    bare = {k: v for k, v in env.items() if k not in ("AWS_DEFAULT_REGION", "AWS_REGION")}
    r = cli("submit", str(EXAMPLE), "--region", REGION, "--role", role, "--yes", env=bare, cwd=tmp_path)
    assert "no AWS region" not in r.stderr
    assert r.returncode == 0, r.stderr


@pytest.mark.slow  # CLI processes and a CloudFormation stack on a moto server
def test_after_infra_up_a_submit_needs_no_role(cli, moto_server, env, tmp_path):
    """No role and no stack: one line saying to run `infra up`; after it, a role of the job's own and the
    stack's bucket."""
    r = cli("submit", "--instance", "ml.g5.xlarge", "--stack", "e2e-stack", env=env, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert "distrain-cloud infra up" in line and "--role" in line, line

    r = cli("infra", "up", "--stack", "e2e-stack", "--yes", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = cli("submit", "--instance", "ml.g5.xlarge", "--stack", "e2e-stack", "--json", "--yes", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan, result = plan_and_result(r.stdout)
    cf = aws_client("cloudformation", moto_server)
    physical = {
        res["LogicalResourceId"]: res["PhysicalResourceId"]
        for res in cf.describe_stack_resources(StackName="e2e-stack")["StackResources"]
        if res.get("PhysicalResourceId")  # moto lists resources it cannot create without ids
    }
    # The job's own role, made at submit under the stack's path and boundary...
    shown = plan["configs"]["job_role"]
    assert shown["path"] == "/distrain-cloud/e2e-stack/" and shown["permissions_boundary"] == physical["JobBoundary"]
    job = aws_client("sagemaker", moto_server).describe_training_job(TrainingJobName=plan["job_name"])
    assert job["RoleArn"] == shown["arn"] == plan["request"]["RoleArn"]
    # ...and deleted once the launcher saw the job end (moto's jobs complete at once; --json asks status).
    assert result["status"] == "Completed"
    assert aws_client("iam", moto_server).list_roles(PathPrefix="/distrain-cloud/")["Roles"] == []
    assert job["OutputDataConfig"]["S3OutputPath"].startswith(f"s3://{physical['Bucket']}/")
