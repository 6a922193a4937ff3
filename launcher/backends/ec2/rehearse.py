"""`distrain-cloud rehearse spot`: the smallest real spot lineage on the user's own account, one
node interrupted, recovery and clean-up checked, its cost printed.

What it does, in order (docs/ec2.md, "Rehearse on your account"):
1. plans a spot lineage of 2 nodes of the cheapest GPU type the EC2 backend takes in the region
   (a tiny model built from a config, a few hundred steps, `--max-restarts 1`, a short max-run and
   a small `--max-cost`) through the same `plan_job` as `submit`, so the plan's worst case is the
   rehearsal's bound, shown before anything is made;
2. submits it with `submit_job` and waits until both nodes train (their records in S3);
3. interrupts one node: AWS Fault Injection Service's `aws:ec2:send-spot-instance-interruptions`
   (the real 2-minute spot notice, then the reclaim; FIS assumes a role the user names), or a plain
   TerminateInstances (`interrupt="terminate"`);
4. checks recovery with the backend's `status`: attempt 1 ends interrupted, a new attempt starts,
   its nodes restore the lineage's checkpoint (the node agent's log says so), the job completes;
5. checks clean-up by the job's tags and names (instances, Auto Scaling group, launch template, job
   role, job security group), as `status` retires them, then cleans up itself whatever is left
   (cancel + retire): on a failed check, an exception or Ctrl-C too;
6. prints what it billed: each instance found by the job's tag, from its launch to its
   termination, at the price the plan used.

Every wait is bounded (WAITS_S); the clock is injectable, so tests drive the same function on a
simulated clock (tests/launcher/backends/ec2/test_rehearse.py, on moto and tests/awsrules.py).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from distrain_cloud.infra.errors import UserError

from ...plan import Check
from .request import payload_of

if TYPE_CHECKING:
    from ...plan import JobRef, Plan
    from ...spec import JobSpec

INTERRUPTS = ("fis", "terminate")
NODES = 2
MAX_RUN = "45m"  # the lineage's hard stop: submit + 45 min (+ the backend's grace)
MAX_COST_USD = 3.0  # refused at plan time above this
# A tiny GPT-2 from its config (no download) on the builtin corpus. Its speed on the nodes was not
# measured (a guess: tens of steps a second on a T4): enough steps to be seen training and
# interrupted (the FIS action starts within a minute or so), few enough to end within max-run on the
# replacement; `--steps` changes it, and a job that ends before the reclaim says so.
STEPS = 10000
TRAIN_ARGS = ("--task", "causal-lm", "--preset", "tiny-gpt2", "--dataset", "builtin:corpus", "--save-every", "500")
# The FIS action and its one parameter (FIS User Guide, "Amazon EC2 actions",
# aws:ec2:send-spot-instance-interruptions): the notice comes at once, the reclaim this long after.
FIS_ACTION = "aws:ec2:send-spot-instance-interruptions"
FIS_NOTICE = "PT2M"
# The bound on each wait, in seconds: a DLAMI node boots and installs in 5-10 min; the reclaim comes
# 2 min after the notice; a replacement boots as the first ones did.
WAITS_S = {"training": 1500.0, "interrupted": 600.0, "new attempt": 1500.0, "completed": 1500.0, "clean-up": 900.0}
POLL_S = 15.0
ALIVE = ("pending", "running", "stopping", "stopped")  # billed, or able to be


class Clock(Protocol):
    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class Options:
    """What `distrain-cloud rehearse spot` takes."""

    region: str | None = None
    instance: str | None = None  # default: the cheapest GPU type the EC2 backend takes there
    interrupt: str = "fis"
    fis_role: str | None = None  # name or ARN of the role FIS assumes
    steps: int = STEPS
    max_cost: float = MAX_COST_USD
    stack: str | None = None


@dataclass
class Rehearsal:
    """A planned rehearsal: the job's plan and the interruption's request (with the instance and
    account as placeholders until the node is known)."""

    plan: Plan
    options: Options
    fis_request: dict[str, Any] | None

    @property
    def job(self) -> JobRef:
        from ...plan import JobRef

        return JobRef(self.plan.job_name, "ec2", self.plan.region)

    def render(self, *, full: bool = False) -> str:
        """The plan as `submit --dry-run` prints it (`full`), else up to its checks; then the bound."""
        shown = self.plan.render() if full else self.plan.render().split("\nrequest:", 1)[0]
        cost = self.plan.cost or {}
        worst = cost.get("worst_case_usd")
        how = (
            f"AWS FIS ({FIS_ACTION}, role {self.options.fis_role})"
            if self.fis_request
            else "TerminateInstances (no spot notice)"
        )
        lines = [
            shown,
            "rehearsal:",
            f"  interrupts one node once both train, with {how}; checks recovery, completion and clean-up",
            f"  costs at most ${worst:.2f} ({cost.get('basis', '?')}): {NODES} nodes for max-run {MAX_RUN}, "
            "whatever fails; it cleans up everything it made, on a failure or Ctrl-C too"
            if worst is not None
            else "  no price is known for this type here: the bound is max-run x 2 nodes",
        ]
        return "\n".join(lines)


@dataclass
class Outcome:
    job_name: str
    checks: list[Check] = field(default_factory=list)
    instance_hours: float = 0.0
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)  # every instance of the job seen
    price_per_hour: float | None = None  # per node, as the plan used it
    left: list[str] = field(default_factory=list)  # what the rehearsal's own clean-up could not remove

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def billed_usd(self) -> float | None:
        return None if self.price_per_hour is None else self.instance_hours * self.price_per_hour

    def render(self) -> str:
        lines = [f"{'PASS' if c.ok else 'FAIL'} {c.name}" + (f": {c.detail}" if c.detail else "") for c in self.checks]
        usd = self.billed_usd
        price = f" at ${self.price_per_hour:.4g}/h = ${usd:.2f}" if usd is not None else " (no price known)"
        lines.append(f"billed: {self.instance_hours:.3f} instance-hours of {self.job_name}{price}")
        if self.left:
            lines.append("left behind, delete by hand: " + ", ".join(self.left))
        lines.append("rehearsal " + ("passed" if self.ok else "FAILED"))
        return "\n".join(lines)


class _RealClock:
    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


REAL_CLOCK: Clock = _RealClock()


# ---------------------------------------------------------------------- plan


def cheapest_gpu_type(region: str) -> str:
    """The cheapest GPU type of the catalog the EC2 backend takes, by its list price in `region`."""
    from ...catalog import all_instances, hourly_price

    priced = []
    for i in all_instances():
        if not i.gpus or i.sagemaker:
            continue
        with contextlib.suppress(UserError):
            price = hourly_price(i, region)
            if price is not None:
                priced.append((price, i.name))
    if not priced:
        raise UserError(f"--region {region}: the catalog has no GPU type with a price there; name one with --instance")
    return min(priced)[1]


def rehearsal_spec(options: Options, region: str) -> JobSpec:
    from ...spec import load_spec

    if options.interrupt not in INTERRUPTS:
        raise UserError(f"--interrupt {options.interrupt}: expected one of {', '.join(INTERRUPTS)}")
    if options.interrupt == "fis" and not options.fis_role:
        raise UserError(
            "--interrupt fis needs --fis-role ROLE: a role that trusts fis.amazonaws.com with "
            "ec2:SendSpotInstanceInterruptions and ec2:DescribeInstances (docs/ec2.md); or --interrupt terminate"
        )
    if options.steps < 100:
        raise UserError(f"--steps {options.steps}: at least 100, so that a node can be seen training and interrupted")
    overrides = {
        "instance": options.instance or cheapest_gpu_type(region),
        "backend": "ec2",
        "nodes": NODES,
        "spot": True,
        "max_run": MAX_RUN,
        "max_cost": options.max_cost,
        "ec2.max_restarts": 1,
        "name": "rehearse",
        "region": region,
        "stack": options.stack,
        "train_args": [*TRAIN_ARGS, "--max-steps", str(options.steps)],
    }
    return load_spec(None, overrides)


def plan_rehearsal(options: Options, *, dry_run: bool = False) -> Rehearsal:
    """The rehearsal's plan: the job's (checked against AWS unless `dry_run`) and the FIS request,
    checked against FIS's API model, with placeholders for the node and the account."""
    from ...api import plan_job
    from ..cloud import plan_region

    region = options.region or plan_region(None)[0]
    plan = plan_job(rehearsal_spec(options, region), dry_run=dry_run)
    fis = None
    if options.interrupt == "fis":
        fis = fis_template_request(plan, "i-0123456789abcdef0", str(options.fis_role))
        _refuse_fis_problems(fis)
    return Rehearsal(plan, options, fis)


def fis_template_request(plan: Plan, instance_id: str, role: str) -> dict[str, Any]:
    """CreateExperimentTemplate for one spot node of `plan`'s job: its interruption notice now,
    its reclaim FIS_NOTICE later (FIS User Guide, "Amazon EC2 actions")."""
    where = payload_of(plan).where
    partition = where.partition or "aws"
    account = where.account or "<account>"
    region = payload_of(plan).parts.region
    role_arn = role if role.startswith("arn:") else f"arn:{partition}:iam::{account}:role/{role}"
    name = plan.job_name
    return {
        "clientToken": f"{name}-interrupt"[:64],
        "description": f"distrain-cloud rehearse: interrupt one spot node of {name}",
        "targets": {
            "SpotNode": {
                "resourceType": "aws:ec2:spot-instance",
                "resourceArns": [f"arn:{partition}:ec2:{region}:{account}:instance/{instance_id}"],
                "selectionMode": "ALL",
            }
        },
        "actions": {
            "Interrupt": {
                "actionId": FIS_ACTION,
                "parameters": {"durationBeforeInterruption": FIS_NOTICE},
                "targets": {"SpotInstances": "SpotNode"},
            }
        },
        "stopConditions": [{"source": "none"}],
        "roleArn": role_arn,
        "tags": {"distrain-cloud:job": name, "distrain-cloud:stack": plan.spec.stack},
    }


def _refuse_fis_problems(request: dict[str, Any]) -> None:
    from ..cloud import refuse_api_problems

    sources = (("roleArn", "--fis-role"), ("targets", "the interrupted node"))
    refuse_api_problems("fis", "CreateExperimentTemplate", request, sources, "AWS FIS")


# ---------------------------------------------------------------------- act


def run_rehearsal(
    rehearsal: Rehearsal, *, clock: Clock = REAL_CLOCK, say: Callable[[str], None] | None = None
) -> Outcome:
    """Submit, interrupt, check; then clean up whatever happened (Ctrl-C included) and bill."""
    from ...api import submit_job

    say = say or (lambda line: print(line, file=sys.stderr))
    plan, job = rehearsal.plan, rehearsal.job
    outcome = Outcome(plan.job_name, price_per_hour=_price_per_node(plan))
    started = clock.time()
    experiment: list[str] = []  # the FIS template made, to delete
    try:
        submit_job(plan)
        _rehearse(rehearsal, outcome, experiment, clock, say)
    except (Exception, KeyboardInterrupt) as e:  # a FAIL line, after the clean-up and the bill
        why = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else str(e) or type(e).__name__
        outcome.checks.append(Check("the rehearsal ran to its end", False, f"stopped by {why}"))
    finally:
        _clean_up(rehearsal, outcome, experiment, clock, say)
        outcome.instance_hours = billed_seconds(job, clock.time(), outcome.instances) / 3600
        say(f"rehearsal took {(clock.time() - started) / 60:.1f} min")
    return outcome


class _Ended(Exception):
    """The job ended while the rehearsal waited for something else."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(f"the job ended first ({info['status']}: {info.get('detail') or 'no detail'})")


class _Watch:
    """The job's status as `status` gives it, each change said once (the rehearsal's progress)."""

    def __init__(self, job: JobRef, say: Callable[[str], None], seen: dict[str, dict[str, Any]]) -> None:
        self.job, self.say, self.last, self.seen = job, say, "", seen

    def status(self) -> dict[str, Any]:
        from .backend import BACKEND

        info = BACKEND.status(self.job)  # which also retires an ended lineage's group, template and role
        billed_seconds(self.job, 0.0, self.seen)  # every instance, while EC2 still lists it
        line = f"{info['status']}, attempt {info.get('attempt')}: {info.get('detail') or ''}".rstrip(": ")
        if line != self.last:
            self.say(f"status: {line}")
            self.last = line
        return info

    def training(self, after: int = 0) -> tuple[dict[int, dict[str, Any]], int] | None:
        """(records, attempt) once every node of the live attempt (past `after`) trains; _Ended
        when the job ended first."""
        info = self.status()
        if info["terminal"]:
            raise _Ended(info)
        attempt = int(info.get("attempt") or 0)
        if attempt <= after:
            return None
        records = _attempt_records(self.job, attempt)
        training = {r: rec for r, rec in records.items() if rec.get("phase") == "training" and rec.get("instance_id")}
        return (training, attempt) if len(training) == NODES else None

    def ended(self) -> dict[str, Any] | None:
        info = self.status()
        return info if info["terminal"] else None


def _rehearse(r: Rehearsal, out: Outcome, experiment: list[str], clock: Clock, say: Callable[[str], None]) -> None:
    job, checks, watch = r.job, out.checks, _Watch(r.job, say, out.instances)
    try:
        records = _wait(clock, "training", watch.training, say)
    except _Ended as e:
        records, why = None, str(e)
    else:
        why = f"not within {WAITS_S['training']:.0f} s"
    checks.append(
        Check(
            f"both nodes train (attempt {records[1] if records else '?'})",
            records is not None,
            _steps(records[0]) if records else why,
        )
    )
    if records is None:
        return
    nodes, first = records
    victim = str(nodes[max(nodes)]["instance_id"])  # the last rank: a worker, not the main node
    say(f"interrupting {victim} (node {max(nodes)}) with {r.options.interrupt}")
    failed = _interrupt(r, victim, experiment)
    gone = None if failed else _wait(clock, "interrupted", lambda: _ended(job, victim, experiment), say)
    failed = failed or (gone if isinstance(gone, str) else None if gone else "it still runs")
    checks.append(Check(f"node {victim} interrupted", not failed, failed or "it was reclaimed"))
    if failed:
        return
    try:
        later = _wait(clock, "new attempt", lambda: watch.training(after=first), say)
        why = f"none within {WAITS_S['new attempt']:.0f} s"
    except _Ended as e:  # completed before the interruption landed: more --steps
        later, why = None, f"{e}; a job that completes before the reclaim needs more --steps"
    checks.append(
        Check(
            "a new attempt starts",
            later is not None,
            f"attempt {later[1]} trains: {_steps(later[0])}" if later else why,
        )
    )
    if later is None:
        return
    info = _wait(clock, "completed", watch.ended, say)
    status = info["status"] if info else "not ended"
    checks.append(Check("the job completes", status == "Completed", f"{status}: {info['detail']}" if info else status))
    restored = _restored_lines(job)
    checks.append(
        Check(
            "training resumed from the checkpoint",
            bool(restored),
            restored[0] if restored else "no node of a later attempt logged a restored checkpoint",
        )
    )


def _wait(clock: Clock, what: str, found: Callable[[], Any], say: Callable[[str], None]) -> Any:
    """`found()` once it is something, polled every POLL_S until WAITS_S[what]; None after that."""
    until = clock.time() + WAITS_S[what]
    say(f"waiting until {what} (at most {WAITS_S[what] / 60:.0f} min)")
    while True:
        value = found()
        if value:
            return value
        if clock.time() >= until:
            return None
        clock.sleep(POLL_S)


# ---------------------------------------------------------------------- what the job says


def _status(job: JobRef) -> dict[str, Any]:
    """The backend's status (which also retires an ended lineage's group, template and role)."""
    from .backend import BACKEND

    return BACKEND.status(job)


def _attempt_records(job: JobRef, attempt: int) -> dict[int, dict[str, Any]]:
    """The node records of attempt `attempt`, by rank, as the node agents wrote them."""
    from distrain_cloud.infra import aws

    from . import layout, status
    from .records import described

    region, bucket, prefix, _ = described(job)
    with aws.translate_errors():
        found = status.job_files(aws.client("s3", region), bucket, prefix, layout.attempt_job(job.name, attempt))
    return dict(found["nodes"])


def _terminal(job: JobRef) -> dict[str, Any] | None:
    info = _status(job)
    return info if info["terminal"] else None


def _steps(records: dict[int, dict[str, Any]]) -> str:
    return ", ".join(
        f"node {r} step {rec.get('step')} on {rec.get('instance_id')}" for r, rec in sorted(records.items())
    )


def _restored_lines(job: JobRef) -> list[str]:
    """The node agents' "restored <checkpoint> from ..." lines in the job's logs (a node of a later
    attempt restores what the interrupted one saved; the first attempt finds none)."""
    from .backend import BACKEND

    with contextlib.suppress(UserError):
        return [line.text() for line in BACKEND.log_lines(job) if " restored checkpoint" in f" {line.message}"]
    return []


# ---------------------------------------------------------------------- the interruption


def _interrupt(r: Rehearsal, instance_id: str, experiment: list[str]) -> str | None:
    """Interrupt `instance_id`; -> None when AWS took the request, else why not (one line)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from distrain_cloud.infra import aws

    region = payload_of(r.plan).parts.region
    try:
        if r.fis_request is None:
            aws.client("ec2", region).terminate_instances(InstanceIds=[instance_id])
            return None
        fis = aws.client("fis", region)
        request = fis_template_request(r.plan, instance_id, str(r.options.fis_role))
        _refuse_fis_problems(request)
        template = fis.create_experiment_template(**request)["experimentTemplate"]["id"]
        experiment.append(template)
        found = fis.start_experiment(clientToken=f"{r.plan.job_name}-start"[:64], experimentTemplateId=template)
        experiment.append(found["experiment"]["id"])
    except (ClientError, BotoCoreError, UserError) as e:
        return f"AWS refused the interruption: {e}"
    return None


def _ended(job: JobRef, instance_id: str, experiment: list[str]) -> bool | str | None:
    """True once `instance_id` no longer runs; why not, when the FIS experiment failed; else None."""
    from distrain_cloud.infra import aws

    from .status import tagged_instances

    if len(experiment) == 2:
        state = aws.client("fis", job.region).get_experiment(id=experiment[1])["experiment"].get("state", {})
        if state.get("status") in ("failed", "cancelled", "stopped"):
            return f"the FIS experiment {experiment[1]} {state['status']}: {state.get('reason', '')}"
    instances = tagged_instances(str(job.region), job.name).get(job.name, [])
    return any(i["id"] == instance_id and i["state"] not in ALIVE for i in instances) or None


# ---------------------------------------------------------------------- clean-up and cost


def leftovers(job: JobRef) -> list[str]:
    """What of the job AWS still has, found by the job's tag (instances, group, launch template,
    security group) and name (its IAM role): billed instances and everything `infra down` trips on."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra import aws

    from .request import TAG_PREFIX
    from .status import tagged_instances

    region, name = str(job.region), job.name
    by_tag = [{"Name": f"tag:{TAG_PREFIX}job", "Values": [name]}]
    left = [
        f"instance {i['id']} ({i['state']})"
        for i in tagged_instances(region, name).get(name, [])
        if i["state"] in ALIVE
    ]
    with aws.translate_errors():
        groups = aws.client("autoscaling", region).describe_auto_scaling_groups(Filters=by_tag)["AutoScalingGroups"]
        left += [f"Auto Scaling group {g['AutoScalingGroupName']}" for g in groups]
        ec2 = aws.client("ec2", region)
        left += [
            f"launch template {t['LaunchTemplateName']}"
            for t in ec2.describe_launch_templates(Filters=by_tag)["LaunchTemplates"]
        ]
        left += [
            f"security group {g['GroupId']}" for g in ec2.describe_security_groups(Filters=by_tag)["SecurityGroups"]
        ]
        try:
            aws.client("iam", region).get_role(RoleName=name)
            left.append(f"IAM role {name}")
        except ClientError as e:
            if aws.error_code(e) != "NoSuchEntity":
                raise
    return left


def _clean_up(r: Rehearsal, out: Outcome, experiment: list[str], clock: Clock, say: Callable[[str], None]) -> None:
    """Whatever happened: end the job if it still runs, check that it left nothing (as `status`
    retires it), then remove what is left itself and name anything it could not."""
    from . import recovery
    from .backend import BACKEND

    job, remaining = r.job, ["(not looked at)"]
    try:
        try:
            running = not _terminal(job)
        except UserError:  # no job description: the submit stopped before it launched anything
            running = False
        if running:
            say(f"ending {job.name}: cancel --now")
            BACKEND.cancel_now(job)
        # `status` retires an ended lineage's group, template and role once its instances are gone.
        cleared = _wait(clock, "clean-up", lambda: _cleared(job), say)
        remaining = [] if cleared else leftovers(job)
        out.checks.append(Check("nothing of the job is left", not remaining, "; ".join(remaining) or "by tag and name"))
    except Exception as e:  # the clean-up below still runs
        out.checks.append(Check("nothing of the job is left", False, f"not checked: {e}"))
    acts: list[Callable[[], object]] = [lambda: _delete_fis_template(job, experiment)]
    if remaining:  # the job's own clean-up did not finish: the rehearsal's own, each step idempotent
        acts += [
            lambda: BACKEND.cancel_now(job),
            lambda: recovery.retire_when_done(str(job.region), job.name, {"terminal": True, "instances": {}}),
            lambda: _retire_role(job.name),
        ]
    for act in acts:
        with contextlib.suppress(Exception):  # what stays is named below
            act()
    if remaining:
        with contextlib.suppress(Exception):
            out.left = leftovers(job)


def _cleared(job: JobRef) -> bool:
    with contextlib.suppress(UserError):  # no job description: only the tags can tell
        _status(job)  # as a user's `status` does: it retires what the ended lineage no longer needs
    return not leftovers(job)


def _retire_role(name: str) -> None:
    from ..cloud import retire_role_quietly

    retire_role_quietly(name)


def _delete_fis_template(job: JobRef, experiment: list[str]) -> None:
    from distrain_cloud.infra import aws

    if experiment:
        aws.client("fis", job.region).delete_experiment_template(id=experiment[0])


def billed_seconds(job: JobRef, now: float, seen: dict[str, dict[str, Any]] | None = None) -> float:
    """Instance-seconds of every instance with the job's tag, from its launch to its termination
    (to `now` while it runs): what EC2 bills per second for, terminated instances included. `seen`
    (instance id -> what DescribeInstances said) keeps the instances looked at before: EC2 lists a
    terminated instance for about an hour only, and a rehearsal may last longer."""
    from .status import tagged_instances

    found = {**(seen or {}), **{i["id"]: i for i in tagged_instances(str(job.region), job.name).get(job.name, [])}}
    if seen is not None:
        seen.update(found)
    total = 0.0
    for i in found.values():
        start = i.get("launched") or now
        end = now if i["state"] in ALIVE or not i.get("ended") else i["ended"]
        total += max(0.0, end - start)
    return total


def _price_per_node(plan: Plan) -> float | None:
    hourly = (plan.cost or {}).get("hourly_usd")
    return float(hourly) / NODES if isinstance(hourly, (int, float)) else None
