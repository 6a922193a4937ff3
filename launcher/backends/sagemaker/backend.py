"""The SageMaker backend: a training job on the Hugging Face training image.

The plan holds the exact CreateTrainingJob request, and submit sends that request and
nothing else (through infra.aws's one boto3 adaptor). The job runs its own entrypoint: it
unpacks the code bundle (an input channel), resolves secret references, and runs the node
launcher, which starts one process per GPU on every node. The SageMaker training toolkit is
not used, so nothing rewrites the request between the plan and the API.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra import job_role
from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.resources import default_bucket

from ...lease import launched as lineage_launched
from ...plan import Check, JobRef, LeaseTarget, Plan, refuse_failed_checks
from ...tracking import wandb_run
from .. import cloud, refuse_now, wait_for
from . import quotas
from .request import Parts, checkpoint_uri_of, offline_identity, refuse_api_problems
from .request import build as build_request
from .status import TrainingJobStatus, host_of, status_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from distrain_cloud.infra.job_role import JobRole
    from distrain_cloud.infra.stack import StackResources

    from ...logs import LogLine
    from ...spec import JobSpec


@dataclass(frozen=True)
class SageMakerPayload:
    """What a SageMaker plan's submit needs beyond the request, shown nowhere (Plan.payload)."""

    bundle: bytes  # the code bundle's bytes, uploaded at submit unless its key is there
    parts: Parts  # the job's pieces the request is built from (request.py)
    bucket: str  # the bucket of the job's code, output and checkpoints
    code_key: str  # the bundle's key there (its sha256)
    role: JobRole | None  # the job's own role, made at submit; None with --role (the user's, unchanged)


def payload_of(plan: Plan) -> SageMakerPayload:
    """The plan's SageMaker record; a plan of another backend is a bug, said as one."""
    if not isinstance(plan.payload, SageMakerPayload):
        raise TypeError(f"{plan.job_name} is a {plan.backend} plan, not a SageMaker one")
    return plan.payload


def warm_pool(spec: JobSpec, cost: dict[str, Any]) -> str:
    """What the plan says of a SageMaker warm pool (--keep-alive): how long, and what it costs."""
    seconds = spec.sagemaker.keep_alive or 0
    usd = cost.get("keep_alive_usd")
    price = f" (${usd:.2f} if no job reuses it, {cost['basis']})" if usd is not None else ""
    return (
        f"{seconds} s after the job ends, {spec.nodes} x {spec.instance} stay warm for the next job of the same "
        f"instance settings{price}"
    )


class SageMakerBackend:
    name = "sagemaker"
    title = "SageMaker"
    billed = True
    stops_now = False  # StopTrainingJob is the only stop, and it lets the job save
    finds_by_name = True  # DescribeTrainingJob answers for a job submitted from anywhere
    lease_fields: tuple[str, ...] = ("region",)  # DescribeTrainingJob there

    # ------------------------------------------------------------------ plan

    def plan(self, spec: JobSpec) -> Plan:
        """Everything that will be sent, without one AWS call. What only AWS knows (the account,
        so the job role's ARN, the stack's bucket, a previous job's checkpoints) is a placeholder until preflight."""
        from ...bundle import build_bundle
        from ...catalog import lookup
        from .images import choose_training_image

        instance = lookup(spec.instance)
        if not instance.sagemaker:
            raise UserError(f"--instance {spec.instance} is not a SageMaker type; use ml.{spec.instance}")
        region, region_check = cloud.plan_region(spec.region)
        image = choose_training_image(
            instance,
            region,
            image_uri=spec.sagemaker.image_uri,
            transformers_version=spec.sagemaker.transformers_version,
            pytorch_version=spec.sagemaker.pytorch_version,
        )
        training = cloud.plan_training(spec, instance, main_addr="algo-1")
        job_name, precision, processes = training.job_name, training.precision, training.processes
        configs = training.configs

        bundle = build_bundle(cloud.repo_root(), allow_large=spec.bundle.allow_large)
        parts = Parts(
            job_name=job_name,
            region=region,
            image_uri=image.uri,
            hyperparameters=tuple(training.flags.hyperparameters.items()),
            prefix=spec.sagemaker.prefix.strip("/"),
            code_sha256=bundle.sha256,
            lineage=spec.resume_from or job_name,
            max_wait=spec.max_wait or (spec.max_run * 2 if spec.spot else None),
        )
        # Everything the user wrote is in the request now, so a request the API would refuse is
        # refused here, before AWS is asked anything (a well-formed account stands in for theirs).
        refuse_api_problems(build_request(spec, parts, *offline_identity(spec, job_name, "000000000000")))
        account, role_arn = offline_identity(spec, job_name, "<account>")
        checks = [region_check]
        if spec.sagemaker.role:
            checks.append(Check("role exists and trusts SageMaker", None, "checked at submit"))
        if spec.resume_from:
            checks.append(Check(f"resume from {spec.resume_from}", None, "its checkpoints are looked up at submit"))
        checks.append(
            Check(
                "request fits the SageMaker API model",
                True,
                "lengths, ranges, patterns and required fields of CreateTrainingJob",
            )
        )
        checks.append(Check("image runs on the GPU", True, image.reason))
        cost = cloud.estimate_cost(
            instance, region, spec.nodes, spec.max_run, spec.spot, keep_alive=spec.sagemaker.keep_alive or 0
        )
        if spec.max_cost is not None:
            checks.append(cloud.budget_check(spec.max_cost, cost, spec.nodes))
        checks.extend(training.checks)
        plan = Plan(
            backend=self.name,
            job_name=job_name,
            summary={
                "instance": f"{spec.nodes} x {instance.name} ({instance.gpus} x {instance.gpu_model}, "
                f"cc {instance.compute_capability_str})",
                "processes": f"{processes} per node, {training.world_size} in all",
                "strategy": training.strategy,
                "precision": precision,
                "region": region,
                "image": image.uri,
                "image_reason": image.reason,
                "spot": spec.spot,
                **({"keep_alive": warm_pool(spec, cost)} if spec.sagemaker.keep_alive else {}),
            },
            request={},
            configs=configs,
            bundle={"sha256": bundle.sha256, "size": bundle.size, "files": len(bundle.files)},
            cost=cost,
            checks=checks,
            bundle_listing=bundle.listing(),
            spec=spec,
            region=region,
            training=training.flags,
            # Provisional: _place fills in the bucket, the bundle's key and the role.
            payload=SageMakerPayload(bundle=bundle.data, parts=parts, bucket="", code_key="", role=None),
        )
        # With no role the job gets its own (made at submit, under the stack's boundary) and uses the
        # stack's bucket, which only AWS can name.
        bucket = spec.sagemaker.bucket or (None if spec.sagemaker.role else f"<stack-{spec.stack}-bucket>")
        return self._place(plan, account, role_arn, bucket)

    def _place(
        self,
        plan: Plan,
        account: str,
        role_arn: str,
        bucket: str | None,
        checkpoint_uri: str | None = None,
        stack: StackResources | None = None,
    ) -> Plan:
        """The plan with its account-dependent parts filled in: role, bucket, S3 locations. With no
        --role, the job's own role (`stack` fills in what only AWS names; placeholders without)."""
        from ...bundle import bundle_key

        spec, parts = plan.spec, payload_of(plan).parts
        bucket = bucket or default_bucket(account, parts.region)
        code_key = bundle_key(parts.prefix, parts.code_sha256)
        checkpoint_uri = checkpoint_uri or checkpoint_uri_of(bucket, parts)
        role = None if spec.sagemaker.role else _job_role(spec, parts, account, bucket, stack)
        if role is not None:
            role_arn = role.arn
        request = build_request(spec, parts, account, role_arn, bucket, checkpoint_uri)
        wandb = wandb_run(spec, plan.training.args, request["Environment"]) if plan.training else None
        summary = {
            **plan.summary,
            "output": f"s3://{bucket}/{parts.prefix}/jobs/{parts.job_name}/",
            "checkpoints": checkpoint_uri,
            "lineage": parts.lineage,
            "role": f"{role_arn} (this job's own: only its S3 prefixes)"
            if role
            else f"{role_arn} (yours, --role: used unchanged, so the job is not isolated from other jobs)",
            **({"wandb": wandb} if wandb else {}),
        }
        checks = [c for c in plan.checks if not c.name.startswith("job role")]
        configs = dict(plan.configs)
        if role is not None:
            checks.append(_isolation_check(role, parts))
            reach = cloud.secrets_reach_check(
                spec.secrets,
                partition=stack.partition if stack else "aws",
                region=parts.region,
                account=account,
                secret_prefix=stack.secret_prefix if stack else None,
            )
            checks += [reach] if reach else []
            configs["job_role"] = role.shown()
        return dataclasses.replace(
            plan,
            request=request,
            summary=summary,
            checks=checks,
            configs=configs,
            bundle={**(plan.bundle or {}), "s3": f"s3://{bucket}/{code_key}"},
            region=parts.region,
            lease=None
            if checkpoint_uri.startswith("s3://<")  # an account or a stack's bucket only AWS names
            else LeaseTarget(parts.lineage, checkpoint_uri, parts.region, submit_creates=bucket),
            payload=dataclasses.replace(payload_of(plan), bucket=bucket, code_key=code_key, role=role),
        )

    def preflight(self, plan: Plan) -> Plan:
        """The plan checked against AWS (read-only calls): region, account, the role (--role's, or
        the job's own), the bucket, a resumed job's checkpoints, the instance quota."""
        from distrain_cloud.infra import aws, resources

        spec, parts = plan.spec, payload_of(plan).parts
        region = aws.region(spec.region)  # a real submit needs a configured region, not an assumed one
        if region != parts.region:
            raise UserError(f"the plan was made for {parts.region} but the region is {region}; plan again")
        checks = [c for c in plan.checks if c.ok is not None]
        bucket = spec.sagemaker.bucket
        stack = None
        with aws.translate_errors():
            account = aws.account_id(region)
            if spec.sagemaker.role:
                role_arn = resources.check_role(spec.sagemaker.role, region=region)
                checks.append(Check("role exists and trusts SageMaker", True, role_arn))
            else:  # the job's own role, made at submit (_place names it)
                stack = _stack_resources(spec.stack, region)
                role_arn, bucket = "", bucket or stack.bucket
        checkpoint_uri = None
        if spec.resume_from:
            checkpoint_uri, lineage = _previous_checkpoints(spec.resume_from, region, checks)
            # The plan guessed the job it resumes; a resumed job's lineage is that job's own.
            parts = dataclasses.replace(parts, lineage=lineage)
            plan = dataclasses.replace(plan, payload=dataclasses.replace(payload_of(plan), parts=parts))
        placed = self._place(dataclasses.replace(plan, checks=checks), account, role_arn, bucket, checkpoint_uri, stack)
        checks = placed.checks
        refuse_api_problems(placed.request)  # the looked-up parts too (a previous job's checkpoint URI)
        checks.append(cloud.bucket_check(payload_of(placed).bucket, region, named_by_user=bool(spec.sagemaker.bucket)))
        if stack is not None:  # the job's own role: it reads its inputs on a `/` boundary
            checks += input_prefix_checks(spec.inputs, stack.bucket, region)
        checks += quotas.sagemaker_checks(spec, region)  # counts in-progress jobs; --keep-alive's warm pool
        return dataclasses.replace(placed, checks=checks)

    # ------------------------------------------------------------------ act

    def submit(self, plan: Plan, *, wait: bool = False) -> int:
        payload = payload_of(plan)
        region = payload.parts.region
        refuse_failed_checks(plan)
        uploaded = cloud.upload_code(region, payload.bucket, payload.code_key, payload.bundle)
        from distrain_cloud.infra import aws

        role = payload.role
        if role is not None:
            job_role.create(role)
        try:
            with aws.translate_errors():
                job_role.retry_while_propagating(
                    lambda: create_training_job_once(plan.request, region), _role_not_yet_assumable
                )
        except BaseException:
            if role is not None:
                cloud.retire_role_quietly(role.name)  # no job was made: its role goes too
            raise
        lineage_launched(plan)  # the job exists: the lineage's lease stays its own whatever follows
        print(f"submitted {plan.job_name} (code bundle {'uploaded' if uploaded else 'already in S3'})", file=sys.stderr)
        print(f"next: distrain-cloud logs {plan.job_name} --follow --region {region}", file=sys.stderr)
        if wait:
            return wait_for(self, JobRef(plan.job_name, self.name, region))
        return 0

    # ------------------------------------------------------------------ lifecycle

    def holder_state(self, holder: dict[str, Any]) -> tuple[bool, str] | None:
        """(ended, status) of the job holding a lineage's lease (launcher/lease.py); None when
        SageMaker has no such job (yet)."""
        from botocore.exceptions import ClientError

        from distrain_cloud.infra import aws

        with aws.translate_errors():
            try:
                job = aws.client("sagemaker", holder["region"]).describe_training_job(TrainingJobName=holder["job"])
            except ClientError as e:
                # SageMaker's answer for a job it does not have: ValidationException "Requested resource not
                # found" (moto's: "Could not find training job")
                said = str(e).lower()
                if aws.error_code(e) == "ValidationException" and ("not found" in said or "could not find" in said):
                    return None
                raise
        info = status_of(holder["job"], job)
        return bool(info["terminal"]), str(info["status"])

    def status(self, job: JobRef) -> dict[str, Any]:
        from distrain_cloud.infra import aws

        with aws.translate_errors():
            described = aws.client("sagemaker", aws.region(job.region)).describe_training_job(TrainingJobName=job.name)
        info = status_of(job.name, described)
        if info["terminal"] and _own_role(job.name, str(described.get("RoleArn", ""))):
            cloud.retire_role_quietly(job.name)  # the job ended: nothing uses its role any more
        return info

    def list_jobs(self, *, region: str | None, workdir: Path, limit: int) -> list[dict[str, Any]]:
        from distrain_cloud.infra import aws

        with aws.translate_errors():
            page = aws.client("sagemaker", aws.region(region)).list_training_jobs(
                SortBy="CreationTime", SortOrder="Descending", MaxResults=min(limit, 100)
            )
        return [
            {
                "job_name": j["TrainingJobName"],
                "backend": self.name,
                "status": j["TrainingJobStatus"],
                "created": str(j.get("CreationTime", "")),
                "instance": "",
                "detail": "",
            }
            for j in page.get("TrainingJobSummaries", [])
        ]

    def log_lines(self, job: JobRef, *, follow: bool = False) -> Iterator[LogLine]:
        from distrain_cloud.infra import aws

        group = "/aws/sagemaker/TrainingJobs"
        done = (lambda: bool(self.status(job)["terminal"])) if follow else (lambda: True)
        return cloud.log_lines(aws.region(job.region), group, job.name, host_of, done)

    def cancel(self, job: JobRef, *, now: bool = False) -> str:
        """StopTrainingJob: SageMaker sends the job SIGTERM and it saves a checkpoint on the way
        out. There is no stopping it at once (`now`): refused, nothing sent."""
        from distrain_cloud.infra import aws

        if now:
            refuse_now(self, job)
        job_name, info = job.name, self.status(job)
        if info["terminal"]:
            return f"{job_name} already ended: {info['status']}"
        if info["status"] == TrainingJobStatus.Stopping.value:
            return f"{job_name} is already stopping"
        with aws.translate_errors():
            aws.client("sagemaker", aws.region(job.region)).stop_training_job(TrainingJobName=job_name)
        return f"stopping {job_name}: it saves a checkpoint first (distrain-cloud status {job_name})"

    def find(self, name: str, region: str | None) -> JobRef | None:
        """The training job `name` in `region` (one DescribeTrainingJob): a job submitted from
        another machine. SageMaker's "not found" (moto's "could not find") is None; any other
        error (no credentials after --region, denied, throttled) is the lookup's answer."""
        from distrain_cloud.infra import aws

        region = aws.region(region)
        try:
            with aws.translate_errors():
                aws.client("sagemaker", region).describe_training_job(TrainingJobName=name)
        except UserError as e:
            if aws.error_code(e.__cause__) not in ("ValidationException", "ValidationError"):
                raise
            return None
        return JobRef(name, self.name, region)

    def fetch_outputs(self, job: JobRef, dest: Path) -> dict[str, Any]:
        """The job's output folder reaches S3 as one archive when the job ends:
        <S3OutputPath>/<job>/output/output.tar.gz (the model is model.tar.gz beside it: too big
        to fetch for a report)."""
        from distrain_cloud.infra import aws

        region = aws.region(job.region)
        with aws.translate_errors():
            described = aws.client("sagemaker", region).describe_training_job(TrainingJobName=job.name)
        root = described["OutputDataConfig"]["S3OutputPath"].rstrip("/")
        output = f"{root}/{job.name}/output/output.tar.gz"
        return cloud.fetch_outputs(job.name, status_of(job.name, described), region, dest, output=output)


def _previous_checkpoints(job_name: str, region: str, checks: list[Check]) -> tuple[str | None, str]:
    """(checkpoint URI, lineage) of the job a new one resumes: its lineage is the first job of
    the chain, which its environment names (a job submitted before it did is its own lineage's first)."""
    from distrain_cloud.infra import aws

    with aws.translate_errors():
        job = aws.client("sagemaker", region).describe_training_job(TrainingJobName=job_name)
    previous = (job.get("CheckpointConfig") or {}).get("S3Uri")
    checks.append(Check(f"resume from {job_name}", bool(previous), previous or "it had no checkpoints"))
    return previous, (job.get("Environment") or {}).get("DISTRAIN_LINEAGE") or job_name


def _job_role(spec: JobSpec, parts: Parts, account: str, bucket: str, stack: StackResources | None) -> JobRole:
    """The job's own IAM role: its S3 prefixes (its bundle, secrets and input channels read-only),
    nothing of another job's."""
    from ...bundle import bundle_key

    return cloud.refuse_role_problems(
        job_role.for_job_at(
            "sagemaker",
            partition=stack.partition if stack else "aws",
            region=parts.region,
            account=account,
            stack=spec.stack,
            bucket=bucket,
            prefix=parts.prefix,
            job=parts.job_name,
            lineage=parts.lineage,
            boundary_arn=stack.job_boundary_arn if stack else f"<stack {spec.stack}'s JobBoundary policy>",
            code_key=bundle_key(parts.prefix, parts.code_sha256),
            secrets=spec.secrets.values(),
            inputs=spec.inputs.values(),
        )
    )


def _isolation_check(role: JobRole, parts: Parts) -> Check:
    own = f"{parts.prefix}/jobs/{parts.job_name}/, {parts.prefix}/checkpoints/{parts.lineage}/"
    return Check(
        "job role isolates the job",
        True,
        f"{role.path}{role.name}: {own} (read-write), its own code bundle, secrets and inputs (read); made at submit",
    )


def _role_not_yet_assumable(e: Exception) -> bool:
    """CreateTrainingJob's answer while SageMaker cannot yet assume a role IAM just made."""
    from distrain_cloud.infra import aws

    message = aws.error_message(e).lower()
    return aws.error_code(e) == "ValidationException" and "assume" in message and "role" in message


def _own_role(job_name: str, role_arn: str) -> bool:
    """Whether `role_arn` is the role the launcher made for this job (never a --role of the user's)."""
    resource = role_arn.split(":", 5)[-1]
    return resource.startswith(f"role{job_role.PATH_ROOT}") and resource.rsplit("/", 1)[-1] == job_name


def input_prefix_checks(inputs: dict[str, str], bucket: str, region: str) -> list[Check]:
    """SageMaker reads every key that starts with an S3Prefix channel's URI (`.../data` reads
    `data-old/x` too: SageMaker API Reference, S3DataSource, S3Uri), while the job's own role
    reads an input only as the key itself and the keys under `key/` (infra/job_role.py). A channel
    whose prefix names other keys too would stop the job with AccessDenied after it started, and
    was billed: found here by one listing per channel in the stack's bucket without a final `/`."""
    from botocore.exceptions import BotoCoreError, ClientError

    from distrain_cloud.infra import aws

    from ...logs import one_line

    checks = []
    for name, uri in inputs.items():
        if not uri.startswith(f"s3://{bucket}/") or uri.endswith("/"):
            continue
        key = uri.removeprefix(f"s3://{bucket}/")
        try:
            page = aws.client("s3", region, max_attempts=2).list_objects_v2(
                Bucket=bucket, Prefix=key, Delimiter="/", MaxKeys=100
            )
        except (BotoCoreError, ClientError) as e:
            checks.append(Check(f"--input {name} reads only its own keys", None, f"not checked ({aws.error_code(e)})"))
            continue
        # `key` itself and the folder `key/`; anything else the listing names is a key beside them.
        beside = [str(o.get("Key")) for o in page.get("Contents", []) if o.get("Key") != key]
        beside += [str(p.get("Prefix")) for p in page.get("CommonPrefixes", []) if p.get("Prefix") != f"{key}/"]
        if beside:
            detail = (
                f"{uri}: SageMaker reads every key that starts with {key!r}, and {one_line(beside[0], 120)!r}"
                f"{' and more' if len(beside) > 1 else ''} is beyond what the job's role may read (AccessDenied once "
                f"the job runs); name the folder: --input {name}=s3://{bucket}/{key}/"
            )
            checks.append(Check(f"--input {name} reads only its own keys", False, detail))
        else:
            checks.append(Check(f"--input {name} reads only its own keys", True, uri))
    return checks


def _stack_resources(stack: str, region: str) -> Any:
    from distrain_cloud.infra import stack as stacks

    try:
        return stacks.resources(stack, region)
    except UserError as e:
        raise UserError(f"{e} (or pass --role NAME_OR_ARN to use a role of your own)") from None


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
            raise UserError(
                f"a different training job named {request['TrainingJobName']} already exists; "
                "submit again (each submit picks a new name) or pass another --name"
            ) from exc


def _fingerprint(job: dict[str, Any]) -> tuple[Any, ...]:
    """The parts of a request that DescribeTrainingJob gives back unchanged."""
    algorithm = job.get("AlgorithmSpecification") or {}
    return (
        job.get("RoleArn"),
        algorithm.get("TrainingImage"),
        job.get("HyperParameters") or {},
        (job.get("CheckpointConfig") or {}).get("S3Uri"),
    )


BACKEND = SageMakerBackend()
