"""The EC2 backend: N GPU instances from one RunInstances call, one process per GPU on each.

The plan holds the exact RunInstances request, its user data and the job description the nodes
read; submit uploads the code bundle, writes the job description to S3, then sends that one
request (all N nodes or none). Each node's user data checks the bundle's sha256 and hands over
to the node agent inside it (training/node_agent.py), which finds its peers through S3, trains,
syncs checkpoints, reports in `nodes/<rank>.json` and terminates its own instance. The S3 layout
and records are the contract between launcher and node agent (docs/ec2.md).

What only AWS can name (the stack's bucket, instance profile and security group, the AMI id, a
subnet, a resumed job's lineage) is a placeholder until preflight fills it in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra import job_role
from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.stack import ALIVE_STATES, STACK_TAG
from distrain_cloud.training.strategies import AUTO, parse_strategy

from .. import recovery
from ..bootstrap import ec2_user_data
from ..jobs import JobRef
from ..lease import launched as lineage_launched
from ..plan import Check, Plan, refuse_failed_checks
from ..tracking import tracking_env, wandb_run
from . import cloud, wait_for

if TYPE_CHECKING:
    from distrain_cloud.infra.job_role import JobRole
    from distrain_cloud.infra.stack import StackResources

    from ..catalog import AmiFamily, InstanceType
    from ..logs import LogLine
    from ..spec import JobSpec

TAG_PREFIX = "distrain-cloud:"
USER_DATA_LIMIT = 16 * 1024  # bytes, before base64 (EC2's limit; moto accepts more)
CLIENT_TOKEN_LIMIT = 64
MAIN_PORT = 29500
RENDEZVOUS_TIMEOUT_S = 600
HARD_STOP_GRACE_MIN = 10  # the hard stop comes this long after max_run: the agent stops first
LAUNCH_GRACE_S = 600  # a job this young with no instance visible yet is still launching
# How long a graceful cancel waits for each live instance's agent to answer the stop marker (a new
# record: an agent of this version writes one at once, an older one within its 30 s heartbeat,
# after polling every 5 s) before it terminates that instance itself.
CANCEL_ANSWER_S = 45
CANCEL_POLL_S = 3
# A cluster placement group is one zone's capacity, launched all or nothing: past this many
# nodes such a launch rarely finds room (our choice, not an AWS limit; docs/ec2.md).
PLACEMENT_GROUP_MAX_NODES = 16
# Service Quotas codes of EC2's vCPU quotas: (instance class, spot) -> code.
VCPU_QUOTAS = {
    ("G and VT", False): "L-DB2E81BA",
    ("P", False): "L-417A185B",
    ("Standard", False): "L-1216C47A",
    ("G and VT", True): "L-3819A6DF",
    ("P", True): "L-7212CCBC",
    ("Standard", True): "L-34B43A08",
}
SPOT_TERMINATION = "Server.SpotInstanceTermination"
_UNIQUE_NAME = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{6}$")


class Ec2JobStatus(str, Enum):
    InProgress = "InProgress"
    Completed = "Completed"
    Failed = "Failed"
    Interrupted = "Interrupted"  # spot capacity reclaimed; `resume` continues from the checkpoints
    Stopped = "Stopped"  # cancel or deadline; checkpoints saved
    Lost = "Lost"  # the instances ended and left no record


TERMINAL = frozenset(s for s in Ec2JobStatus if s is not Ec2JobStatus.InProgress)
# When nodes disagree, the job's status is the first of these any node reports.
_PRECEDENCE = ("Failed", "Interrupted", "Stopped", "Completed")

# Which flag or spec key sets each part of the request, so a refusal names what the user wrote.
REQUEST_SOURCES = (
    ("ImageId", "ec2.ami_id / ec2.ami_parameter"),
    ("InstanceType", "--instance"),
    ("MinCount", "--nodes"),
    ("MaxCount", "--nodes"),
    ("ClientToken", "--name"),
    ("UserData", "the rendered user data"),
    ("IamInstanceProfile", "--stack"),
    ("SecurityGroupIds", "--stack"),
    ("SubnetId", "ec2.subnet_id"),
    ("NetworkInterfaces", "ec2.subnet_id / ec2.efa"),
    ("Placement", "ec2.placement"),
    ("BlockDeviceMappings", "ec2.volume_size_gb"),
    ("TagSpecifications", "--name / --stack"),
    ("InstanceMarketOptions", "--spot"),
)


@dataclasses.dataclass(frozen=True)
class _Parts:
    """What the request is made of besides AWS's answers, fixed at plan time (the job name above all)."""

    job_name: str
    region: str
    instance_type: str
    nodes: int
    processes_per_node: int
    argv: tuple[str, ...]
    secrets: tuple[tuple[str, str], ...]
    prefix: str
    code_sha256: str
    family: AmiFamily
    ami_parameter: str
    spot: bool
    max_run: int
    submitted: float
    efa: bool  # an EFA interface per node
    placement: bool  # the stack's placement group, if it has one
    volume_size_gb: int
    requirements: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Where:
    """What only AWS can name; placeholders (in <angle brackets>) until preflight."""

    stack: str
    bucket: str
    instance_profile: str
    security_group: str
    log_group: str
    ami_id: str
    root_device: str
    subnets: tuple[str, ...]  # the first is tried first; the others are other zones
    placement_group: str | None
    lineage: str
    attempt: int
    checkpoint_uri: str
    # For the job's own role (infra/job_role.py): what only AWS names, placeholders until preflight.
    account: str = "<account>"
    partition: str = "aws"
    boundary: str = "<stack job role boundary>"
    secret_prefix: str = "distrain-cloud/"
    ssm: bool = False

    @property
    def resolved(self) -> bool:
        return not self.ami_id.startswith("<")


class Ec2Backend:
    name = "ec2"

    # ------------------------------------------------------------------ plan

    def plan(self, spec: JobSpec) -> Plan:
        """Everything that will be sent, without one AWS call."""
        from ..bundle import build_bundle, bundle_key
        from ..catalog import ami_family, lookup
        from .sagemaker import repo_root

        instance = lookup(spec.instance)
        if instance.sagemaker:
            raise UserError(f"--instance {spec.instance} is a SageMaker type; EC2 types have no ml. prefix")
        if not instance.is_gpu and spec.strategy != AUTO and parse_strategy(spec.strategy).uses_deepspeed:
            raise UserError(
                f"--strategy {spec.strategy} needs GPUs and --instance {instance.name} has none: "
                "pick a GPU type (see `distrain-cloud instances`) or --strategy ddp"
            )
        if spec.inputs:
            raise UserError(
                "--input: EC2 nodes do not download input channels yet; use a SageMaker type (ml.*) for channels"
            )
        family = ami_family(instance, spec.ec2.ami_family, spec.ec2.ami_parameter)
        efa = instance.efa and spec.nodes > 1 and spec.ec2.efa
        placement = spec.nodes > 1 and spec.ec2.placement
        if placement and spec.nodes > PLACEMENT_GROUP_MAX_NODES:
            raise UserError(
                f"--nodes {spec.nodes}: a cluster placement group launches at most {PLACEMENT_GROUP_MAX_NODES} "
                "nodes here (one zone, all or nothing); use fewer, larger instances, or set ec2.placement: false"
            )
        region, region_check = cloud.plan_region(spec.region)
        training = cloud.plan_training(
            spec, instance, main_addr="<node 0's private IP, from the rendezvous>", main_port=MAIN_PORT
        )
        job_name, precision, argv, processes = training.job_name, training.precision, training.argv, training.processes
        configs = training.configs

        bundle = build_bundle(repo_root(), allow_large=spec.bundle.allow_large)
        parts = _Parts(
            job_name=job_name,
            region=region,
            instance_type=instance.name,
            nodes=spec.nodes,
            processes_per_node=processes,
            argv=tuple(argv),
            secrets=tuple(sorted(spec.secrets.items())),
            prefix=spec.ec2.prefix.strip("/"),
            code_sha256=bundle.sha256,
            family=family,
            ami_parameter=spec.ec2.ami_parameter or family.ssm_parameter,
            spot=spec.spot,
            max_run=spec.max_run,
            submitted=time.time(),
            efa=efa,
            placement=placement,
            volume_size_gb=spec.ec2.volume_size_gb,
            requirements=tuple(train_requirements()),
        )
        stack = spec.stack
        where = _Where(
            stack=stack,
            bucket=f"<stack-{stack}-bucket>",
            instance_profile=job_name,  # the job's own (its role's name), made at submit
            security_group=f"<stack {stack} security group>",
            log_group=f"<stack {stack} log group>",
            ami_id=spec.ec2.ami_id or f"<newest AMI from {parts.ami_parameter}>",
            root_device=family.root_device,
            subnets=(spec.ec2.subnet_id or f"<a default subnet of stack {stack}'s VPC>",),
            placement_group=f"<stack {stack} placement group, if any>" if placement else None,
            lineage=f"<lineage of {spec.resume_from}>" if spec.resume_from else job_name,
            attempt=0 if spec.resume_from else 1,
            checkpoint_uri="",
            boundary=f"<stack {stack}'s JobBoundary policy>",
        )
        checks = [region_check]
        checks.append(
            Check(
                "AMI drives the GPU",
                True,
                f"{family.description}" + (f": NVIDIA driver for {instance.gpu_model}" if instance.gpus else ""),
            )
        )
        on = training.hardware if instance.gpus else "CPU"
        checks.append(Check("precision fits the GPU", True, f"{precision} ({on})"))
        checks.append(training.fit)
        checks.append(Check(f"stack {stack}", None, "its bucket, security group and job role boundary, at submit"))
        if spec.ec2.ami_id:
            checks.append(Check("AMI", None, f"{spec.ec2.ami_id} is described at submit"))
        else:
            checks.append(Check("AMI", None, f"the newest from {parts.ami_parameter}, at submit"))
        if placement:
            checks.append(Check("cluster placement group", None, f"stack {stack}'s, if it has one, at submit"))
        if efa:
            checks.append(Check("EFA", True, f"{instance.name} supports it: one EFA interface per node"))
        if spec.resume_from:
            checks.append(Check(f"resume from {spec.resume_from}", None, "its lineage and checkpoints, at submit"))
        cost = cloud.estimate_cost(instance, region, spec.nodes, spec.max_run, spec.spot)
        if spec.max_cost is not None:
            checks.append(cloud.budget_check(spec.max_cost, cost, spec.nodes))
        plan = Plan(
            backend=self.name,
            job_name=job_name,
            summary={
                "instance": f"{spec.nodes} x {instance.name} ({_hardware(instance)})",
                "processes": f"{processes} per node, {training.world_size} in all",
                "strategy": training.strategy,
                "precision": precision,
                "region": region,
                "ami_family": family.name,
                "spot": spec.spot,
            },
            request={},
            configs=configs,
            bundle={"sha256": bundle.sha256, "size": bundle.size, "files": len(bundle.files)},
            cost=cost,
            checks=checks,
            payload={
                "bundle": bundle.data,
                "bundle_listing": bundle.listing(),
                "spec": spec,
                "parts": parts,
                "code_key": bundle_key(parts.prefix, bundle.sha256),
            },
        )
        return self._place(plan, where)

    def _place(self, plan: Plan, where: _Where) -> Plan:
        """The plan with `where` rendered into the job description, user data and request, and
        the checks that depend on them (size, secrets, the API model) redone."""
        parts: _Parts = plan.payload["parts"]
        where = dataclasses.replace(where, checkpoint_uri=where.checkpoint_uri or _checkpoint_uri(where, parts))
        description = job_description(parts, where, plan.payload["spec"])
        role = _job_role(parts, where)
        description["role"] = role.name  # beyond the contract: `status` deletes it once the job ended
        spec = plan.payload["spec"]
        if recovery.wanted(spec):  # a spot lineage the AWS side keeps going (launcher/recovery.py)
            description["recovery"] = recovery.description_block(parts.job_name, parts.nodes, spec)
        # The bytes submit uploads, hashed here so the user data can pin them (a job.json rewritten
        # after submit is refused by every node before it trusts any of it).
        job_json = json.dumps(description, indent=2).encode()
        user_data = ec2_user_data(
            job=parts.job_name,
            attempt=where.attempt,
            region=parts.region,
            bucket=where.bucket,
            job_prefix=_job_prefix(parts.prefix, parts.job_name),
            code_key=plan.payload["code_key"],
            code_sha256=parts.code_sha256,
            job_sha256=hashlib.sha256(job_json).hexdigest(),
            hard_stop_minutes=math.ceil(parts.max_run / 60) + HARD_STOP_GRACE_MIN,
            # A recovering lineage's replacements boot later: its hard stop is one moment for all.
            hard_stop_at=_hard_stop_at(parts) if recovery.wanted(spec) else None,
            python=parts.family.python,
            torch=parts.family.torch,
            requirements=parts.requirements,
        )
        request = run_instances_request(parts, where, user_data)
        refuse_api_problems(request)
        lineage_requests = None
        if recovery.wanted(spec):
            tags = request["TagSpecifications"][0]["Tags"][:2]  # the stack and job tags
            lineage_requests = recovery.requests(
                request, name=parts.job_name, nodes=parts.nodes, subnets=where.subnets, deadline=_hard_stop_at(parts),
                tags=tags,
            )  # fmt: skip
            recovery.refuse_problems(lineage_requests, description["recovery"])
        checks = [c for c in plan.checks if not c.name.startswith(("user data", "request fits", "job role"))]
        checks.append(_isolation_check(role, parts, where))
        checks.append(_user_data_size_check(user_data))
        checks.append(_secret_free_check(user_data, description, dict(parts.secrets)))
        checks.append(Check("request fits the EC2 API model", True, "required fields, types and enums of RunInstances"))
        if lineage_requests:
            checks.append(Check("request fits the EC2 API model", True, "the launch template and Auto Scaling group"))
        wandb = wandb_run(plan.payload["spec"], list(parts.argv), description["env"])
        summary = {
            **plan.summary,
            "output": description["output_uri"],
            "checkpoints": where.checkpoint_uri,
            "lineage": f"{where.lineage}, attempt {where.attempt or '<next>'}",
            **({"wandb": wandb} if wandb else {}),
            **({"recovery": recovery.summary(spec)} if lineage_requests else {}),
        }
        return dataclasses.replace(
            plan,
            request=request,
            summary=summary,
            checks=checks,
            configs={
                **plan.configs,
                "job.json": description,
                "user_data": user_data.splitlines(),
                "job_role": role.shown(),
                **({"recovery": lineage_requests} if lineage_requests else {}),
            },
            bundle={**(plan.bundle or {}), "s3": f"s3://{where.bucket}/{plan.payload['code_key']}"},
            payload={
                **plan.payload,
                "where": where,
                "role": role,
                "description": description,
                "job_json": job_json,
                "region": parts.region,
                "bucket": where.bucket,
                # in the local job record: where status, logs and resume find the job again
                "record": {"stack": where.stack, "bucket": where.bucket, "prefix": parts.prefix},
                **({"recovery": lineage_requests} if lineage_requests else {}),
            },
        )

    def preflight(self, plan: Plan) -> Plan:
        """The plan checked against AWS (read-only calls): the stack's resources, the AMI, a
        subnet (and other zones'), a resumed job's lineage, the bucket, the vCPU quota."""
        from distrain_cloud.infra import aws

        spec: JobSpec = plan.payload["spec"]
        parts: _Parts = plan.payload["parts"]
        region = aws.region(spec.region)  # a real submit needs a configured region, not an assumed one
        if region != parts.region:
            raise UserError(f"the plan was made for {parts.region} but the region is {region}; plan again")
        checks = [c for c in plan.checks if c.ok is not None]
        stack = stack_resources(spec.stack, region)
        checks.append(
            Check(f"stack {spec.stack}", True, f"bucket {stack.bucket}, security group {stack.security_group_id}")
        )
        with aws.translate_errors():
            ami_id = spec.ec2.ami_id or resolve_ami(parts.ami_parameter, region)
            root_device = _check_image(ami_id, region, plan, checks)
            subnets = _subnets(spec.ec2.subnet_id, stack.security_group_id, region, checks)
            lineage, attempt, checkpoint_uri = parts.job_name, 1, ""
            if spec.resume_from:
                lineage, attempt, checkpoint_uri = _previous_attempt(spec.resume_from, stack.bucket, parts, checks)
        placement_group = None
        if parts.placement:
            placement_group = stack.placement_group
            checks.append(
                Check(
                    "cluster placement group",
                    True,
                    placement_group
                    or f"stack {spec.stack} has none (`infra up --parameter EnablePlacementGroup=true`)",
                )
            )
        where = _Where(
            stack=spec.stack,
            bucket=stack.bucket,
            instance_profile=parts.job_name,
            security_group=stack.security_group_id,
            log_group=stack.log_group,
            ami_id=ami_id,
            root_device=root_device or parts.family.root_device,
            subnets=subnets,
            placement_group=placement_group,
            lineage=lineage,
            attempt=attempt,
            checkpoint_uri=checkpoint_uri,
            account=stack.account,
            partition=stack.partition,
            boundary=stack.job_boundary_arn,
            secret_prefix=stack.secret_prefix,
            ssm=stack.ssm,
        )
        placed = self._place(dataclasses.replace(plan, checks=checks), where)
        extra = [
            cloud.bucket_check(
                stack.bucket,
                region,
                named_by_user=True,
                fix="the stack's bucket is gone: run `distrain-cloud infra up`",
            ),
            _quota_check(spec, region),
        ]
        return dataclasses.replace(placed, checks=placed.checks + extra)

    # ------------------------------------------------------------------ act

    def submit(self, plan: Plan, *, wait: bool = False) -> int:
        from distrain_cloud.infra import aws

        where: _Where = plan.payload["where"]
        if not where.resolved:
            raise UserError("this plan was not checked against AWS (preflight); plan it again without --dry-run")
        refuse_failed_checks(plan)
        uploaded = cloud.upload_code(plan)
        parts: _Parts = plan.payload["parts"]
        key = f"{_job_prefix(parts.prefix, parts.job_name)}/job.json"
        role: JobRole = plan.payload["role"]
        job_role.create(role)  # the job's own identity first: nothing below runs without it
        try:
            with aws.translate_errors():
                # Written before RunInstances: every instance that may exist has its description. The
                # launcher's own copy (out of the job role's reach) is what status and resume trust;
                # the job's copy is what its nodes read, pinned by its sha256 in the user data.
                s3 = aws.client("s3", parts.region)
                for at in (submitted_key(parts.prefix, parts.job_name), key):
                    s3.put_object(
                        Bucket=where.bucket,
                        Key=at,
                        Body=plan.payload["job_json"],  # exactly the bytes whose sha256 the user data pins
                        ContentType="application/json",
                    )
            ids = recovery.launch(plan) if recovery.planned(plan) else launch(plan.request, where, parts)
        except BaseException:
            _retire_quietly(role.name)  # nothing was launched: its role goes too
            raise
        lineage_launched(plan)  # the instances exist: the lineage's lease stays theirs whatever follows
        print(
            f"submitted {plan.job_name}: {parts.nodes} x {parts.instance_type} ({', '.join(ids)}); "
            f"code bundle {'uploaded' if uploaded else 'already in S3'}",
            file=sys.stderr,
        )
        print(f"next: distrain-cloud logs {plan.job_name} --follow --region {parts.region}", file=sys.stderr)
        if not wait:
            return 0
        if recovery.planned(plan):  # AWS relaunches it: follow the lineage to its end
            return wait_for(self, JobRef(plan.job_name, self.name, parts.region))
        return self._wait(JobRef(plan.job_name, self.name, parts.region), plan.payload["spec"])

    def _wait(self, job: JobRef, spec: JobSpec) -> int:
        """Follow the job; a spot job that was interrupted is resumed on new instances (a new
        attempt of its lineage) until --max-wait has passed since the first submit."""
        from ..api import plan_job, resume_spec, submit_job

        until = time.time() + (spec.max_wait or spec.max_run * 2)
        while True:
            code = wait_for(self, job)
            if not spec.spot or self.status(job)["status"] != Ec2JobStatus.Interrupted.value:
                return code
            if time.time() >= until:
                print(f"{job.name} was interrupted and --max-wait has passed: not relaunched", file=sys.stderr)
                return code
            print(f"{job.name}: spot capacity was reclaimed; resuming from its checkpoints", file=sys.stderr)
            plan = plan_job(resume_spec(job))
            submit_job(plan)
            job = JobRef(plan.job_name, self.name, job.region)

    # ------------------------------------------------------------------ lifecycle

    def status(self, job: JobRef) -> dict[str, Any]:
        return self._status(job, *described(job))

    def _status(
        self, job: JobRef, region: str, bucket: str, prefix: str, description: dict[str, Any]
    ) -> dict[str, Any]:
        from distrain_cloud.infra import aws

        if recovery.is_lineage(description):
            info = recovery.lineage_status(job.name, region, bucket, prefix, description)
            recovery.retire_when_done(region, job.name, info)
            retire_role_when_done(job.name, description, info, [{"state": s} for s in info["instances"].values()])
            return info
        with aws.translate_errors():
            found = job_files(aws.client("s3", region), bucket, prefix, job.name)
        instances = tagged_instances(region, job.name).get(job.name, [])
        info = job_status(description, found, instances, now=time.time())
        retire_role_when_done(job.name, description, info, instances)
        return info

    def list_jobs(self, *, region: str | None, workdir: Path, limit: int) -> list[dict[str, Any]]:
        from distrain_cloud.infra import aws

        from ..logs import printable

        region = aws.region(region)
        rows = []
        with aws.translate_errors():
            s3 = aws.client("s3", region)
            instances = tagged_instances(region)
            names: list[tuple[str, str, str]] = []
            for bucket, prefix in _places(region):
                names += [(n, bucket, prefix) for n in _job_names(s3, bucket, prefix)]
            names.sort(key=lambda item: _created_key(item[0]), reverse=True)
            for name, bucket, prefix in names[:limit]:
                try:
                    description = read_description(s3, bucket, prefix, name)
                    if description is None:
                        continue
                    found = job_files(s3, bucket, prefix, name)
                except UserError as e:  # one broken job must not hide the others
                    print(printable(f"note: skipped EC2 job {name}: {e}"), file=sys.stderr)
                    continue
                info = job_status(description, found, instances.get(name, []), now=time.time())
                if recovery.is_lineage(description):  # one row for the whole lineage
                    info = recovery.lineage_status(name, region, bucket, prefix, description)
                if instances.get(name):  # ended within the hour EC2 still lists its instances
                    retire_role_when_done(name, description, info, instances[name])
                rows.append({**info, "backend": self.name})
        return recovery.one_row_per_lineage(rows)

    def log_lines(self, job: JobRef, *, follow: bool = False) -> Iterator[LogLine]:
        region, bucket, prefix, description = described(job)
        if not description.get("log_group"):
            where = f"s3://{bucket}/{_job_prefix(prefix, job.name)}/job.json"
            raise bad_record(where, "it names no log group, so its logs cannot be found")
        done: Callable[[], bool] = (lambda: bool(self.status(job)["terminal"])) if follow else (lambda: True)
        return cloud.log_lines(region, description["log_group"], job.name, lambda s: s.split("/", 1)[-1], done)

    def cancel(self, job: JobRef) -> str:
        """Graceful: the stop marker every node agent watches; each node checkpoints, uploads and ends.

        Only a live agent acts on the marker, so cancel waits up to CANCEL_ANSWER_S for each live
        instance's agent to answer (its record moves) and terminates those that did not: with the
        laptop closed right after, nothing is left waiting for the hard stop (max-run + 10 min)."""
        from distrain_cloud.infra import aws

        region, bucket, prefix, description = described(job)
        if recovery.is_lineage(description):
            return recovery.cancel(job)
        s3 = aws.client("s3", region)
        info = self._status(job, region, bucket, prefix, description)
        alive = sorted(i for i, state in info["instances"].items() if state in ALIVE_STATES)
        if info["terminal"]:
            if not alive:
                return f"{job.name} already ended: {info['status']}"
            _terminate(region, alive)  # no agent is left to end them (a node that never started, say)
            return f"{job.name} already ended ({info['status']}); terminated what still ran: {', '.join(alive)}"
        with aws.translate_errors():
            before = _record_etags(s3, bucket, prefix, job.name)
            _write_stop(job, "cancel")
            if alive:
                print(
                    f"note: waiting up to {CANCEL_ANSWER_S} s for the node agents to answer the stop", file=sys.stderr
                )
            silent = _unanswered(s3, bucket, prefix, job.name, region, before) if alive else []
        if not silent:
            return (
                f"stopping {job.name}: every node saves a checkpoint, uploads it and terminates "
                f"(distrain-cloud status {job.name}; `cancel {job.name} --now` terminates at once)"
            )
        _terminate(region, silent)
        rest = len(alive) - len(silent)
        return (
            f"stopping {job.name}: no node agent answered the stop within {CANCEL_ANSWER_S} s on "
            f"{', '.join(silent)}: terminated them, without a checkpoint"
            + (f"; the other {rest} node(s) save a checkpoint and end" if rest > 0 else "")
        )

    def cancel_now(self, job: JobRef) -> str:
        """Terminate the job's instances at once (no checkpoint); the stop marker tells any node
        still starting not to begin."""
        from distrain_cloud.infra import aws

        region = aws.region(job.region)
        if recovery.is_lineage(described(job)[3]):
            return recovery.cancel(job, now_=True)
        alive = [i["id"] for i in tagged_instances(region, job.name).get(job.name, []) if i["state"] in ALIVE_STATES]
        _write_stop(job, "cancel")
        if not alive:
            _retire_quietly(job.name)
            return f"{job.name} has no running instance"
        with aws.translate_errors():
            aws.client("ec2", region).terminate_instances(InstanceIds=alive)
        return f"terminating {len(alive)} instance(s) of {job.name} ({', '.join(alive)}): no checkpoint is saved"

    def fetch_outputs(self, job: JobRef, dest: Path) -> dict[str, Any]:
        """Rank 0's node agent uploads the output folder (and, when training completed, the model
        folder) as plain files when the job ends: output_uri and model_uri of its description."""
        region, bucket, prefix, description = described(job)  # once: the status and the output's place
        info = self._status(job, region, bucket, prefix, description)
        return cloud.fetch_outputs(
            job.name, info, region, dest, output=description["output_uri"], model=description["model_uri"]
        )

    def job_spec(self, job: JobRef) -> JobSpec | None:
        """The spec job `job` was submitted with, from its job description in S3 (for `resume`
        from a machine that has no record of it)."""
        from pydantic import ValidationError

        from ..spec import JobSpec

        description = described(job)[3]
        if description.get("spec") is None:
            return None
        try:
            return JobSpec.model_validate(description["spec"])
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(map(str, first["loc"])) or "spec"
            raise UserError(
                f"the spec in {job.name}'s job.json is not a job spec ({where}: {first['msg']}): "
                f"submit it again with --resume-from {job.name}"
            ) from None


# ---------------------------------------------------------------------- the request


def run_instances_request(parts: _Parts, where: _Where, user_data: str, subnet: int = 0) -> dict[str, Any]:
    """The RunInstances request of `parts` placed at `where`, in its subnet number `subnet` (the
    next zones, when the first has no capacity)."""
    tags = [
        {"Key": STACK_TAG, "Value": where.stack},
        {"Key": f"{TAG_PREFIX}job", "Value": parts.job_name},
        {"Key": f"{TAG_PREFIX}lineage", "Value": where.lineage},
        {"Key": f"{TAG_PREFIX}attempt", "Value": str(where.attempt)},
        {"Key": f"{TAG_PREFIX}code-sha256", "Value": parts.code_sha256},
        {"Key": "Name", "Value": parts.job_name},
    ]
    kinds = ["instance", "volume"] + (["network-interface"] if parts.efa else [])
    request: dict[str, Any] = {
        "ImageId": where.ami_id,
        "InstanceType": parts.instance_type,
        "MinCount": parts.nodes,  # all or nothing
        "MaxCount": parts.nodes,
        "ClientToken": client_token(parts.job_name, where.attempt, subnet),
        "UserData": user_data,
        "IamInstanceProfile": {"Name": where.instance_profile},
        "InstanceInitiatedShutdownBehavior": "terminate",
        # IMDSv2 only, and one hop: a container on the node (a second hop) gets no token, so no
        # role credentials (DLAMIs default to 2).
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "BlockDeviceMappings": [
            {
                "DeviceName": where.root_device,
                "Ebs": {
                    "VolumeSize": parts.volume_size_gb,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in kinds],
    }
    subnet_id = where.subnets[subnet]
    if parts.efa:  # the interface carries the security group and subnet then
        request["NetworkInterfaces"] = [
            {
                "DeviceIndex": 0,
                "NetworkCardIndex": 0,
                "InterfaceType": "efa",
                "Groups": [where.security_group],
                "SubnetId": subnet_id,
                "DeleteOnTermination": True,
            }
        ]
    else:
        request["SecurityGroupIds"] = [where.security_group]
        request["SubnetId"] = subnet_id
    if where.placement_group:
        request["Placement"] = {"GroupName": where.placement_group}
    if parts.spot:  # one-time: an interrupted node is gone; the lineage resumes on new ones
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return request


def client_token(job_name: str, attempt: int, subnet: int = 0) -> str:
    """RunInstances' idempotency token: the same for every retry of one launch (botocore's, or
    a resubmitted plan), different for another attempt or zone. At most 64 characters."""
    token = f"{job_name}-a{attempt}" + (f"-z{subnet}" if subnet else "")
    if len(token) <= CLIENT_TOKEN_LIMIT:
        return token
    digest = hashlib.sha256(token.encode()).hexdigest()[:10]
    return f"{token[: CLIENT_TOKEN_LIMIT - 11]}-{digest}"


def job_description(parts: _Parts, where: _Where, spec: JobSpec) -> dict[str, Any]:
    """job.json, what every node agent reads (the contract's keys; references only)."""
    root = f"s3://{where.bucket}/{_job_prefix(parts.prefix, parts.job_name)}"
    return {
        "job": parts.job_name,
        "lineage": where.lineage,
        "attempt": where.attempt,
        "nodes": parts.nodes,
        "processes_per_node": parts.processes_per_node,
        "train_argv": list(parts.argv),
        "secrets": dict(parts.secrets),
        "region": parts.region,
        "bucket": where.bucket,
        "prefix": parts.prefix,
        "code_sha256": parts.code_sha256,
        "deadline": parts.submitted + parts.max_run,
        "log_group": where.log_group,
        "stack_tag": {"Key": STACK_TAG, "Value": where.stack},
        "rendezvous_timeout_s": RENDEZVOUS_TIMEOUT_S,
        "checkpoint_uri": where.checkpoint_uri,
        "model_uri": f"{root}/model/",
        "output_uri": f"{root}/output/",
        "main_port": MAIN_PORT,
        # The training processes' W&B variables (values, never secrets).
        "env": tracking_env(lineage=where.lineage, instance=parts.instance_type),
        # Beyond the contract, for `status`, `ls` and `resume` (the node agent ignores them).
        "instance_type": parts.instance_type,
        "spot": parts.spot,
        "submitted": parts.submitted,
        "spec": spec.model_dump(mode="json", exclude_defaults=True),
    }


def train_requirements() -> list[str]:
    """The `[train]` extra of the installed distrain-cloud, without torch: what a node installs
    besides the bundle's requirements.txt (a PyTorch DLAMI has torch and little else)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires("distrain-cloud") or []
    except PackageNotFoundError:
        return []
    found = []
    for item in declared:
        requirement, _, marker = item.partition(";")
        name = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
        if "extra" in marker and '"train"' in marker and name and name.group(0).lower() != "torch":
            found.append(requirement.strip().replace(" ", ""))
    return found


def refuse_api_problems(request: dict[str, Any]) -> None:
    """Raise one UserError naming the flag or key behind each part of `request` that breaks the
    EC2 API model. The model wants UserData in base64, as botocore sends it."""
    import base64

    encoded = {**request, "UserData": base64.b64encode(request["UserData"].encode()).decode()}
    cloud.refuse_api_problems("ec2", "RunInstances", encoded, REQUEST_SOURCES, "EC2")


def _user_data_size_check(user_data: str) -> Check:
    size = len(user_data.encode())
    return Check(f"user data <= {USER_DATA_LIMIT} bytes", size <= USER_DATA_LIMIT, f"{size} bytes")


def _secret_free_check(user_data: str, description: dict[str, Any], secrets: dict[str, str]) -> Check:
    """User data is readable through the instance's metadata: it must hold no secret, not even a
    reference (those travel in job.json, resolved on the node). Credentials of this machine's
    environment must appear nowhere."""
    import os

    leaked = [env for env, ref in secrets.items() if ref in user_data]
    text = user_data + json.dumps(description)
    for variable in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN", "WANDB_API_KEY"):
        value = os.environ.get(variable, "")
        if len(value) >= 8 and value in text:
            leaked.append(variable)
    if leaked:
        return Check("user data holds no secret", False, f"{', '.join(leaked)} would be sent; report this as a bug")
    return Check("user data holds no secret", True, "references only, in job.json; resolved on the node")


def _hardware(instance: InstanceType) -> str:
    if not instance.gpus:
        return f"{instance.vcpus} vCPUs, no GPU"
    return f"{instance.gpus} x {instance.gpu_model}, cc {instance.compute_capability_str}"


def _job_prefix(prefix: str, job_name: str) -> str:
    return f"{prefix}/jobs/{job_name}" if prefix else f"jobs/{job_name}"


def _hard_stop_at(parts: _Parts) -> int:
    """The epoch at which every node of the job stops, whenever it booted."""
    return math.ceil(parts.submitted + parts.max_run) + HARD_STOP_GRACE_MIN * 60


def _checkpoint_uri(where: _Where, parts: _Parts) -> str:
    # A lineage shares one checkpoint prefix: resumed attempts read what earlier ones wrote.
    base = f"{parts.prefix}/checkpoints" if parts.prefix else "checkpoints"
    return f"s3://{where.bucket}/{base}/{where.lineage}/"


# ---------------------------------------------------------------------- preflight


def stack_resources(name: str, region: str) -> StackResources:
    """The stack's resources; with no stack, one line saying to run `infra up`."""
    from distrain_cloud.infra import stack

    return stack.resources(name, region)


def resolve_ami(parameter: str, region: str) -> str:
    """The AMI id in SSM parameter `parameter` (a public DLAMI parameter, or one of the user's).
    Tests replace this function: moto cannot serve /aws/service/* parameters."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    try:
        value = aws.client("ssm", region).get_parameter(Name=parameter)["Parameter"]["Value"]
    except ClientError as e:
        if aws.error_code(e) == "ParameterNotFound":
            raise UserError(
                f"SSM parameter {parameter} does not exist in {region}: set ec2.ami_parameter or ec2.ami_id"
            ) from None
        raise
    return str(value)


def _check_image(ami_id: str, region: str, plan: Plan, checks: list[Check]) -> str | None:
    """Add the AMI checks; returns its root device name (None when it could not be described)."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    from ..catalog import AMI_FAMILIES, lookup

    parts: _Parts = plan.payload["parts"]
    try:
        images = aws.client("ec2", region).describe_images(ImageIds=[ami_id]).get("Images", [])
    except ClientError as e:
        if aws.error_code(e).startswith("InvalidAMIID"):
            images = []
        else:
            raise
    if not images:
        checks.append(Check("AMI exists", False, f"{ami_id} is not an AMI in {region}"))
        return None
    image = images[0]
    name = str(image.get("Name", ""))
    checks.append(Check("AMI exists", True, f"{ami_id} ({name})"))
    model = lookup(parts.instance_type).gpu_model
    if model and "OSS Nvidia Driver" in name and model not in AMI_FAMILIES["oss-pytorch"].gpu_models:
        checks[:] = [c for c in checks if c.name != "AMI drives the GPU"]  # the plan's verdict was the family's
        checks.append(
            Check(
                "AMI drives the GPU",
                False,
                f"{name} has the OSS NVIDIA driver, which cannot run {parts.instance_type}'s {model}; "
                f"drop ec2.ami_id (the {parts.family.name} family's AMI is the default)",
            )
        )
    root = image.get("RootDeviceName")
    return str(root) if root else None


def _subnets(subnet_id: str | None, security_group: str, region: str, checks: list[Check]) -> tuple[str, ...]:
    """The subnet to launch in, then one per other zone to try when it has no capacity: the
    spec's only, or the default subnets of the security group's VPC (any public one if none)."""
    from distrain_cloud.infra import aws

    ec2 = aws.client("ec2", region)
    if subnet_id:
        found = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"]
        checks.append(Check("subnet", True, f"{subnet_id} ({found[0].get('AvailabilityZone', '?')})"))
        return (subnet_id,)
    groups = ec2.describe_security_groups(GroupIds=[security_group])["SecurityGroups"]
    vpc = groups[0]["VpcId"]
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    usable = [s for s in subnets if s.get("DefaultForAz")] or [s for s in subnets if s.get("MapPublicIpOnLaunch")]
    if not usable:
        raise UserError(f"the stack's VPC {vpc} has no default or public subnet in {region}: set ec2.subnet_id")
    by_zone: dict[str, str] = {}
    for s in sorted(usable, key=lambda s: (s.get("AvailabilityZone", ""), s["SubnetId"])):
        by_zone.setdefault(s.get("AvailabilityZone", ""), s["SubnetId"])
    chosen = tuple(by_zone.values())
    checks.append(
        Check("subnet", True, f"{chosen[0]} ({next(iter(by_zone))}); {len(chosen) - 1} other zone(s) if it is full")
    )
    return chosen


def _previous_attempt(job_name: str, bucket: str, parts: _Parts, checks: list[Check]) -> tuple[str, int, str]:
    """(lineage, attempt, checkpoint URI) of a new attempt after EC2 job `job_name`."""
    from distrain_cloud.infra import aws

    s3 = aws.client("s3", parts.region)
    previous = read_description(s3, bucket, parts.prefix, job_name)
    if previous is None:
        raise UserError(
            f"--resume-from {job_name}: no EC2 job of that name in s3://{bucket}/{parts.prefix}/jobs/ "
            f"({parts.region}); `distrain-cloud ls` lists the jobs"
        )
    lineage, attempt, uri = str(previous["lineage"]), int(previous["attempt"]) + 1, str(previous["checkpoint_uri"])
    checks.append(Check(f"resume from {job_name}", True, f"lineage {lineage}, attempt {attempt}, {uri}"))
    return lineage, attempt, uri


def _quota_check(spec: JobSpec, region: str) -> Check:
    """The account's vCPU quota for this class of instance, where Service Quotas answers
    (advisory: running instances count against it too, and it is not read everywhere)."""
    from distrain_cloud.infra import aws

    from ..catalog import lookup

    instance = lookup(spec.instance)
    family = instance.name.split(".")[0]
    kind = "P" if family.startswith("p") else "G and VT" if family.startswith(("g", "vt")) else "Standard"
    name = f"vCPU quota: {'spot' if spec.spot else 'on-demand'} {kind} instances"
    need = spec.nodes * instance.vcpus
    try:
        quotas = aws.client("service-quotas", region, max_attempts=2)
        value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=VCPU_QUOTAS[(kind, spec.spot)])["Quota"]["Value"]
    except Exception as e:  # no permission (the launcher policy grants none) or not answered: say so
        return Check(name, None, f"not checked ({type(e).__name__})")
    return Check(name, value >= need, f"{int(value)} vCPUs allowed, {need} needed (running instances count too)")


# ---------------------------------------------------------------------- launch


def launch(request: dict[str, Any], where: _Where, parts: _Parts) -> list[str]:
    """The one RunInstances call; when the zone has no capacity for all N nodes, the same
    request in the next zone's subnet (a new ClientToken: nothing was launched), then a
    one-line refusal. Returns the instance ids."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    tried = []
    with aws.translate_errors():
        ec2 = aws.client("ec2", parts.region)
        for k, subnet in enumerate(where.subnets):
            sent = request if k == 0 else run_instances_request(parts, where, request["UserData"], subnet=k)
            try:
                reply = job_role.retry_while_propagating(
                    functools.partial(ec2.run_instances, **sent), _profile_not_yet_seen
                )
            except ClientError as e:
                if aws.error_code(e) != "InsufficientInstanceCapacity":
                    raise
                tried.append(subnet)
                if k + 1 < len(where.subnets):
                    print(
                        f"note: no capacity for {parts.nodes} x {parts.instance_type} in subnet {subnet}; "
                        f"trying {where.subnets[k + 1]} (another zone)",
                        file=sys.stderr,
                    )
                continue
            return [instance["InstanceId"] for instance in reply.get("Instances", [])]
    _put_json(
        parts.region,
        where.bucket,
        f"{_job_prefix(parts.prefix, parts.job_name)}/launch.json",
        {"status": "Failed", "reason": "no capacity", "subnets": tried, "time": time.time()},
    )
    raise UserError(
        f"AWS has no capacity for {parts.nodes} x {parts.instance_type} right now (tried subnet(s) "
        f"{', '.join(tried)}); nothing was launched: retry later, with fewer nodes, another region"
        + (" or on-demand" if parts.spot else " or --spot")
    )


def _profile_not_yet_seen(e: Exception) -> bool:
    """RunInstances' answer while EC2 does not yet see an instance profile IAM just made."""
    from distrain_cloud.infra import aws

    message = str(getattr(e, "response", {}).get("Error", {}).get("Message", "")).lower().replace(" ", "")
    return aws.error_code(e) == "InvalidParameterValue" and "iaminstanceprofile" in message


# ---------------------------------------------------------------------- the job's role


def _job_role(parts: _Parts, where: _Where) -> JobRole:
    """The job's own IAM role: its S3 prefixes and its instances, nothing of another job's."""
    from .sagemaker import refuse_role_problems

    place = job_role.Place(
        partition=where.partition,
        region=parts.region,
        account=where.account,
        stack=where.stack,
        bucket=where.bucket,
        prefix=parts.prefix,
        job=parts.job_name,
        lineage=where.lineage,
    )
    role = job_role.for_job(
        "ec2",
        place,
        boundary_arn=where.boundary,
        log_group=where.log_group,
        secret_prefix=where.secret_prefix,
        ssm=where.ssm,
    )
    refuse_role_problems(role)
    return role


def _isolation_check(role: JobRole, parts: _Parts, where: _Where) -> Check:
    own = f"{_job_prefix(parts.prefix, parts.job_name)}/, {parts.prefix}/checkpoints/{where.lineage}/"
    return Check(
        "job role isolates the job",
        True,
        f"{role.path}{role.name}: {own} (read-write), {parts.prefix}/code/ (read), its own instances; made at submit",
    )


def retire_role_when_done(
    name: str, description: dict[str, Any], info: dict[str, Any], instances: list[dict[str, Any]]
) -> None:
    """Delete job `name`'s role once the job has ended and none of its instances can still use it.

    The name is the launcher's own (never job.json's: the job may rewrite that file, and must not
    be able to point the launcher at another job's role); job.json only says whether it has one."""
    holding = set(ALIVE_STATES) | {"shutting-down"}
    if description.get("role") and info["terminal"] and not any(i["state"] in holding for i in instances):
        _retire_quietly(name)


def _retire_quietly(name: str) -> None:
    try:
        job_role.retire(name)
    except UserError as e:  # status still answers; the role goes at the next look or `infra down`
        print(f"note: job role {name} was not deleted: {e}", file=sys.stderr)


# ---------------------------------------------------------------------- status


def job_location(job_name: str, region: str) -> tuple[str, str]:
    """(bucket, prefix) of an EC2 job: from the record written when it was submitted here, else
    the default stack's bucket and the default prefix."""
    from distrain_cloud.infra.stack import DEFAULT_STACK

    from ..jobs import read_record

    record = read_record(job_name) or {}
    if record.get("bucket") and not str(record["bucket"]).startswith("<"):
        return str(record["bucket"]), str(record.get("prefix", "distrain-cloud"))
    return stack_resources(str(record.get("stack") or DEFAULT_STACK), region).bucket, str(
        record.get("prefix", "distrain-cloud")
    )


def described(job: JobRef) -> tuple[str, str, str, dict[str, Any]]:
    """(region, bucket, prefix, job.json) of EC2 job `job`; one-line UserError when there is none."""
    from distrain_cloud.infra import aws

    region = aws.region(job.region)
    bucket, prefix = job_location(job.name, region)
    with aws.translate_errors():
        description = read_description(aws.client("s3", region), bucket, prefix, job.name)
    if description is None:
        raise UserError(
            f"no EC2 job {job.name} in s3://{bucket}/{prefix}/jobs/ ({region}); `distrain-cloud ls` lists the jobs"
        )
    return region, bucket, prefix, description


def submitted_key(prefix: str, job_name: str) -> str:
    """The launcher's copy of job `job_name`'s job.json: outside `jobs/<job>/`, which the job's own
    role may rewrite, so what `status`, `ls` and `resume` trust (the flags, instance and node count
    of the next attempt among it) is what the launcher wrote."""
    return "/".join(p for p in (prefix.strip("/"), "submitted", f"{job_name}.json") if p)


def read_description(s3: Any, bucket: str, prefix: str, job_name: str) -> dict[str, Any] | None:
    """Job `job_name`'s description, checked: the launcher's copy, else (a job submitted before
    there was one) the job's own job.json; None when there is neither."""
    for key in (submitted_key(prefix, job_name), f"{_job_prefix(prefix, job_name)}/job.json"):
        description = _read_json(s3, bucket, key)
        if description is not None:
            return check_description(description, job_name, f"s3://{bucket}/{key}")
    return None


def _places(region: str) -> list[tuple[str, str]]:
    """Every (bucket, prefix) EC2 jobs of this machine's records live in, and the default stack's."""
    from distrain_cloud.infra.stack import DEFAULT_STACK

    from ..jobs import recorded_jobs

    places = {
        (str(r["bucket"]), str(r.get("prefix", "distrain-cloud")))
        for r in recorded_jobs()
        if r.get("backend") == "ec2" and r.get("region") == region and r.get("bucket")
    }
    try:
        places.add((stack_resources(DEFAULT_STACK, region).bucket, "distrain-cloud"))
    except UserError:
        pass  # no default stack: only recorded jobs
    return sorted(places)


def _job_names(s3: Any, bucket: str, prefix: str) -> list[str]:
    from ..logs import printable
    from ..spec import JOB_NAME

    names = []
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/jobs/", Delimiter="/")
    for page in pages:
        for folder in page.get("CommonPrefixes", []):
            name = folder["Prefix"].rstrip("/").rsplit("/", 1)[-1]
            if JOB_NAME.fullmatch(name):
                names.append(name)
            else:  # no job of ours is named so: whoever wrote it, it is not one to read
                print(printable(f"note: skipped s3://{bucket}/{folder['Prefix']}: not a job name"), file=sys.stderr)
    return names


def _created_key(job_name: str) -> str:
    match = _UNIQUE_NAME.search(job_name)
    return match.group(1) if match else ""


def _read_json(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The JSON object at `key`, or None when there is no such object. Whoever can write the
    job's prefix writes these: anything but a JSON object of at most RECORD_LIMIT bytes is one
    UserError naming it (`bad_record`)."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    try:
        with contextlib.closing(s3.get_object(Bucket=bucket, Key=key)["Body"]) as body:
            data = body.read(RECORD_LIMIT + 1)
    except ClientError as e:
        if aws.error_code(e) in ("NoSuchKey", "404"):
            return None
        raise
    where = f"s3://{bucket}/{key}"
    if len(data) > RECORD_LIMIT:
        raise bad_record(where, f"over {RECORD_LIMIT // 1024} KiB")
    try:
        loaded = json.loads(data)
    except (ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON, too many digits
        raise bad_record(where, f"not JSON: {type(e).__name__}") from None
    if not isinstance(loaded, dict):
        raise bad_record(where, f"a JSON {type(loaded).__name__}, not an object")
    return loaded


# A record's size limit: job.json with its spec is a few KiB, a node record less.
RECORD_LIMIT = 1024 * 1024
# A node count far above what a spec allows (64), and still small enough to count through.
_MAX_NODES = 4096
# The keys of job.json that status, ls, logs, report and resume read: (types, required).
_NUMBER = (int, float)
_DESCRIPTION_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "job": ((str,), True),
    "nodes": ((int,), True),
    "lineage": ((str,), True),
    "attempt": ((int,), True),
    "deadline": (_NUMBER, True),
    "log_group": ((str,), False),  # `logs` says so when it is missing
    "checkpoint_uri": ((str,), True),
    "model_uri": ((str,), True),
    "output_uri": ((str,), True),
    "submitted": (_NUMBER, False),
    "instance_type": ((str,), False),
    "spot": ((bool,), False),
    "spec": ((dict,), False),
}
# A node record's keys (training/node_agent.py writes them), none required but status.
_NODE_KEYS: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "exit_code": (int,),
    "reason": (str,),
    "phase": (str,),
    "instance_id": (str,),
    "time": _NUMBER,
}


def bad_record(where: str, why: str) -> UserError:
    return UserError(f"{where} is not a record distrain-cloud wrote ({why}); `aws s3 cp {where} -` shows it")


def _wrong_type(record: dict[str, Any], key: str, types: tuple[type, ...], required: bool) -> str | None:
    """What is wrong with `record[key]`, or None. A bool is no number; a number must be finite
    and within what time and counts can hold."""
    if key not in record or record[key] is None:
        return f"it has no {key!r}" if required else None
    value = record[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        return f"its {key!r} is a {type(value).__name__}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (-1e11 < value < 1e11):
        return f"its {key!r} is out of range"
    return None


def check_description(description: dict[str, Any], job_name: str, where: str) -> dict[str, Any]:
    """job.json of EC2 job `job_name`, checked to be the shape `job_description` writes."""
    for key, (types, required) in _DESCRIPTION_KEYS.items():
        wrong = _wrong_type(description, key, types, required)
        if wrong:
            raise bad_record(where, wrong)
    if description["job"] != job_name:
        raise bad_record(where, f"it names another job, {description['job'][:80]!r}")
    if not 1 <= description["nodes"] <= _MAX_NODES or description["attempt"] < 0:
        raise bad_record(where, f"{description['nodes']} nodes, attempt {description['attempt']}")
    return description


def check_node_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    """A node's record (`nodes/<rank>.json`), checked to be what the node agent writes."""
    status = record.get("status")
    if not isinstance(status, str) or status not in {s.value for s in Ec2JobStatus}:
        raise bad_record(where, f"its 'status' is {str(record.get('status'))[:40]!r}")
    for key, types in _NODE_KEYS.items():
        wrong = _wrong_type(record, key, types, False)
        if wrong:
            raise bad_record(where, wrong)
    if (record.get("step") or 0) < 0:
        raise bad_record(where, "its 'step' is negative")
    return record


def _put_json(region: str, bucket: str, key: str, body: dict[str, Any]) -> None:
    from distrain_cloud.infra import aws

    with aws.translate_errors():
        aws.client("s3", region).put_object(
            Bucket=bucket, Key=key, Body=json.dumps(body).encode(), ContentType="application/json"
        )


def _write_stop(job: JobRef, reason: str) -> None:
    from distrain_cloud.infra import aws

    region = aws.region(job.region)
    bucket, prefix = job_location(job.name, region)
    _put_json(
        region,
        bucket,
        f"{_job_prefix(prefix, job.name)}/stop",
        {"reason": reason, "by": "launcher", "time": time.time()},
    )


def _terminate(region: str, ids: list[str]) -> None:
    from distrain_cloud.infra import aws

    with aws.translate_errors():
        aws.client("ec2", region).terminate_instances(InstanceIds=ids)


def _record_etags(s3: Any, bucket: str, prefix: str, job_name: str) -> dict[str, str]:
    """node record key -> its ETag: what a record that moved no longer has."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{_job_prefix(prefix, job_name)}/nodes/"
    )
    return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", [])}


def _unanswered(s3: Any, bucket: str, prefix: str, job_name: str, region: str, before: dict[str, str]) -> list[str]:
    """The job's live instances whose agent has not answered the stop marker within CANCEL_ANSWER_S:
    no record of theirs moved since `before`, none is final, none is in its final sync (which
    writes no heartbeat but ends by itself). Instances that end meanwhile answered."""
    until = time.monotonic() + CANCEL_ANSWER_S
    while True:
        alive = {i["id"] for i in tagged_instances(region, job_name).get(job_name, []) if i["state"] in ALIVE_STATES}
        answered = set()
        for key, etag in _record_etags(s3, bucket, prefix, job_name).items():
            record = _read_json(s3, bucket, key) or {}
            ending = record.get("status") != "InProgress" or record.get("phase") == "final-sync"
            if etag != before.get(key) or ending:
                answered.add(str(record.get("instance_id")))
        silent = sorted(alive - answered)
        if not silent or time.monotonic() >= until:
            return silent
        time.sleep(min(CANCEL_POLL_S, max(0.0, until - time.monotonic())))


def job_files(s3: Any, bucket: str, prefix: str, job_name: str) -> dict[str, Any]:
    """What the nodes and the launcher wrote beside job.json: node records by rank, the stop
    marker, a failed launch."""
    root = _job_prefix(prefix, job_name)
    nodes: dict[int, dict[str, Any]] = {}
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/nodes/")
    for page in pages:
        for item in page.get("Contents", []):
            rank = re.fullmatch(r"nodes/([0-9]{1,6})\.json", item["Key"].removeprefix(f"{root}/"))
            record = _read_json(s3, bucket, item["Key"]) if rank else None
            if rank and record is not None:
                nodes[int(rank.group(1))] = check_node_record(record, f"s3://{bucket}/{item['Key']}")
    found: dict[str, Any] = {"nodes": nodes}
    for name, key in (("stop", "stop"), ("launch", "launch.json")):
        record = _read_json(s3, bucket, f"{root}/{key}")
        wrong = record and _wrong_type(record, "reason", (str,), False)
        if wrong:
            raise bad_record(f"s3://{bucket}/{root}/{key}", wrong)
        found[name] = record
    return found


def tagged_instances(region: str, job_name: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Instances tagged with a distrain-cloud job (or with `job_name`), by job name."""
    from distrain_cloud.infra import aws

    key = f"{TAG_PREFIX}job"
    filters = [{"Name": f"tag:{key}", "Values": [job_name]}] if job_name else [{"Name": "tag-key", "Values": [key]}]
    found: dict[str, list[dict[str, Any]]] = {}
    with aws.translate_errors():
        pages = aws.client("ec2", region).get_paginator("describe_instances").paginate(Filters=filters)
        for page in pages:
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    found.setdefault(tags.get(key, ""), []).append(
                        {
                            "id": inst["InstanceId"],
                            "state": inst["State"]["Name"],
                            "reason": (inst.get("StateReason") or {}).get("Code", ""),
                            "node_status": tags.get(f"{TAG_PREFIX}status", ""),
                        }
                    )
    return found


def job_status(
    description: dict[str, Any], found: dict[str, Any], instances: list[dict[str, Any]], *, now: float
) -> dict[str, Any]:
    """A job's status from its description, what its nodes wrote and its instances (pure)."""
    name, n = description["job"], int(description["nodes"])
    nodes: dict[int, dict[str, Any]] = found.get("nodes", {})
    final = {r: rec for r, rec in nodes.items() if rec.get("status") in _PRECEDENCE}
    alive = [i for i in instances if i["state"] in ALIVE_STATES]
    stop, launch_failed = found.get("stop"), found.get("launch")
    # A node that failed before every node met ended the job's instances itself: nothing more comes.
    gave_up = any(rec.get("status") == "Failed" and rec.get("gave_up") is True for rec in final.values())
    # Instances that have written nothing by the time every working node has met or given up never
    # ran their user data: no agent, no hard stop. Only a node's failure or a person ends them.
    age = now - float(description.get("submitted", 0))
    reported = {str(rec.get("instance_id")) for rec in nodes.values()}
    quiet_after = LAUNCH_GRACE_S + float(description.get("rendezvous_timeout_s", RENDEZVOUS_TIMEOUT_S))
    silent = [i["id"] for i in alive if i["id"] not in reported] if age > quiet_after else []
    failed = any(rec.get("status") == "Failed" for rec in final.values())
    left_over = bool(alive) and (gave_up or (failed and len(silent) == len(alive)))
    status, detail = Ec2JobStatus.InProgress, ""
    if launch_failed and not instances:
        status, detail = Ec2JobStatus.Failed, f"not launched: {launch_failed.get('reason', '')}"
    elif len(final) == n or (final and not alive) or left_over:
        status = Ec2JobStatus(next(s for s in _PRECEDENCE if any(r["status"] == s for r in final.values())))
        missing = sorted(set(range(n)) - set(final))
        if missing and status is not Ec2JobStatus.Failed:
            status = Ec2JobStatus.Stopped if stop else Ec2JobStatus.Lost
        detail = _final_detail(status, final, missing, description)
        if left_over:  # the node that gave up could not terminate them, or no agent ever ran there
            ids = ", ".join(i["id"] for i in alive)
            detail += f"; still running: {ids}: `distrain-cloud cancel {name} --now` ends them"
    elif alive:
        detail = _progress(nodes, alive, n, stop)
        if not nodes and len(silent) == len(alive):
            detail = (
                f"no node has reported {int(age // 60)} min after submit: their user data may not have run "
                f"(see the instances' console output); `distrain-cloud cancel {name} --now` ends them"
            )
        if now > float(description["deadline"]) + HARD_STOP_GRACE_MIN * 60:
            detail += f"; instances past the job's deadline: `distrain-cloud cancel {name} --now`"
    elif instances and any(i["reason"] == SPOT_TERMINATION for i in instances):
        status = Ec2JobStatus.Interrupted
        detail = f"spot capacity was reclaimed before the nodes reported; `distrain-cloud resume {name}` continues it"
    elif stop and (instances or launch_failed or nodes):
        status = Ec2JobStatus.Stopped
        why = stop.get("reason", "?")
        detail = f"stopped ({why}) before its nodes wrote a final record; its last checkpoint, if any, stays"
    elif instances or nodes or now - float(description.get("submitted", 0)) > LAUNCH_GRACE_S:
        status = Ec2JobStatus.Lost
        detail = f"its instances ended without a record: see `distrain-cloud logs {name}`"
    else:
        detail = "launching"
    return {
        "job_name": name,
        "status": status.value,
        "terminal": status in TERMINAL,
        "instance": f"{n} x {description.get('instance_type', '?')}" + (" (spot)" if description.get("spot") else ""),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(description.get("submitted", 0)))),
        "detail": detail,
        "lineage": description["lineage"],
        "attempt": description["attempt"],
        "nodes": {str(r): rec.get("status") for r, rec in sorted(nodes.items())},
        "instances": {i["id"]: i["state"] for i in instances},
        "checkpoints": description["checkpoint_uri"],
        "model_artifacts": description["model_uri"] if status is Ec2JobStatus.Completed else None,
    }


def _final_detail(
    status: Ec2JobStatus, final: dict[int, dict[str, Any]], missing: list[int], description: dict[str, Any]
) -> str:
    name = description["job"]
    if status is Ec2JobStatus.Failed:
        rank, record = next((r, rec) for r, rec in sorted(final.items()) if rec["status"] == "Failed")
        return f"node {rank}: {record.get('reason') or 'failed (exit ' + str(record.get('exit_code')) + ')'}"
    if missing:
        return f"node(s) {', '.join(map(str, missing))} ended without a record: see `distrain-cloud logs {name}`"
    if status is Ec2JobStatus.Completed:
        return f"model in {description['model_uri']}"
    reason = next((rec.get("reason") for rec in final.values() if rec.get("reason")), "")
    what = (
        "spot capacity was reclaimed" if status is Ec2JobStatus.Interrupted else f"stopped ({reason or 'on request'})"
    )
    return f"{what}; checkpoints saved: `distrain-cloud resume {name}` continues it"


def _progress(nodes: dict[int, dict[str, Any]], alive: list[dict[str, Any]], n: int, stop: Any) -> str:
    failed = sorted(r for r, rec in nodes.items() if rec.get("status") == "Failed")
    if failed:
        reason = nodes[failed[0]].get("reason") or "failed"
        return f"node {failed[0]} failed ({reason}); the others are stopping"
    if stop:
        return f"stopping ({stop.get('reason', '?')}): every node saves a checkpoint, then ends"
    phases = [rec for rec in nodes.values() if rec.get("status") == "InProgress"]
    steps = [int(rec["step"]) for rec in phases if rec.get("step") is not None]
    if steps:
        return f"training, step {max(steps)}"
    joined = [re.fullmatch(r"rendezvous (\d+)/(\d+)", str(rec.get("phase", ""))) for rec in phases]
    counts = [int(m.group(1)) for m in joined if m]
    if counts:
        return f"rendezvous {max(counts)}/{n}"
    if any(str(rec.get("phase")) == "training" for rec in phases):
        return "training"
    running = sum(1 for i in alive if i["state"] == "running")
    return f"starting: {running}/{n} instance(s) running"


BACKEND = Ec2Backend()
