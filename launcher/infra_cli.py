"""`distrain-cloud infra up|status|down`: thin commands over infra/stack.py.

Nothing changes without the change set being shown first and a yes (a prompt, or --yes);
without a terminal and without --yes the commands refuse rather than guess. Errors are
UserErrors, printed as one line by the top-level CLI.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from distrain_cloud.infra import DEFAULT_STACK  # not from infra.stack: that import costs --help 7-9 ms

app = typer.Typer(
    help="The AWS resources distrain-cloud uses (bucket, roles, security group, log group), as one "
    "CloudFormation stack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


Stack = Annotated[str, typer.Option("--stack", help="CloudFormation stack name")]
Region = Annotated[str | None, typer.Option("--region", help="AWS region (default: AWS_REGION / profile)")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="do not ask before changing anything")]
Json = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _interactive() -> bool:
    return sys.stdin.isatty()


def _confirm(question: str, what: str) -> bool:
    """Ask `question`; without a terminal, refuse in one line naming --yes."""
    from distrain_cloud.infra.errors import UserError

    if not _interactive():
        raise UserError(f"`infra {what}` asks before changing anything and stdin is not a terminal: rerun with --yes")
    return typer.confirm(question, default=False)


def render_changes(plan: Any) -> str:
    lines = [f"change set for stack {plan.stack!r} in {plan.region} ({plan.change_type.lower()}):"]
    width_id = max([len(c.logical_id) for c in plan.changes] + [10])
    width_type = max([len(c.resource_type) for c in plan.changes] + [4])
    for c in plan.changes:
        replace = f"  replacement: {c.replacement}" if c.action == "Modify" and c.replacement else ""
        lines.append(f"  {c.action:8} {c.logical_id:{width_id}}  {c.resource_type:{width_type}}{replace}".rstrip())
    if not plan.changes:
        lines.append("  (no resource changes listed: parameters or outputs only)")
    for key, value in plan.parameters.items():
        lines.append(f"  parameter {key} = {value}")
    return "\n".join(lines)


@app.command()
def up(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show the change set, then delete it; change nothing")
    ] = False,
    yes: Yes = False,
    stack: Stack = DEFAULT_STACK,
    region: Region = None,
    vpc_id: Annotated[
        str | None,
        typer.Option("--vpc-id", help="VPC of the nodes' security group (default: the region's default VPC)"),
    ] = None,
    parameter: Annotated[
        list[str] | None,
        typer.Option("--parameter", help="KEY=VALUE template parameter, e.g. EnableSsm=true; repeatable"),
    ] = None,
) -> None:
    """Create or update the stack: show its change set, then execute it (runs again safely).
    --dry-run without AWS credentials shows the template's resources instead, offline."""
    from distrain_cloud.infra import stack as infra_stack

    offline = _not_set_up(region) if dry_run else None
    if offline:
        typer.echo(render_offline(stack, region, offline, vpc_id=vpc_id, parameters=_pairs(parameter)))
        return
    plan = infra_stack.plan_up(stack, region, vpc_id=vpc_id, parameters=_pairs(parameter))
    if plan.up_to_date:
        typer.echo(f"stack {stack!r} in {plan.region} is up to date: nothing to change")
        return
    typer.echo(render_changes(plan))
    try:
        proceed = not dry_run and (yes or _confirm("execute this change set?", "up"))
    except BaseException:  # a refusal or Ctrl-C at the prompt: leave no change set behind
        infra_stack.discard(plan)
        raise
    if not proceed:
        infra_stack.discard(plan)
        typer.echo("dry run: change set deleted, nothing changed" if dry_run else "nothing changed")
        return
    final = infra_stack.execute(plan)
    made = infra_stack.resources(stack, plan.region)
    typer.echo(f"stack {stack!r} in {plan.region}: {final}")
    typer.echo(
        f"  bucket:           {made.bucket}\n"
        f"  job boundary:     {made.job_boundary_arn} (each job gets its own role under it)\n"
        f"  security group:   {made.security_group_id}\n"
        f"  log group:        {made.log_group}\n"
        f"  launcher policy:  {made.launcher_policy_arn}"
    )
    typer.echo(
        "next: attach the launcher policy to whoever submits jobs "
        f"(`aws iam attach-user-policy --user-name NAME --policy-arn {made.launcher_policy_arn}`)"
    )


def _not_set_up(region: str | None) -> str | None:
    """What AWS set-up is missing for a change set (None: nothing); sends no request."""
    from distrain_cloud.infra import aws

    found, missing = aws.configured()
    if found is None and region and missing == "no AWS region is configured":  # --region names one
        import boto3

        try:
            return None if boto3.session.Session().get_credentials() else "no AWS credentials are configured"
        except Exception as e:  # a profile that does not parse: the online path says it in full
            return f"the AWS configuration could not be read ({type(e).__name__})"
    return missing or None


def render_offline(
    stack: str, region: str | None, missing: str, *, vpc_id: str | None, parameters: dict[str, str]
) -> str:
    """`infra up --dry-run` with no AWS to ask: what the template creates and with which
    parameters, and plainly what only AWS can say. The same parameter checks as a real run."""
    from distrain_cloud.infra import stack as infra_stack
    from distrain_cloud.infra.errors import UserError

    infra_stack._check_overrides(parameters)
    if vpc_id is not None and not infra_stack._VPC_ID.fullmatch(vpc_id):
        raise UserError(f"--vpc-id {vpc_id!r} is not a VPC id (vpc- and 8 or 17 hex digits)")
    template = infra_stack.load_template()
    where = f"in {region}" if region else "in your default region"
    lines = [
        f"dry run, offline ({missing}): the resources stack {stack!r} {where} holds when created from "
        "infra/stack.yaml; not a change set",
    ]
    resources = template["Resources"]
    width = max(len(name) for name in resources)
    for name, resource in resources.items():
        lines.append(f"  {name:{width}}  {resource['Type']}")
    given = {**parameters, **({"VpcId": vpc_id} if vpc_id else {})}
    for key, spec in template["Parameters"].items():
        value = given.get(key, spec.get("Default", "the region's default VPC" if key == "VpcId" else "(none)"))
        lines.append(f"  parameter {key} = {value}" + ("" if key in given else " (default)"))
    lines.append(
        "needs AWS: whether the stack exists and what an update would change or replace (a change set: "
        "CloudFormation CreateChangeSet, then DeleteChangeSet), and the default VPC. Set AWS up "
        "(`aws configure`, or AWS_PROFILE and AWS_REGION) and run `infra up --dry-run` again to see the change set"
    )
    return "\n".join(lines)


@app.command()
def status(stack: Stack = DEFAULT_STACK, region: Region = None, as_json: Json = False) -> None:
    """Show the stack, its resources and the instances still alive under its tag."""
    from distrain_cloud.infra import stack as infra_stack

    info = infra_stack.status(stack, region)
    if as_json:
        import json

        typer.echo(json.dumps(info, indent=2, default=str))
        return
    typer.echo(f"stack {info['stack']!r} in {info['region']}: {info['status']}")
    if info["reason"]:
        typer.echo(f"  reason: {info['reason']}")
    if info.get("next"):
        typer.echo(f"  next: {info['next']}")
    for r in info["resources"]:
        typer.echo(f"  {r['logical_id']:26} {r['type']:28} {r['physical_id']}")
    if info["instances"]:
        typer.echo(f"instances tagged {infra_stack.STACK_TAG}={stack}:")
        for i in info["instances"]:
            typer.echo(f"  {i['id']}  {i['state']:8} {i['type']:14} {i['launched']}  {i['name']}".rstrip())
    else:
        typer.echo("no instances alive under this stack")


@app.command()
def down(
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="first end what jobs left: instances, Auto Scaling groups, launch templates, job roles and "
            "security groups",
        ),
    ] = False,
    yes: Yes = False,
    stack: Stack = DEFAULT_STACK,
    region: Region = None,
) -> None:
    """Delete the stack (the bucket is kept). Refuses while jobs left anything, unless --force."""
    from distrain_cloud.infra import stack as infra_stack

    plan = infra_stack.plan_down(stack, region, force=force)
    typer.echo(f"will delete stack {stack!r} in {plan.region} ({plan.status}, {plan.resources} resources)")
    if plan.instances:
        typer.echo(
            f"  and first terminate {len(plan.instances)} instance(s): " + ", ".join(i["id"] for i in plan.instances)
        )
    if plan.leftovers:
        typer.echo("  and first end what jobs left: " + "; ".join(plan.leftovers.words()))
    if plan.bucket:
        typer.echo(f"  bucket {plan.bucket} is kept")
    if not (yes or _confirm("delete this stack?", "down")):
        typer.echo("nothing changed")
        return
    done = infra_stack.down(stack, plan.region, force=force)
    typer.echo(f"deleted stack {stack!r} in {plan.region}")
    if done.job_roles:
        typer.echo(f"deleted {len(done.job_roles)} job role(s) left under /distrain-cloud/{stack}/")
    if done.bucket:
        typer.echo(
            f"bucket {done.bucket} was kept with its checkpoints and outputs: "
            "empty and delete it yourself when you no longer need them"
        )


def _pairs(items: list[str] | None) -> dict[str, str]:
    from distrain_cloud.infra.errors import UserError

    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--parameter expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out
