"""The SageMaker backend: a training job on the Hugging Face training image.

The plan holds the exact CreateTrainingJob request, and submit sends that request and
nothing else (through infra.aws's one boto3 adaptor). The job runs its own entrypoint: it
unpacks the code bundle (an input channel), resolves secret references, and runs the node
launcher, which starts one process per GPU on every node. The SageMaker training toolkit is
not used, so nothing rewrites the request between the plan and the API.
"""

from __future__ import annotations

import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.resources import default_bucket
from distrain_cloud.training.args import argv_to_hyperparameters, parse_args
from distrain_cloud.training.contract import SAGEMAKER_CHECKPOINT_DIR
from distrain_cloud.training.strategies import (ClusterShape, accelerate_config, choose_precision,
                                               deepspeed_config_for, parse_strategy)

from ..bootstrap import sagemaker_entrypoint
from ..plan import Check, Plan, unique_job_name

if TYPE_CHECKING:
    from ..spec import JobSpec

CODE_CHANNEL = "code"
TAG_PREFIX = "distrain-cloud:"
METRICS = ("train_loss", "eval_loss", "eval_accuracy", "eval_f1_macro", "eval_perplexity", "tokens_per_sec")
SPOT_PRICE_RANGE = (0.3, 0.7)  # typical spot price as a fraction of on-demand; never above 1.0


class TrainingJobStatus(str, Enum):
    InProgress = "InProgress"
    Completed = "Completed"
    Failed = "Failed"
    Stopping = "Stopping"
    Stopped = "Stopped"
    Deleting = "Deleting"  # an ended job being deleted


TERMINAL = frozenset({TrainingJobStatus.Completed, TrainingJobStatus.Failed, TrainingJobStatus.Stopped,
                      TrainingJobStatus.Deleting})
# What a secondary status means, for `status` when SageMaker gives no FailureReason.
SECONDARY_DETAIL = {
    "Interrupted": "spot capacity was reclaimed; SageMaker restarts the job when capacity returns and it resumes "
                   "from its last checkpoint",
    "MaxWaitTimeExceeded": "spot capacity did not come (and the job did not finish) within --max-wait; raise "
                           "--max-wait, or use --on-demand",
    "MaxRuntimeExceeded": "the job ran past --max-run and was stopped; its checkpoints remain (resume with "
                          "resume_from)",
}


def repo_root() -> Path:
    """Where training/ and infra/ live: the checkout (editable install) or site-packages."""
    import distrain_cloud.training as training

    return Path(training.__file__).resolve().parent.parent


class SageMakerBackend:
    name = "sagemaker"

    # ------------------------------------------------------------------ plan

    def plan(self, spec: JobSpec, *, dry_run: bool = False) -> Plan:
        from ..bundle import build_bundle, bundle_key
        from ..catalog import lookup
        from ..images import choose_training_image

        instance = lookup(spec.instance)
        if not instance.sagemaker:
            raise UserError(f"--instance {spec.instance} is not a SageMaker type; use ml.{spec.instance}")
        region, region_check = self._region(spec, dry_run)
        image = choose_training_image(instance, region, image_uri=spec.sagemaker.image_uri,
                                      transformers_version=spec.sagemaker.transformers_version,
                                      pytorch_version=spec.sagemaker.pytorch_version)
        where = f"{instance.name} has {instance.gpu_model} ({instance.compute_capability_str})"
        try:
            precision = choose_precision(spec.precision, instance.gpus, instance.compute_capability, where)
        except ValueError as e:
            raise UserError(str(e)) from None
        job_name = unique_job_name(spec.name)
        argv = spec.check_training_args(precision, job_name)
        train = parse_args(argv)
        strategy = parse_strategy(spec.strategy)

        checks: list[Check] = [region_check]
        prefix = spec.sagemaker.prefix.strip("/")
        bundle = build_bundle(repo_root(), allow_large=spec.bundle.allow_large)
        code_key = bundle_key(prefix, bundle.sha256)
        lineage = spec.resume_from or job_name

        processes = max(instance.gpus, 1)
        cluster = ClusterShape(num_nodes=spec.nodes, processes_per_node=processes, main_addr="algo-1",
                               use_cpu=not instance.gpus)
        try:
            configs: dict[str, Any] = {"accelerate_config (node 0)": accelerate_config(
                strategy, cluster, precision=precision)}
        except ValueError as e:  # e.g. --strategy single on a multi-GPU instance
            raise UserError(str(e)) from None
        if strategy.uses_deepspeed:
            configs["deepspeed_config"] = deepspeed_config_for(train, cluster.world_size)

        max_wait = spec.max_wait or (spec.max_run * 2 if spec.spot else None)

        def request_for(account: str, role_arn: str, checkpoint_uri: str | None = None) -> dict[str, Any]:
            bucket = spec.sagemaker.bucket or default_bucket(account, region)
            checkpoint_uri = checkpoint_uri or f"s3://{bucket}/{prefix}/checkpoints/{lineage}/"
            return self._request(spec, job_name, image.uri, role_arn, bucket, prefix, code_key, checkpoint_uri,
                                 argv, bundle.sha256, lineage, max_wait)

        # Everything the user wrote is in the request before AWS is asked anything, so a request
        # the API would refuse is refused here, with no call made.
        refuse_api_problems(request_for(*_offline_identity(spec, "000000000000")))
        if dry_run:
            account, role_arn = _offline_identity(spec, "<account>")
            checks.append(Check("role exists and trusts SageMaker", None, "not checked in a dry run"))
        else:
            account, role_arn = self._account_and_role(spec, region, checks)
        bucket = spec.sagemaker.bucket or default_bucket(account, region)
        checkpoint_uri = self._checkpoint_uri(spec, bucket, prefix, lineage, region, dry_run, checks)
        request = request_for(account, role_arn, checkpoint_uri)
        if not dry_run:
            refuse_api_problems(request)  # the looked-up parts too (a previous job's checkpoint URI)
        checks.append(Check("request fits the SageMaker API model", True,
                            "lengths, ranges, patterns and required fields of CreateTrainingJob"))
        cost = self._cost(spec, instance, region)
        checks += self._static_checks(spec, job_name, max_wait, cost, image)
        if not dry_run:
            checks += self._live_checks(spec, bucket, region, role_arn, instance)
        return Plan(
            backend=self.name, job_name=job_name,
            summary={"instance": f"{spec.nodes} x {instance.name} ({instance.gpus} x {instance.gpu_model}, "
                                 f"cc {instance.compute_capability_str})",
                     "processes": f"{processes} per node, {cluster.world_size} in all",
                     "strategy": spec.strategy, "precision": precision, "region": region,
                     "image": image.uri, "image_reason": image.reason, "spot": spec.spot,
                     "output": f"s3://{bucket}/{prefix}/jobs/{job_name}/", "checkpoints": checkpoint_uri},
            request=request, configs=configs,
            bundle={"sha256": bundle.sha256, "size": bundle.size, "files": len(bundle.files),
                    "s3": f"s3://{bucket}/{code_key}"},
            cost=cost, checks=checks,
            payload={"bundle": bundle.data, "bundle_listing": bundle.listing(), "bucket": bucket, "code_key": code_key, "region": region},
        )

    def _region(self, spec: JobSpec, dry_run: bool) -> tuple[str, Check]:
        from distrain_cloud.infra import aws

        if dry_run and not spec.region:
            try:
                return aws.region(None), Check("region", True)
            except UserError:
                return "us-east-1", Check("region", None, "none configured; assumed us-east-1 (pass --region)")
        return aws.region(spec.region), Check("region", True)

    def _account_and_role(self, spec: JobSpec, region: str, checks: list[Check]) -> tuple[str, str]:
        from distrain_cloud.infra import aws, resources

        with aws.translate_errors():
            account = aws.account_id(region)
            arn = resources.check_role(_role(spec), region=region)
        checks.append(Check("role exists and trusts SageMaker", True, arn))
        return account, arn

    def _checkpoint_uri(self, spec, bucket, prefix, lineage, region, dry_run, checks) -> str:
        uri = f"s3://{bucket}/{prefix}/checkpoints/{lineage}/"
        if not spec.resume_from:
            return uri
        if dry_run:
            checks.append(Check(f"resume from {spec.resume_from}", None, "its checkpoint location is not looked up "
                                                                       "in a dry run"))
            return uri
        from distrain_cloud.infra import aws

        with aws.translate_errors():
            job = aws.client("sagemaker", region).describe_training_job(TrainingJobName=spec.resume_from)
        previous = (job.get("CheckpointConfig") or {}).get("S3Uri")
        checks.append(Check(f"resume from {spec.resume_from}", bool(previous), previous or "it had no checkpoints"))
        return previous or uri

    def _request(self, spec, job_name, image_uri, role_arn, bucket, prefix, code_key, checkpoint_uri, argv,
                 sha256, lineage, max_wait) -> dict[str, Any]:
        channels = [{
            "ChannelName": CODE_CHANNEL,
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://{bucket}/{code_key}",
                                            "S3DataDistributionType": "FullyReplicated"}},
            "InputMode": "File",
        }]
        for name, uri in sorted(spec.inputs.items()):
            if not uri.startswith("s3://"):
                raise UserError(f"--input {name}={uri}: SageMaker channels must be s3:// URIs")
            if name == CODE_CHANNEL:
                raise UserError(f"--input {name}: the channel name '{CODE_CHANNEL}' is reserved for the code bundle")
            channels.append({"ChannelName": name, "InputMode": "File", "DataSource": {"S3DataSource": {
                "S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}}})
        environment = {"HF_HUB_DISABLE_TELEMETRY": "1"}
        if spec.secrets:
            environment["DISTRAIN_SECRETS"] = json.dumps(spec.secrets, sort_keys=True)  # references only
        stopping = {"MaxRuntimeInSeconds": spec.max_run}
        if spec.spot:
            stopping["MaxWaitTimeInSeconds"] = max_wait
        tags = [{"Key": f"{TAG_PREFIX}code-sha256", "Value": sha256},
                {"Key": f"{TAG_PREFIX}lineage", "Value": lineage},
                {"Key": f"{TAG_PREFIX}strategy", "Value": spec.strategy}]
        tags += [{"Key": k, "Value": v} for k, v in sorted(spec.sagemaker.tags.items())]
        request: dict[str, Any] = {
            "TrainingJobName": job_name,
            "RoleArn": role_arn,
            "AlgorithmSpecification": {
                "TrainingImage": image_uri,
                "TrainingInputMode": "File",
                "ContainerEntrypoint": sagemaker_entrypoint(CODE_CHANNEL),
                "MetricDefinitions": [{"Name": m, "Regex": f"{m}=([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|nan|inf))"} for m in METRICS],
            },
            "HyperParameters": argv_to_hyperparameters(argv),
            "InputDataConfig": channels,
            "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/{prefix}/jobs/"},
            "ResourceConfig": {"InstanceType": spec.instance, "InstanceCount": spec.nodes,
                               "VolumeSizeInGB": spec.sagemaker.volume_size_gb},
            "StoppingCondition": stopping,
            "EnableManagedSpotTraining": spec.spot,
            "CheckpointConfig": {"S3Uri": checkpoint_uri, "LocalPath": SAGEMAKER_CHECKPOINT_DIR},
            "Environment": environment,
            "Tags": tags,
        }
        if spec.sagemaker.subnets:
            request["VpcConfig"] = {"Subnets": spec.sagemaker.subnets,
                                    "SecurityGroupIds": spec.sagemaker.security_group_ids}
        return request

    def _cost(self, spec, instance, region) -> dict[str, Any] | None:
        from ..catalog import hourly_price

        price = hourly_price(instance, region)
        if price is None:
            return {"hourly_usd": None, "note": f"no list price for {instance.name} in {region}"}
        hours = spec.max_run / 3600
        worst = round(spec.nodes * price * hours, 2)
        cost: dict[str, Any] = {"hourly_usd": round(spec.nodes * price, 2), "max_run_hours": round(hours, 2),
                                "worst_case_usd": worst}
        if spec.spot:
            lo, hi = SPOT_PRICE_RANGE
            cost["spot_typical_usd"] = f"{worst * lo:.2f}-{worst * hi:.2f}"
        return cost

    def _static_checks(self, spec, job_name, max_wait, cost, image) -> list[Check]:
        import re

        checks = [
            Check("job name valid", bool(re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", job_name)), job_name),
            Check("image runs on the GPU", True, image.reason),
        ]
        if spec.spot:
            checks.append(Check("max_wait >= max_run", max_wait >= spec.max_run, f"{max_wait}s >= {spec.max_run}s"))
        if spec.max_cost is not None:
            worst = (cost or {}).get("worst_case_usd")
            if worst is None:
                checks.append(Check(f"cost <= --max-cost {spec.max_cost}", False, "no price known to compare"))
            else:
                checks.append(Check(f"cost <= --max-cost {spec.max_cost}", worst <= spec.max_cost,
                                    f"worst case ${worst} ({spec.nodes} node(s) x max_run)"))
        return checks

    def _live_checks(self, spec, bucket, region, role_arn, instance) -> list[Check]:
        from distrain_cloud.infra import aws

        checks = []
        s3 = aws.client("s3", region)
        try:
            s3.head_bucket(Bucket=bucket)
            checks.append(Check("bucket exists", True, bucket))
        except Exception as e:
            code = aws.error_code(e)
            if code in ("403", "AccessDenied"):  # another account's, or not ours to use
                checks.append(Check("bucket usable", False, f"{bucket}: access denied; name another bucket"))
            elif spec.sagemaker.bucket:
                checks.append(Check("bucket exists", False, f"{bucket}: create it or drop sagemaker.bucket"))
            else:
                checks.append(Check("bucket exists", True, f"{bucket} will be created"))
        checks.append(self._quota_check(spec, region))
        return checks

    def _quota_check(self, spec, region) -> Check:
        from distrain_cloud.infra import aws

        name = f"{spec.instance} for {'spot ' if spec.spot else ''}training job usage"
        try:
            quotas = aws.client("service-quotas", region, max_attempts=2)
            for page in quotas.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker"):
                for q in page.get("Quotas", []):
                    if q.get("QuotaName") == name:
                        value = int(q.get("Value", 0))
                        return Check(f"quota: {name}", value >= spec.nodes, f"{value} allowed, {spec.nodes} needed")
        except Exception as e:  # no permission or not answered: say so, don't block
            return Check(f"quota: {name}", None, f"not checked ({type(e).__name__})")
        return Check(f"quota: {name}", None, "Service Quotas did not list it")

    # ------------------------------------------------------------------ act

    def submit(self, plan: Plan, *, wait: bool = False) -> int:
        from distrain_cloud.infra import aws, resources

        failed = plan.failed_checks
        if failed:
            raise UserError("plan check failed, nothing was created: "
                            + "; ".join(f"{c.name} ({c.detail})" for c in failed))
        region, bucket = plan.payload["region"], plan.payload["bucket"]
        with aws.translate_errors():
            resources.ensure_bucket(bucket, region)
            uploaded = resources.upload_if_absent(bucket, plan.payload["code_key"], plan.payload["bundle"], region)
            create_training_job_once(plan.request, region)
        print(f"submitted {plan.job_name} (code bundle {'uploaded' if uploaded else 'already in S3'})",
              file=sys.stderr)
        print(f"next: distrain-cloud logs {plan.job_name} --follow --region {region}", file=sys.stderr)
        if wait:
            return self.wait(plan.job_name, region=region)
        return 0

    def wait(self, job_name: str, *, region: str | None = None, poll: float = 15.0) -> int:
        seen = None
        while True:
            info = self.status(job_name, region=region)
            state = (info["status"], info.get("secondary_status"))
            if state != seen:
                print(f"{job_name}: {info['status']} / {info.get('secondary_status')}"
                      + (f" - {info['detail']}" if info.get("detail") else ""), file=sys.stderr, flush=True)
                seen = state
            if info["terminal"]:
                return 0 if info["status"] == "Completed" else 1
            time.sleep(poll)

    # ------------------------------------------------------------------ lifecycle

    def status(self, job_name: str, *, region: str | None = None, **_: Any) -> dict[str, Any]:
        from distrain_cloud.infra import aws

        with aws.translate_errors():
            job = aws.client("sagemaker", aws.region(region)).describe_training_job(TrainingJobName=job_name)
        status = job["TrainingJobStatus"]
        secondary = job.get("SecondaryStatus")
        resources = job.get("ResourceConfig") or {}
        return {
            "job_name": job_name,
            "status": status,
            "secondary_status": secondary,
            # a status newer than this code is taken as still running: `wait` keeps polling
            "terminal": status in {s.value for s in TERMINAL},
            "instance": f"{resources.get('InstanceCount', '?')} x {resources.get('InstanceType', '?')}",
            "created": str(job.get("CreationTime", "")),
            "detail": job.get("FailureReason") or SECONDARY_DETAIL.get(secondary or "", ""),
            "billable_seconds": job.get("BillableTimeInSeconds"),
            "model_artifacts": (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts"),
            "checkpoints": (job.get("CheckpointConfig") or {}).get("S3Uri"),
        }

    def list_jobs(self, *, region: str | None = None, limit: int = 20, **_: Any) -> list[dict[str, Any]]:
        from distrain_cloud.infra import aws

        with aws.translate_errors():
            page = aws.client("sagemaker", aws.region(region)).list_training_jobs(
                SortBy="CreationTime", SortOrder="Descending", MaxResults=min(limit, 100))
        return [{"job_name": j["TrainingJobName"], "status": j["TrainingJobStatus"],
                 "created": str(j.get("CreationTime", "")), "instance": "", "detail": ""}
                for j in page.get("TrainingJobSummaries", [])]

    def logs(self, job_name: str, *, follow: bool = False, region: str | None = None, **_: Any) -> int:
        from distrain_cloud.infra import aws

        region = aws.region(region)
        group = "/aws/sagemaker/TrainingJobs"
        tokens: dict[str, str | None] = {}
        with aws.translate_errors():
            logs_client = aws.client("logs", region)
            while True:
                streams = _log_streams(logs_client, group, job_name)
                for stream in streams:
                    tokens.setdefault(stream, None)
                for stream in sorted(tokens):
                    tokens[stream] = _print_events(logs_client, group, stream, tokens[stream], _host(stream))
                done = self.status(job_name, region=region)["terminal"] if follow else True
                if done:
                    # one last read so nothing written just before the end is lost
                    for stream in sorted(tokens):
                        _print_events(logs_client, group, stream, tokens[stream], _host(stream))
                    return 0
                time.sleep(5)

    def cancel(self, job_name: str, *, region: str | None = None, **_: Any) -> str:
        from distrain_cloud.infra import aws

        info = self.status(job_name, region=region)
        if info["terminal"]:
            return f"{job_name} already ended: {info['status']}"
        if info["status"] == TrainingJobStatus.Stopping.value:
            return f"{job_name} is already stopping"
        with aws.translate_errors():
            aws.client("sagemaker", aws.region(region)).stop_training_job(TrainingJobName=job_name)
        return f"stopping {job_name}: it saves a checkpoint first (distrain-cloud status {job_name})"


def create_training_job_once(request: dict[str, Any], region: str) -> None:
    """CreateTrainingJob, safe to retry: botocore retries a call whose answer was lost, and the
    retry meets `ResourceInUse` for the job the first call made. That is success when the job
    of that name is this request's (same role, image, hyperparameters and checkpoint location);
    any other job of that name is a real conflict."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    sagemaker = aws.client("sagemaker", region)
    try:
        sagemaker.create_training_job(**request)
    except ClientError as exc:
        if aws.error_code(exc) != "ResourceInUse":
            raise
        existing = sagemaker.describe_training_job(TrainingJobName=request["TrainingJobName"])
        if _fingerprint(existing) != _fingerprint(request):
            raise UserError(f"a different training job named {request['TrainingJobName']} already exists; "
                            "submit again (each submit picks a new name) or pass another --name") from exc


def _fingerprint(job: dict[str, Any]) -> tuple[Any, ...]:
    """The parts of a request that DescribeTrainingJob gives back unchanged."""
    algorithm = job.get("AlgorithmSpecification") or {}
    return (job.get("RoleArn"), algorithm.get("TrainingImage"), job.get("HyperParameters") or {},
            (job.get("CheckpointConfig") or {}).get("S3Uri"))


def _role(spec: JobSpec) -> str:
    if not spec.sagemaker.role:
        raise UserError("SageMaker needs an execution role: pass --role NAME_OR_ARN (or sagemaker.role in the "
                        "spec); it must trust sagemaker.amazonaws.com")
    return spec.sagemaker.role


def _offline_identity(spec: JobSpec, unknown_account: str) -> tuple[str, str]:
    """(account, role ARN) as far as they are known without asking AWS."""
    role = _role(spec)
    account = role.split(":")[4] if role.startswith("arn:") else unknown_account
    return account, role if role.startswith("arn:") else f"arn:aws:iam::{account}:role/{role}"


# Which flag or spec key sets each part of the request, so a refusal names what the user wrote.
REQUEST_SOURCES = (
    ("TrainingJobName", "--name"),
    ("RoleArn", "--role"),
    ("AlgorithmSpecification.TrainingImage", "--image-uri"),
    ("HyperParameters", "training flags (hyperparameters: or after --)"),
    ("InputDataConfig", "--input"),
    ("OutputDataConfig", "sagemaker.bucket / sagemaker.prefix"),
    ("CheckpointConfig", "sagemaker.bucket / sagemaker.prefix / --resume-from"),
    ("ResourceConfig.InstanceType", "--instance"),
    ("ResourceConfig.InstanceCount", "--nodes"),
    ("ResourceConfig.VolumeSizeInGB", "sagemaker.volume_size_gb"),
    ("StoppingCondition.MaxRuntimeInSeconds", "--max-run"),
    ("StoppingCondition.MaxWaitTimeInSeconds", "--max-wait"),
    ("VpcConfig", "sagemaker.subnets / sagemaker.security_group_ids"),
    ("Environment", "--secret"),
    ("Tags", "sagemaker.tags"),
)


def refuse_api_problems(request: dict[str, Any]) -> None:
    """Raise one UserError naming the flag or key behind each part of `request` that breaks
    SageMaker's API model."""
    from ..apimodel import problems

    found = problems("sagemaker", "CreateTrainingJob", request)
    if not found:
        return
    parts = []
    for path, problem in found[:3]:
        source = next((src for prefix, src in REQUEST_SOURCES if path.startswith(prefix)), "the planned request")
        parts.append(f"{source}: {path} {problem}")
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    raise UserError("SageMaker would refuse this job, nothing was sent: " + "; ".join(parts) + more)


def _host(stream: str) -> str:
    # "<job>/algo-2-1732600000" -> "algo-2"
    return stream.split("/", 1)[-1].rsplit("-", 1)[0]


def _log_streams(client, group: str, job_name: str) -> list[str]:
    from botocore.exceptions import ClientError

    try:
        out = client.describe_log_streams(logGroupName=group, logStreamNamePrefix=f"{job_name}/")
    except ClientError as e:
        from distrain_cloud.infra.aws import error_code

        if error_code(e) == "ResourceNotFoundException":
            return []  # no logs yet (the job is still starting)
        raise
    return [s["logStreamName"] for s in out.get("logStreams", [])]


def _print_events(client, group: str, stream: str, token: str | None, host: str) -> str | None:
    while True:
        kwargs = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
        if token:
            kwargs["nextToken"] = token
        out = client.get_log_events(**kwargs)
        for event in out.get("events", []):
            print(f"[{host}] {event['message']}", flush=True)
        new = out.get("nextForwardToken")
        if not out.get("events") or new == token:
            return new
        token = new


BACKEND = SageMakerBackend()
