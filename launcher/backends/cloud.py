"""What every cloud backend shares: region, cost and budget, the API-model refusal, the bucket
check, the upload, reading a job's CloudWatch logs, and fetching what `report` reads from S3.

A cloud backend plans without AWS (`plan`), checks what only AWS can tell (`preflight`), then
acts: refuse failed checks, make sure the bucket is there, upload the code bundle, send the
request. The pieces here are those steps, so SageMaker and EC2 use the same ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import distrain_cloud.training
from distrain_cloud.infra.errors import UserError, value_errors_as_user_errors

from ..plan import Check, unique_job_name

if TYPE_CHECKING:
    from distrain_cloud.infra.job_role import JobRole
    from distrain_cloud.training.args import TrainArgs
    from distrain_cloud.training.decisions import Decisions

    from ..catalog import InstanceType
    from ..logs import LogLine
    from ..spec import JobSpec, TrainingFlags

ASSUMED_REGION = "us-east-1"


@dataclass(frozen=True)
class TrainingPlan:
    """What every cloud backend derives alike from a spec and its instance type: the job's name,
    its precision and training arguments, processes per node, the configs the plan shows (node
    0's Accelerate config, the DeepSpeed or FSDP settings) and the memory-fit check."""

    job_name: str
    precision: str
    flags: TrainingFlags  # the training flags and them parsed, once: the plan carries them (Plan.training)
    processes: int  # per node
    world_size: int
    hardware: str  # "g5.12xlarge has A10G (8.6)", or the name of a CPU type
    configs: dict[str, Any]
    fit: Check
    strategy: str  # as the plan shows it: --strategy auto with what it picks there, and why
    decisions: Decisions  # made once (training/decisions.planned); every part of the plan reads these
    # what the job's image must carry that no job installs (torchao for its float8 layers), else None
    image: Check | None = None

    @property
    def checks(self) -> list[Check]:
        """The training's checks, in the plan's order: its fit on the GPUs, then the image's."""
        return [self.fit, *([self.image] if self.image else [])]

    @property
    def argv(self) -> list[str]:
        return self.flags.argv

    @property
    def args(self) -> TrainArgs:
        return self.flags.args


def repo_root() -> Path:
    """Where training/ and infra/ live, which every cloud job's code bundle packs: the checkout
    (editable install) or site-packages."""
    return Path(distrain_cloud.training.__file__).resolve().parent.parent


def plan_training(spec: JobSpec, instance: InstanceType, *, main_addr: str, main_port: int = 29500) -> TrainingPlan:
    from distrain_cloud.training.decisions import plan_configs, shown
    from distrain_cloud.training.strategies import ClusterShape, Strategy, accelerate_config, choose_precision

    from ..memory import fit_check, planned_decisions, with_planned_steps

    hardware = instance.name
    if instance.gpus:
        hardware += f" has {instance.gpu_model} ({instance.compute_capability_str})"
    with value_errors_as_user_errors():
        precision = choose_precision(spec.precision, instance.gpus, instance.compute_capability, hardware)
    job_name = unique_job_name(spec.name)
    flags = spec.training_args(precision, job_name)
    args = flags.args
    processes = max(instance.gpus, 1)
    # The run's length where the plan can count it: the compile and auto's pick turn on it.
    steps = with_planned_steps(args, world_size=spec.nodes * processes, channels=spec.inputs)
    decisions = planned_decisions(
        steps,
        world_size=spec.nodes * processes,
        nodes=spec.nodes,
        gpu_model=instance.gpu_model if instance.gpus else None,
    )
    strategy = decisions.strategy
    cluster = ClusterShape(
        num_nodes=spec.nodes,
        processes_per_node=processes,
        main_addr=main_addr,
        main_port=main_port,
        use_cpu=not instance.gpus,
    )
    with value_errors_as_user_errors():  # e.g. --strategy single on a multi-GPU instance
        configs: dict[str, Any] = {
            "accelerate_config (node 0)": accelerate_config(strategy, cluster, precision=precision)
        }
    configs.update(plan_configs(decisions, cluster.world_size))
    if strategy is Strategy.ddp and cluster.world_size > 1 and instance.gpus:
        configs["ddp_buckets"] = decisions.ddp_buckets_words
    return TrainingPlan(
        job_name=job_name,
        precision=precision,
        flags=flags,
        processes=processes,
        world_size=cluster.world_size,
        hardware=hardware,
        configs=configs,
        fit=fit_check(decisions, instance, nodes=spec.nodes),
        strategy=shown(decisions),
        decisions=decisions,
        image=torchao_check(decisions.args) if instance.gpus else None,
    )


def torchao_check(args: TrainArgs) -> Check | None:
    """torchao's float8 layers (--fp8-linear torchao, or a rowwise --fp8-recipe) run only where the
    job's image carries torchao, which no job installs (training/requirements.txt does not name it):
    said at plan time, since the job refuses it only once its instance is up."""
    from distrain_cloud.training.args import fp8_linear_of

    if args.precision != "fp8" or fp8_linear_of(args) != "torchao":
        return None
    return Check(
        "torchao in the job's image",
        None,
        "torchao's float8 layers need it and no job installs it; the default (--fp8-linear auto, the "
        "tensorwise recipe) needs torch alone",
    )


def plan_region(explicit: str | None) -> tuple[str, Check]:
    """The region a pure plan uses: the configured one, else an assumption the plan says out loud
    (a real submit insists on a configured region, in preflight)."""
    from distrain_cloud.infra import aws

    try:
        return aws.region(explicit), Check("region", True)
    except UserError as exc:
        if explicit:
            raise  # a region was named and is unknown: that is an error, not an assumption
        # A missing AWS_PROFILE also lands here: say which, so the real submit's refusal is no surprise.
        why = "none configured" if "no AWS region" in str(exc) else str(exc)
        return ASSUMED_REGION, Check("region", None, f"{why}; assumed {ASSUMED_REGION} (pass --region)")


def estimate_cost(
    instance: InstanceType, region: str, nodes: int, max_run: int, spot: bool, *, keep_alive: int = 0
) -> dict[str, Any]:
    """The worst case (every node for the whole of max_run at the snapshot's list price; pricing.py)."""
    from .. import pricing

    note = "" if not spot else "the current spot price is read at submit (or --dry-run --check)"
    if spot and instance.sagemaker:
        note = "SageMaker publishes no current managed-spot price: the worst case is on-demand"
    return pricing.estimate(instance, region, nodes, max_run, spot, keep_alive=keep_alive, spot_note=note)


def budget_check(max_cost: float, cost: dict[str, Any], nodes: int) -> Check:
    from .. import pricing

    return pricing.budget_check(max_cost, cost, nodes)


def refuse_api_problems(
    service: str, operation: str, request: dict[str, Any], sources: Sequence[tuple[str, str]], label: str
) -> None:
    """Raise one UserError naming the flag or key behind each part of `request` that breaks the
    API model of `service`.`operation`. `sources` maps a request path prefix to what sets it
    (("ResourceConfig.InstanceCount", "--nodes")); `label` names the service for people."""
    from ..apimodel import problems

    found = problems(service, operation, request)
    if not found:
        return
    parts = []
    for path, problem in found[:3]:
        source = next((src for prefix, src in sources if path.startswith(prefix)), "the planned request")
        parts.append(f"{source}: {path} {problem}")
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    raise UserError(f"{label} would refuse this job, nothing was sent: " + "; ".join(parts) + more)


# Which part of a job role's IAM requests a flag sets (the job name is the role's name).
ROLE_SOURCES = (("RoleName", "--name"), ("InstanceProfileName", "--name"), ("Path", "--stack"))


def refuse_role_problems(role: JobRole) -> JobRole:
    """`role`, once its IAM requests pass IAM's API model; else one UserError (a name over 64
    characters, a path outside IAM's pattern, a policy document over its limit)."""
    for operation, params in role.requests():
        refuse_api_problems("iam", operation, params, ROLE_SOURCES, "IAM")
    return role


def secrets_reach_check(
    secrets: dict[str, str], *, partition: str, region: str, account: str, secret_prefix: str | None
) -> Check | None:
    """Whether the job's role can read each `--secret` it names: the stack's boundary allows only
    secrets under its SecretPrefix in its own region and account, so a reference elsewhere would
    fail inside the running job. None without secrets; unknown (None) until the stack is known."""
    from distrain_cloud.infra import job_role

    name = "job role can read each --secret"
    if not secrets:
        return None
    if secret_prefix is None:
        return Check(name, None, "each --secret is checked at submit against the stack's SecretPrefix")
    beyond = job_role.secrets_beyond_boundary(
        secrets.values(), partition=partition, region=region, account=account, secret_prefix=secret_prefix
    )
    if beyond:
        named = ", ".join(f"--secret {env}={ref}" for env, ref in sorted(secrets.items()) if ref in beyond)
        return Check(
            name,
            False,
            f"{named}: job roles of this stack may read only secrets and parameters named {secret_prefix}... "
            f"in {region} of account {account}; store it there, or use a stack whose SecretPrefix holds it",
        )
    return Check(name, True, f"under {secret_prefix} in {region}; the job's role reads these and no others")


def retire_role_quietly(name: str) -> None:
    """Delete job role `name` if it is there; a failure is a note, not an error."""
    import sys

    from distrain_cloud.infra import job_role

    try:
        job_role.retire(name)
    except UserError as e:  # status still answers; the role goes at the next look or `infra down`
        print(f"note: job role {name} was not deleted: {e}", file=sys.stderr)


def bucket_check(
    bucket: str, region: str, *, named_by_user: bool, fix: str = "create it or drop sagemaker.bucket"
) -> Check:
    """Whether the job's bucket is there and ours (read-only: HeadBucket). `fix` says what to do
    when a bucket the user (or their stack) named is missing."""
    from distrain_cloud.infra import aws
    from distrain_cloud.infra.resources import BucketAccess, bucket_access

    try:
        access = bucket_access(aws.client("s3", region), bucket)
    except Exception as e:  # not answered (no permission to ask, throttled): say so, don't block
        return Check("bucket exists", None, f"{bucket}: not checked ({aws.error_code(e) or type(e).__name__})")
    if access is BucketAccess.OURS:
        return Check("bucket exists", True, bucket)
    if access is BucketAccess.DENIED:  # another account's, or not ours to use
        return Check("bucket usable", False, f"{bucket}: access denied; name another bucket")
    if named_by_user:
        return Check("bucket exists", False, f"{bucket}: {fix}")
    return Check("bucket exists", True, f"{bucket} will be created")


def upload_code(region: str, bucket: str, key: str, bundle: bytes) -> bool:
    """Make sure the job's bucket exists, then upload its code bundle unless the same bytes are
    there already (`key` is the bundle's sha256). Returns whether it uploaded."""
    from distrain_cloud.infra import aws, resources

    with aws.translate_errors():
        resources.ensure_bucket(bucket, region)
        return resources.upload_if_absent(bucket, key, bundle, region)


# How far back each poll of a followed log reads again. CloudWatch orders events by the time the
# node stamped them, and one node's agent may deliver a batch stamped before another node's newest
# event after that event was read: read from the newest time seen, that batch would be lost.
# What was printed already is known by its eventId and not printed again.
LOG_LOOKBACK_MS = 30_000
_NEVER_FORGOTTEN = 2**63  # the key of an event without a time: kept, as no round can tell its age


def log_lines(
    region: str, group: str, job_name: str, host: Callable[[str], str], done: Callable[[], bool], poll: float = 5.0
) -> Iterator[LogLine]:
    """The lines of every stream `<job_name>/...` of log group `group`, in the order CloudWatch
    gives them (by time; each stream's lines in their order), each with its host and time; until
    `done()` says the job ended (called once per round: pass `lambda: True` for what is there
    now). One FilterLogEvents call a round for all the streams (more only for more than a page),
    not one GetLogEvents call per stream."""
    from distrain_cloud.infra import aws

    from ..logs import iso_utc, split_lines

    printed: dict[Any, int] = {}  # event key -> timestamp, for the events inside the lookback
    newest: int | None = None
    with aws.translate_errors():
        client = aws.client("logs", region)
        while True:
            # asked before reading: whatever was written before the end is read this round
            ended = done()
            since = None if newest is None else max(0, newest - LOG_LOOKBACK_MS)
            for stream, stamp, message, key in _filter_events(client, group, f"{job_name}/", since):
                if key in printed:
                    continue
                printed[key] = stamp if stamp is not None else _NEVER_FORGOTTEN
                if stamp is not None:
                    newest = stamp if newest is None else max(newest, stamp)
                yield from split_lines(message, host(stream), iso_utc(stamp) if stamp is not None else None)
            if ended:
                return
            if newest is not None:  # what the next round cannot read again need not be remembered
                printed = {k: t for k, t in printed.items() if t >= newest - LOG_LOOKBACK_MS}
            time.sleep(poll)


def _filter_events(
    client: Any, group: str, prefix: str, since: int | None
) -> Iterator[tuple[str, int | None, str, Any]]:
    """(stream, timestamp, message, key) of each event of the streams named `prefix...` from
    `since` (ms) on, page by page; nothing while the group does not exist yet. Every field is
    checked: an event that is not what the API model says is skipped, not trusted."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra.aws import error_code

    kwargs: dict[str, Any] = {"logGroupName": group, "logStreamNamePrefix": prefix}
    if since is not None:
        kwargs["startTime"] = since
    while True:
        try:
            out = client.filter_log_events(**kwargs)
        except ClientError as e:
            if error_code(e) == "ResourceNotFoundException":
                return  # no logs yet (the job is still starting)
            raise
        events = out.get("events")
        for event in events if isinstance(events, list) else []:
            stream, message = event.get("logStreamName"), event.get("message")
            if not (isinstance(stream, str) and stream.startswith(prefix) and isinstance(message, str)):
                continue  # another job's stream (a name sharing the prefix is not ours), or no text
            stamp = event.get("timestamp")
            stamp = stamp if isinstance(stamp, int) and not isinstance(stamp, bool) and stamp >= 0 else None
            event_id = event.get("eventId")
            key = event_id if isinstance(event_id, str) and event_id else (stream, stamp, message)
            yield stream, stamp, message, key
        # A page may be empty with a token after it (the search goes on): only no token ends it.
        token = out.get("nextToken")
        if not isinstance(token, str) or not token or token == kwargs.get("nextToken"):
            return
        kwargs["nextToken"] = token


# What `report` reads of a job's output folder (metrics.jsonl is the one it cannot do without),
# and of its model folder.
REPORT_OUTPUTS = ("metrics.jsonl", "sample.txt")
REPORT_MODEL_FILES = ("training_args.json",)


def fetch_outputs(
    job_name: str, info: dict[str, Any], region: str, dest: Path, *, output: str, model: str | None = None
) -> dict[str, Any]:
    """Bring what `distrain-cloud report` reads of a cloud job into `dest`, as a local job leaves
    it: `dest/output/metrics.jsonl` and `sample.txt` from `output`, an S3 folder (ending in "/")
    that holds them or the URI of a .tar.gz that does (SageMaker's output.tar.gz: read as a
    stream, only those members, each written under a name of ours, never a path from the
    archive); `dest/model/training_args.json` from the S3 folder `model`, when there. `info` is
    the job's status (what `status` shows): it words the error when there are no metrics yet,
    and it is returned for the report's header."""
    from distrain_cloud.infra import aws

    for stale in [dest / "output" / n for n in REPORT_OUTPUTS] + [dest / "model" / n for n in REPORT_MODEL_FILES]:
        stale.unlink(missing_ok=True)  # an earlier fetch's copies must not pass for this one's
    (dest / "output").mkdir(parents=True, exist_ok=True)
    with aws.translate_errors():
        s3 = aws.client("s3", region)
        if output.endswith("/"):
            for name in REPORT_OUTPUTS:
                body = _get_object(s3, f"{output}{name}")
                if body is not None:
                    (dest / "output" / name).write_bytes(body.read())
        else:
            _extract_members(s3, output, REPORT_OUTPUTS, dest / "output")
        if not (dest / "output" / REPORT_OUTPUTS[0]).is_file():
            where = f"{output}{REPORT_OUTPUTS[0]}" if output.endswith("/") else output
            raise UserError(_no_metrics(job_name, info, where))
        if model is not None:
            (dest / "model").mkdir(exist_ok=True)
            for name in REPORT_MODEL_FILES:
                body = _get_object(s3, f"{model}{name}")
                if body is not None:
                    (dest / "model" / name).write_bytes(body.read())
    return info


def _no_metrics(job_name: str, info: dict[str, Any], where: str) -> str:
    status = info.get("status", "unknown")
    if not info.get("terminal"):
        # Both backends upload the output folder when the job ends, not while it runs.
        return (
            f"{job_name} is {status}: its metrics reach S3 when it ends ({where} is not there yet); "
            f"`distrain-cloud logs {job_name} --follow` shows its steps meanwhile"
        )
    detail = f" ({info['detail']})" if info.get("detail") else ""
    return (
        f"{job_name} ended {status}{detail} and left no metrics at {where} (it logged no step); "
        f"`distrain-cloud logs {job_name}` says why"
    )


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _get_object(s3: Any, uri: str) -> Any:
    """The body of the object at `uri`, or None when there is no such object."""
    from botocore.exceptions import ClientError

    from distrain_cloud.infra.aws import error_code

    bucket, key = _split_s3(uri)
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as e:
        if error_code(e) in ("NoSuchKey", "404"):
            return None
        raise


def _extract_members(s3: Any, uri: str, names: Sequence[str], folder: Path) -> None:
    """Write the regular files of the .tar.gz at `uri` named `names` (at its top, "./" or not)
    to `folder`; nothing else is read out, and a missing archive writes nothing."""
    import tarfile

    body = _get_object(s3, uri)
    if body is None:
        return
    wanted = set(names)
    try:
        with tarfile.open(fileobj=body, mode="r|gz") as archive:
            for member in archive:
                name = member.name.removeprefix("./")
                if name in wanted and member.isfile():
                    data = archive.extractfile(member)
                    if data is not None:
                        (folder / name).write_bytes(data.read())
                        wanted.discard(name)
                if not wanted:
                    break  # the rest of the archive (a W&B run, profiles) is never downloaded
    except (tarfile.TarError, EOFError) as e:
        raise UserError(f"{uri} is not a readable .tar.gz ({e}); download it and look inside") from e
    finally:
        body.close()


# ---------------------------------------------------------------------- fields of an AWS answer


def as_list(value: Any) -> list[Any]:
    """A field of an AWS answer that should be a list: itself, or empty (every byte may be hostile)."""
    return value if isinstance(value, list) else []


def as_number(value: Any) -> float | None:
    """A field of an AWS answer that should be a count or a quota: the number, or None when it is
    not one (a bool, a string) or is out of any sane range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value < 1e12 else None
