"""The EC2 backend: N GPU instances from one RunInstances call, one process per GPU on each.

The plan holds the exact RunInstances request (request.py), its user data (user_data.py, boot.py)
and the job description the nodes read; submit uploads the code bundle, writes the job description
to S3, then sends that one request (all N nodes or none). Each node's user data checks the bundle's
sha256 and hands over to the node agent inside it (agent/), which finds its peers through S3,
trains, syncs checkpoints, reports in `nodes/<rank>.json` and terminates its own instance; status.py
reads what it wrote. The S3 layout (layout.py) and records are the contract between launcher and
node agent (docs/ec2.md).

This file: the Backend interface, the launch, the job's role, status and cancel. Preflight's reads
are preflight.py's; where a job's records are, and the launcher's writes to them, records.py's.

What only AWS can name (the stack's bucket, instance profile and security group, the AMI id, a
subnet, a resumed job's lineage) is a placeholder until preflight fills it in.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra import job_role
from distrain_cloud.infra.errors import UserError
from distrain_cloud.infra.stack import ALIVE_STATES
from distrain_cloud.training.strategies import AUTO, parse_strategy

from ...lease import launched as lineage_launched
from ...plan import Check, JobRef, LeaseTarget, Plan, refuse_failed_checks
from ...tracking import wandb_run
from .. import cloud, wait_for
from . import budget, layout, network, preflight, quotas, records, recovery, spot_price
from .request import (
    GROUP_PLACEHOLDER,
    HARD_STOP_GRACE_MIN,
    MAIN_PORT,
    Ec2Payload,
    Parts,
    Where,
    hardware,
    job_description,
    lineage_checkpoint_uri,
    payload_of,
    refuse_api_problems,
    run_instances_request,
    secret_free_check,
    train_requirements,
    user_data_size_check,
)
from .status import (
    bad_record,
    created_key,
    job_files,
    job_names,
    job_status,
    read_description,
    tagged_instances,
)
from .user_data import ec2_user_data

if TYPE_CHECKING:
    from distrain_cloud.infra.job_role import JobRole

    from ...logs import LogLine
    from ...spec import JobSpec

# A cluster placement group is one zone's capacity, launched all or nothing: past this many
# nodes such a launch rarely finds room (our choice, not an AWS limit; docs/ec2.md).
PLACEMENT_GROUP_MAX_NODES = 16


class Ec2Backend:
    name = "ec2"
    title = "EC2"
    billed = True
    stops_now = True  # TerminateInstances: the nodes end at once, without their last checkpoint
    finds_by_name = False  # a job's S3 prefix is the stack's, which only its record (or --backend) names
    lease_fields: tuple[str, ...] = ("region", "bucket", "prefix")  # the job's records in S3

    # ------------------------------------------------------------------ plan

    def plan(self, spec: JobSpec) -> Plan:
        """Everything that will be sent, without one AWS call."""
        from ...bundle import build_bundle, bundle_key
        from ...catalog import ami_family, lookup

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

        bundle = build_bundle(cloud.repo_root(), allow_large=spec.bundle.allow_large)
        parts = Parts(
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
            recovering=recovery.wanted(spec),
        )
        stack = spec.stack
        where = Where(
            stack=stack,
            bucket=f"<stack-{stack}-bucket>",
            instance_profile=job_name,  # the job's own (its role's name), made at submit
            security_group=GROUP_PLACEHOLDER,
            log_group=f"<stack {stack} log group>",
            ami_id=spec.ec2.ami_id or f"<newest AMI from {parts.ami_parameter}>",
            root_device=family.root_device,
            subnets=(spec.ec2.subnet_id or f"<a default subnet of stack {stack}'s VPC>",),
            placement_group=job_name if placement else None,
            lineage=f"<lineage of {spec.resume_from}>" if spec.resume_from else job_name,
            attempt=0 if spec.resume_from else 1,
            checkpoint_uri="",
            boundary=f"<stack {stack}'s JobBoundary policy>",
            # The stack's default subnets give public IPv4 addresses; a subnet of the user's is
            # taken to give none (a private cluster subnet) until preflight describes it.
            public_ip=spec.ec2.subnet_id is None,
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
        checks.extend(training.checks)
        checks.append(Check(f"stack {stack}", None, "its bucket, VPC and job role boundary, at submit"))
        if spec.ec2.ami_id:
            checks.append(Check("AMI", None, f"{spec.ec2.ami_id} is described at submit"))
        else:
            checks.append(Check("AMI", None, f"the newest from {parts.ami_parameter}, at submit"))
        if spec.resume_from:
            checks.append(Check(f"resume from {spec.resume_from}", None, "its lineage and checkpoints, at submit"))
        cost = cloud.estimate_cost(instance, region, spec.nodes, spec.max_run, spec.spot)
        if spec.max_cost is not None:
            checks.append(cloud.budget_check(spec.max_cost, cost, spec.nodes))
        plan = Plan(
            backend=self.name,
            job_name=job_name,
            summary={
                "instance": f"{spec.nodes} x {instance.name} ({hardware(instance)})",
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
            bundle_listing=bundle.listing(),
            spec=spec,
            region=region,
            training=training.flags,
        )
        placed = self._place(plan, where, parts, bundle_key(parts.prefix, bundle.sha256), bundle.data)
        return budget.apply(placed, spec, region)  # the worst case, --max-cost, the limits

    def _place(self, plan: Plan, where: Where, parts: Parts, code_key: str, bundle: bytes) -> Plan:
        """The plan with `where` rendered into the job description, user data and request, and
        the checks that depend on them (size, secrets, the API model) redone."""
        spec = plan.spec
        where = dataclasses.replace(where, checkpoint_uri=where.checkpoint_uri or lineage_checkpoint_uri(where, parts))
        description = job_description(parts, where, spec)
        # Beyond the contract: which of the job's own network resources status retires with it.
        description["network"] = {
            "security_group": network.group_name(parts.job_name),
            "placement_group": where.placement_group,
        }
        network_requests = network.requests(parts.job_name, where.stack, where.vpc, where.placement_group)
        network.refuse_problems(network_requests)
        role = _job_role(parts, where, lineage_group=parts.recovering, on_demand=spec.ec2.on_demand_after is not None)
        description["role"] = role.name  # beyond the contract: `status` deletes it once the job ended
        if parts.recovering:  # a spot lineage the AWS side keeps going (recovery.py)
            description["recovery"] = recovery.description_block(parts.job_name, parts.nodes, spec)
        cost_block = budget.description_block(spec, parts.region)
        if cost_block:  # --max-cost, kept by the nodes' cost clock (agent/costclock.py)
            description["cost"] = cost_block
        # The bytes submit uploads, hashed here so the user data can pin them (a job.json rewritten
        # after submit is refused by every node before it trusts any of it).
        job_json = json.dumps(description, indent=2).encode()
        user_data = ec2_user_data(
            job=parts.job_name,
            attempt=where.attempt,
            region=parts.region,
            bucket=where.bucket,
            job_prefix=layout.job_key(parts.prefix, parts.job_name),
            code_key=code_key,
            code_sha256=parts.code_sha256,
            job_sha256=hashlib.sha256(job_json).hexdigest(),
            hard_stop_minutes=math.ceil(parts.max_run / 60) + HARD_STOP_GRACE_MIN,
            # A recovering lineage's replacements boot later: its hard stop is one moment for all.
            hard_stop_at=_hard_stop_at(parts) if parts.recovering else None,
            # Its nodes' failures count against the lineage's budget (boot.py), in its group.
            **recovery.user_data_values(parts),
            python=parts.family.python,
            torch=parts.family.torch,
            requirements=parts.requirements,
        )
        request = run_instances_request(parts, where, user_data)
        budget.with_max_price(request, None, spec, parts.region)
        refuse_api_problems(request)
        lineage_requests = None
        if parts.recovering:
            tags = request["TagSpecifications"][0]["Tags"][:2]  # the stack and job tags
            lineage_requests = recovery.requests(
                request, name=parts.job_name, nodes=parts.nodes, subnets=where.subnets, deadline=_hard_stop_at(parts),
                tags=tags,
            )  # fmt: skip
            budget.with_max_price({}, lineage_requests, spec, parts.region)
            recovery.refuse_problems(lineage_requests, description["recovery"])
        drop = ("user data", "request fits", "job role", "EFA", "cluster placement group", "security group", "zone")
        checks = [c for c in plan.checks if not c.name.startswith(drop)]
        checks.append(_isolation_check(role, parts, where))
        known = not where.account.startswith("<")  # the stack's names come at submit (preflight)
        reach = cloud.secrets_reach_check(
            dict(parts.secrets),
            partition=where.partition,
            region=parts.region,
            account=where.account,
            secret_prefix=where.secret_prefix if known else None,
        )
        checks += [reach] if reach else []
        checks += _network_checks(parts, where)
        checks.append(user_data_size_check(user_data))
        checks.append(secret_free_check(user_data, description, dict(parts.secrets)))
        checks.append(Check("request fits the EC2 API model", True, "required fields, types and enums of RunInstances"))
        if lineage_requests:
            checks.append(Check("request fits the EC2 API model", True, "the launch template and Auto Scaling group"))
        wandb = wandb_run(spec, plan.training.args, description["env"]) if plan.training else None
        summary = {
            **plan.summary,
            "output": description["output_uri"],
            "checkpoints": where.checkpoint_uri,
            "lineage": f"{where.lineage}, attempt {where.attempt or '<next>'}",
            "network": _bandwidth(parts, where),
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
                "network": network_requests,
                **({"recovery": lineage_requests} if lineage_requests else {}),
            },
            bundle={**(plan.bundle or {}), "s3": f"s3://{where.bucket}/{code_key}"},
            region=parts.region,
            # in the local job record: where status, logs and resume find the job again
            record={"stack": where.stack, "bucket": where.bucket, "prefix": parts.prefix},
            lease=LeaseTarget(
                where.lineage,
                where.checkpoint_uri,
                parts.region,
                attempt=where.attempt,
                extra=(("bucket", where.bucket), ("prefix", parts.prefix)),
                submit_creates=where.bucket,
            )
            if where.resolved  # the stack's bucket and the lineage are AWS's answers (preflight)
            else None,
            payload=Ec2Payload(
                bundle=bundle,
                parts=parts,
                code_key=code_key,
                where=where,
                role=role,
                description=description,
                job_json=job_json,
                network=network_requests,
                recovery=lineage_requests or None,
            ),
        )

    def preflight(self, plan: Plan) -> Plan:
        """The plan checked against AWS (read-only calls): the stack's resources, the AMI, a
        subnet (and other zones'), a resumed job's lineage, the bucket, the vCPU quota."""
        from distrain_cloud.infra import aws

        spec, found = plan.spec, payload_of(plan)
        parts = found.parts
        region = aws.region(spec.region)  # a real submit needs a configured region, not an assumed one
        if region != parts.region:
            raise UserError(f"the plan was made for {parts.region} but the region is {region}; plan again")
        checks = [c for c in plan.checks if c.ok is not None]
        stack = records.stack_resources(spec.stack, region)
        checks.append(
            Check(f"stack {spec.stack}", True, f"bucket {stack.bucket}, the VPC of {stack.security_group_id}")
        )
        with aws.translate_errors():
            ami_id = spec.ec2.ami_id or preflight.resolve_ami(parts.ami_parameter, region)
            root_device = preflight.check_image(ami_id, region, plan, checks)
            subnets, vpc, public_ip = preflight.choose_subnets(
                spec.ec2.subnet_id, stack.security_group_id, parts, region, checks
            )
            facts = preflight.network_facts(parts.instance_type, region)
            lineage, attempt, checkpoint_uri = parts.job_name, 1, ""
            if spec.resume_from:
                lineage, attempt, checkpoint_uri = preflight.previous_attempt(
                    spec.resume_from, stack.bucket, parts, checks
                )
        where = Where(
            stack=spec.stack,
            bucket=stack.bucket,
            instance_profile=parts.job_name,
            security_group=GROUP_PLACEHOLDER,  # the job's own, made at submit
            log_group=stack.log_group,
            ami_id=ami_id,
            root_device=root_device or parts.family.root_device,
            subnets=subnets,
            placement_group=parts.job_name if parts.placement else None,
            lineage=lineage,
            attempt=attempt,
            checkpoint_uri=checkpoint_uri,
            account=stack.account,
            partition=stack.partition,
            boundary=stack.job_boundary_arn,
            secret_prefix=stack.secret_prefix,
            ssm=stack.ssm,
            vpc=vpc,
            network=facts,
            public_ip=public_ip,
        )
        placed = self._place(dataclasses.replace(plan, checks=checks), where, parts, found.code_key, found.bundle)
        placed = spot_price.with_current_spot_price(placed, spec, region)  # a spot job's price now
        placed = budget.apply(placed, spec, region)
        extra = [
            cloud.bucket_check(
                stack.bucket,
                region,
                named_by_user=True,
                fix="the stack's bucket is gone: run `distrain-cloud infra up`",
            ),
            quotas.ec2_vcpu_check(spec, region),  # counts what already runs
        ]
        return dataclasses.replace(placed, checks=placed.checks + extra)

    # ------------------------------------------------------------------ act

    def submit(self, plan: Plan, *, wait: bool = False) -> int:
        from botocore.exceptions import BotoCoreError, ClientError

        from distrain_cloud.infra import aws

        payload = payload_of(plan)
        where, parts, role = payload.where, payload.parts, payload.role
        if not where.resolved:
            raise UserError("this plan was not checked against AWS (preflight); plan it again without --dry-run")
        refuse_failed_checks(plan)
        uploaded = cloud.upload_code(parts.region, where.bucket, payload.code_key, payload.bundle)
        key = layout.job_key(parts.prefix, parts.job_name, layout.JOB_JSON)
        job_role.create(role)  # the job's own identity first: nothing below runs without it
        try:
            with aws.translate_errors():
                # Written before RunInstances: every instance that may exist has its description. The
                # launcher's own copy (out of the job role's reach) is what status and resume trust;
                # the job's copy is what its nodes read, pinned by its sha256 in the user data.
                s3 = aws.client("s3", parts.region)
                for at in (layout.submitted_key(parts.prefix, parts.job_name), key):
                    s3.put_object(
                        Bucket=where.bucket,
                        Key=at,
                        Body=payload.job_json,  # exactly the bytes whose sha256 the user data pins
                        ContentType="application/json",
                    )
            # The job's own security group (AWS names its id: the requests get it) and placement group.
            plan = network.with_group(plan, network.create(plan))
            where, lineage = payload_of(plan).where, payload_of(plan).recovery
            if lineage:
                ids = recovery.launch(lineage, parts.region, parts.job_name)
            else:
                ids = launch(plan.request, where, parts)
        except BaseException as e:
            # The request may have reached AWS and only its answer been lost (a read timeout, a
            # Ctrl-C): instances without their role, or a lineage without its lease, would run unseen.
            running = started_anyway(plan)
            if running == []:
                cloud.retire_role_quietly(role.name)  # nothing was launched: its role goes too
                network.retire(parts.region, parts.job_name, placement_group=parts.placement)  # and its network
                raise
            lineage_launched(plan)  # they (may) run: the role and the lineage's lease stay theirs
            what = f"({', '.join(running)})" if running else "(could not check whether anything started)"
            if running and parts.recovering and not recovery.finish_group(plan):
                what += (
                    " perhaps without its hard stop at max-run and AZRebalance suspended"
                    " (cancel it unless it should run)"
                )
            print(
                f"note: {plan.job_name} runs on AWS {what} although the launch did not complete: "
                f"`distrain-cloud status {plan.job_name}` follows it, `distrain-cloud cancel {plan.job_name}` stops it",
                file=sys.stderr,
            )
            if isinstance(e, BotoCoreError) and not isinstance(e, ClientError):  # a lost answer: one line
                raise UserError(f"no answer from AWS to the launch of {plan.job_name} ({e})") from e
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
        # AWS relaunches a recovering lineage itself: this follows it to its end. A plain spot job
        # that was interrupted ends Interrupted here; api.submit_job resumes it (relaunches_interrupted).
        return wait_for(self, JobRef(plan.job_name, self.name, parts.region))

    def relaunches_interrupted(self, plan: Plan) -> bool:
        """Whether `submit --wait` resumes this plan's job, on new instances, when it ends Interrupted:
        a spot job whose lineage AWS does not keep going itself (recovery.py)."""
        return bool(plan.spec.spot) and not payload_of(plan).parts.recovering

    # ------------------------------------------------------------------ lifecycle

    def status(self, job: JobRef) -> dict[str, Any]:
        return self._status(job, *records.described(job))

    def _status(
        self, job: JobRef, region: str, bucket: str, prefix: str, description: dict[str, Any]
    ) -> dict[str, Any]:
        from distrain_cloud.infra import aws

        if recovery.is_lineage(description):
            info = recovery.lineage_status(job.name, region, bucket, prefix, description)
            recovery.retire_when_done(region, job.name, info)
            retire_role_when_done(job.name, description, info, [{"state": s} for s in info["instances"].values()])
            return _with_clock(info, region, bucket, prefix, job.name, description)
        with aws.translate_errors():
            found = job_files(aws.client("s3", region), bucket, prefix, job.name)
        instances = tagged_instances(region, job.name).get(job.name, [])
        info = job_status(description, found, instances, now=time.time())
        retire_role_when_done(job.name, description, info, instances)
        return _with_clock(info, region, bucket, prefix, job.name, description)

    def list_jobs(self, *, region: str | None, workdir: Path, limit: int) -> list[dict[str, Any]]:
        from distrain_cloud.infra import aws

        from ...logs import printable

        region = aws.region(region)
        rows = []
        with aws.translate_errors():
            s3 = aws.client("s3", region)
            instances = tagged_instances(region)
            names: list[tuple[str, str, str]] = []
            for bucket, prefix in records.places(region):
                names += [(n, bucket, prefix) for n in job_names(s3, bucket, prefix)]
            names.sort(key=lambda item: created_key(item[0]), reverse=True)
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
        region, bucket, prefix, description = records.described(job)
        if not description.get("log_group"):
            where = f"s3://{bucket}/{layout.job_key(prefix, job.name, layout.JOB_JSON)}"
            raise bad_record(where, "it names no log group, so its logs cannot be found")
        done: Callable[[], bool] = (lambda: bool(self.status(job)["terminal"])) if follow else (lambda: True)
        return cloud.log_lines(region, description["log_group"], job.name, lambda s: s.split("/", 1)[-1], done)

    def cancel(self, job: JobRef, *, now: bool = False) -> str:
        """Graceful: the stop marker every node agent watches; each node checkpoints, uploads and ends
        (`now`: `cancel_now`, the instances terminated at once).

        Only a live agent acts on the marker, so cancel waits up to CANCEL_ANSWER_S (records.py) for each live
        instance's agent to answer (its record moves) and terminates those that did not: with the
        laptop closed right after, nothing is left waiting for the hard stop (max-run + 10 min)."""
        from distrain_cloud.infra import aws

        if now:
            return self.cancel_now(job)
        region, bucket, prefix, description = records.described(job)
        if recovery.is_lineage(description):
            return _cancel_lineage(job)
        s3 = aws.client("s3", region)
        info = self._status(job, region, bucket, prefix, description)
        alive = sorted(i for i, state in info["instances"].items() if state in ALIVE_STATES)
        if info["terminal"]:
            if not alive:
                return f"{job.name} already ended: {info['status']}"
            records.terminate(region, alive)  # no agent is left to end them (a node that never started, say)
            return f"{job.name} already ended ({info['status']}); terminated what still ran: {', '.join(alive)}"
        with aws.translate_errors():
            before = records.record_etags(s3, bucket, prefix, job.name)
            records.write_stop(job, "cancel")
            if alive:
                print(
                    f"note: waiting up to {records.CANCEL_ANSWER_S} s for the node agents to answer the stop",
                    file=sys.stderr,
                )
            silent = records.unanswered(s3, bucket, prefix, job.name, region, before, records=job.name) if alive else []
        if not silent:
            return (
                f"stopping {job.name}: every node saves a checkpoint, uploads it and terminates "
                f"(distrain-cloud status {job.name}; `cancel {job.name} --now` terminates at once)"
            )
        records.terminate(region, silent)
        rest = len(alive) - len(silent)
        return (
            f"stopping {job.name}: no node agent answered the stop within {records.CANCEL_ANSWER_S} s on "
            f"{', '.join(silent)}: terminated them, without a checkpoint"
            + (f"; the other {rest} node(s) save a checkpoint and end" if rest > 0 else "")
        )

    def cancel_now(self, job: JobRef) -> str:
        """Terminate the job's instances at once (no checkpoint); the stop marker tells any node
        still starting not to begin."""
        from distrain_cloud.infra import aws

        region = aws.region(job.region)
        if recovery.is_lineage(records.described(job)[3]):
            return _cancel_lineage(job, now_=True)
        alive = [i["id"] for i in tagged_instances(region, job.name).get(job.name, []) if i["state"] in ALIVE_STATES]
        records.write_stop(job, "cancel")
        if not alive:
            cloud.retire_role_quietly(job.name)
            return f"{job.name} has no running instance"
        with aws.translate_errors():
            aws.client("ec2", region).terminate_instances(InstanceIds=alive)
        return f"terminating {len(alive)} instance(s) of {job.name} ({', '.join(alive)}): no checkpoint is saved"

    def fetch_outputs(self, job: JobRef, dest: Path) -> dict[str, Any]:
        """Rank 0's node agent uploads the output folder (and, when training completed, the model
        folder) as plain files when the job ends: output_uri and model_uri of its description."""
        region, bucket, prefix, description = records.described(job)  # once: the status and the output's place
        info = self._status(job, region, bucket, prefix, description)
        output = description["output_uri"]
        if recovery.is_lineage(description) and info.get("attempts"):
            # each attempt's rank 0 uploads to the attempt's own folder (agent/elastic.py): the last one's
            output = layout.attempt_output_uri(output, int(info["attempt"]))
        return cloud.fetch_outputs(job.name, info, region, dest, output=output, model=description["model_uri"])

    def find(self, name: str, region: str | None) -> JobRef | None:
        """None: EC2 cannot look a job up by name alone (its records are under the stack's S3 prefix,
        which only the job's record or `--backend ec2` with the stack's default leads to)."""
        return None

    def holder_state(self, holder: dict[str, Any]) -> tuple[bool, str] | None:
        """(ended, status) of the job holding a lineage's lease (launcher/lease.py), read where its
        lease says it lives; None when there is no such job there (yet)."""
        from distrain_cloud.infra import aws

        region, bucket, prefix, name = holder["region"], holder["bucket"], holder["prefix"], holder["job"]
        try:
            with aws.translate_errors():
                info = status_at(JobRef(name, "ec2", region), bucket, prefix)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise UserError(f"its job.json is malformed ({type(e).__name__})") from None
        return None if info is None else (bool(info["terminal"]), str(info["status"]))

    def job_spec(self, job: JobRef) -> JobSpec | None:
        """The spec job `job` was submitted with, from its job description in S3 (for `resume`
        from a machine that has no record of it)."""
        from pydantic import ValidationError

        from ...spec import JobSpec

        description = records.described(job)[3]
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


# ---------------------------------------------------------------------- launch


def launch(request: dict[str, Any], where: Where, parts: Parts) -> list[str]:
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
    records.put_json(
        parts.region,
        where.bucket,
        layout.job_key(parts.prefix, parts.job_name, layout.LAUNCH),
        {"status": "Failed", "reason": "no capacity", "subnets": tried, "time": time.time()},
    )
    raise UserError(
        f"AWS has no capacity for {parts.nodes} x {parts.instance_type} right now (tried subnet(s) "
        f"{', '.join(tried)}); nothing was launched: retry later, with fewer nodes, another region"
        + (" or on-demand" if parts.spot else " or --spot")
    )


def started_anyway(plan: Plan) -> list[str] | None:
    """What AWS runs for `plan`'s job after a launch that failed or whose answer was lost: its
    instances (by the job tag its RunInstances or launch template sets) and, for a lineage, its
    Auto Scaling group; [] when nothing; None when that could not be looked up."""
    from distrain_cloud.infra import aws

    parts, name = payload_of(plan).parts, plan.job_name
    try:
        found = [i["id"] for i in tagged_instances(parts.region, name).get(name, [])]
        if parts.recovering:
            asg = aws.client("autoscaling", parts.region, max_attempts=3)
            if asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]:
                found.insert(0, f"Auto Scaling group {name}")
    except Exception:  # unreachable, throttled: unknown, so keep what a running job needs
        return None
    return found


def _profile_not_yet_seen(e: Exception) -> bool:
    """RunInstances' answer while EC2 does not yet see an instance profile IAM just made."""
    from distrain_cloud.infra import aws

    message = aws.error_message(e).lower().replace(" ", "")
    return aws.error_code(e) == "InvalidParameterValue" and "iaminstanceprofile" in message


# ---------------------------------------------------------------------- the job's role


def _job_role(parts: Parts, where: Where, *, lineage_group: bool, on_demand: bool) -> JobRole:
    """The job's own IAM role: its S3 prefixes, its bundle, its secrets, its instances (and a
    lineage's own Auto Scaling group), nothing of another job's."""
    from ...bundle import bundle_key

    return cloud.refuse_role_problems(
        job_role.for_job_at(
            "ec2",
            partition=where.partition,
            region=parts.region,
            account=where.account,
            stack=where.stack,
            bucket=where.bucket,
            prefix=parts.prefix,
            job=parts.job_name,
            lineage=where.lineage,
            boundary_arn=where.boundary,
            log_group=where.log_group,
            code_key=bundle_key(parts.prefix, parts.code_sha256),
            secrets=[reference for _, reference in parts.secrets],
            ssm=where.ssm,
            group=lineage_group,
            on_demand_fallback=lineage_group and on_demand,
        )
    )


def _isolation_check(role: JobRole, parts: Parts, where: Where) -> Check:
    own = f"{layout.job_key(parts.prefix, parts.job_name)}/, {parts.prefix}/checkpoints/{where.lineage}/"
    return Check(
        "job role isolates the job",
        True,
        f"{role.path}{role.name}: {own} (read-write), its own code bundle and secrets (read), its own instances; "
        "made at submit",
    )


def _network_checks(parts: Parts, where: Where) -> list[Check]:
    """What the plan says of the job's own network: its security group, its zone and placement
    group, its EFA interfaces."""
    checks = [
        Check(
            "security group: the job's own",
            True,
            f"{network.group_name(parts.job_name)} in {where.vpc}: all traffic between its nodes, HTTPS out, "
            "nothing else in; made at submit, deleted with the job",
        )
    ]
    if parts.nodes > 1:
        place = f"cluster placement group {where.placement_group} (the job's own)" if where.placement_group else ""
        checks.append(
            Check("zone: one for all nodes", True, f"one subnet per launch; {place or 'no placement group'}".rstrip())
        )
    if parts.efa:
        checks.append(Check("EFA", True, _bandwidth(parts, where)))
    return checks


def _bandwidth(parts: Parts, where: Where) -> str:
    from ...catalog import network_facts
    from .request import efa_interfaces

    facts = where.network or network_facts(parts.instance_type)
    return network.bandwidth(parts.nodes, facts, efa_interfaces(parts, where), where.public_ip)


def retire_role_when_done(
    name: str, description: dict[str, Any], info: dict[str, Any], instances: list[dict[str, Any]]
) -> None:
    """Delete job `name`'s role once the job has ended and none of its instances can still use it.

    The name is the launcher's own (never job.json's: the job may rewrite that file, and must not
    be able to point the launcher at another job's role); job.json only says whether it has one."""
    holding = set(ALIVE_STATES) | {"shutting-down"}
    if description.get("role") and info["terminal"] and not any(i["state"] in holding for i in instances):
        cloud.retire_role_quietly(name)
    network.retire_when_done(name, description, info, holding=any(i["state"] in holding for i in instances))


# ---------------------------------------------------------------------- status and cancel


def _with_clock(
    info: dict[str, Any], region: str, bucket: str, prefix: str, name: str, description: dict[str, Any]
) -> dict[str, Any]:
    """`info` with the nodes' cost clock against --max-cost, for a capped job (budget.py)."""
    line = budget.clock_status(region, bucket, prefix, name, description)
    return {**info, "max_cost": line} if line else info


def _hard_stop_at(parts: Parts) -> int:
    """The epoch at which every node of the job stops, whenever it booted."""
    return math.ceil(parts.submitted + parts.max_run) + HARD_STOP_GRACE_MIN * 60


def _cancel_lineage(job: JobRef, now_: bool = False) -> str:
    """Stop the lineage, not only the live attempt: the group launches nothing more, the lineage's
    stop marker keeps any node that still boots from starting, and the live attempt's nodes save a
    checkpoint and leave (with `now_`, the group and its instances are deleted at once)."""
    from distrain_cloud.infra import aws

    region, bucket, prefix, description = records.described(job)
    root = layout.job_key(prefix, job.name)
    marker = {"reason": "cancel", "by": "launcher", "time": time.time()}
    with aws.translate_errors():
        s3 = aws.client("s3", region)
        numbers = recovery.attempt_numbers(s3, bucket, root)
        live = layout.attempt_job(job.name, numbers[-1]) if numbers else None
        before = records.record_etags(s3, bucket, prefix, live) if live else {}
        s3.put_object(
            Bucket=bucket, Key=layout.job_key(prefix, job.name, layout.STOP), Body=json.dumps(marker).encode()
        )
        if numbers:
            s3.put_object(
                Bucket=bucket,
                Key=layout.attempt_key(prefix, job.name, numbers[-1], layout.STOP),
                Body=json.dumps(marker).encode(),
            )
        asg = aws.client("autoscaling", region)
        try:
            if now_:
                asg.delete_auto_scaling_group(AutoScalingGroupName=job.name, ForceDelete=True)
            else:
                asg.suspend_processes(AutoScalingGroupName=job.name, ScalingProcesses=["Launch"])
        except Exception as e:
            if "not found" not in str(e).lower() and "ValidationError" not in str(e):
                raise
    if now_:
        alive = [
            i["id"]
            for i in tagged_instances(region, job.name).get(job.name, [])
            if i["state"] in ("pending", "running")
        ]
        if alive:
            records.terminate(region, alive)
        return f"stopping lineage {job.name} at once: its Auto Scaling group and {len(alive)} instance(s) are deleted"
    # Only a live agent acts on the markers: with the laptop closed right after, a node whose agent
    # is dead would run until the hard stop. Wait for each to answer, as a plain job's cancel does.
    print(f"note: waiting up to {records.CANCEL_ANSWER_S} s for the node agents to answer the stop", file=sys.stderr)
    # The live attempt's records answer; a waiting or booting node sees the lineage's stop and ends.
    with aws.translate_errors():
        silent = records.unanswered(s3, bucket, prefix, job.name, region, before, records=live)
    said = (
        f"stopping lineage {job.name}: its Auto Scaling group launches nothing more; the nodes of the live "
        f"attempt save a checkpoint and end (distrain-cloud status {job.name}; `cancel {job.name} --now` "
        "ends them at once)"
    )
    if not silent:
        return said
    _leave_group(region, silent)
    return (
        f"{said}; no node agent answered the stop within {records.CANCEL_ANSWER_S} s on {', '.join(silent)}: "
        "terminated them, without a checkpoint"
    )


def _leave_group(region: str, ids: list[str]) -> None:
    """Terminate `ids` out of the group, lowering its desired capacity: nothing replaces them."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    asg = aws.client("autoscaling", region)
    for instance in ids:
        try:
            asg.terminate_instance_in_auto_scaling_group(InstanceId=instance, ShouldDecrementDesiredCapacity=True)
        except ClientError:  # no longer in the group (it left meanwhile): an ordinary terminate
            records.terminate(region, [instance])


def status_at(job: JobRef, bucket: str, prefix: str) -> dict[str, Any] | None:
    """Job `job`'s status, read from (bucket, prefix) in its region, as `status` shows it; None when
    there is no such job there (yet). For callers that know where the job lives (holder_state, for the lease)."""
    from distrain_cloud.infra import aws

    region = str(job.region)
    description = read_description(aws.client("s3", region), bucket, prefix, job.name)
    if description is None:
        return None
    return BACKEND._status(job, region, bucket, prefix, description)


BACKEND = Ec2Backend()
