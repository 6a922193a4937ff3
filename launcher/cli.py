"""`distrain-cloud`: thin commands over the launcher library.

Only typer is imported at module level, so `--help` is instant; each command imports
what it needs. Known errors print as one line (`error: ...`) with a non-zero exit;
DISTRAIN_DEBUG=1 shows the traceback. Text that came from a job (statuses, details, log lines,
names read from S3) is printed through `_human` (`logs.printable`): shown, never obeyed by the
terminal; `--json` prints it exactly, JSON-escaped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import click
import typer

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from .plan import Plan
    from .spec import JobSpec

app = typer.Typer(
    help="Run Hugging Face training jobs (Accelerate + DeepSpeed ZeRO) on SageMaker, EC2 or locally.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # subcommands inherit it
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"distrain-cloud {version('distrain-cloud')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Run Hugging Face training jobs (Accelerate + DeepSpeed ZeRO) on SageMaker, EC2 or locally."""


def _add_infra_commands() -> None:
    from .infra_cli import app as infra_app  # typer only: --help stays instant

    app.add_typer(infra_app, name="infra")


_add_infra_commands()

# What follows `--` on the command line: training flags, passed through untouched.
_TRAIN_ARGS: list[str] = []
# Whether `submit/resume --json` has printed its one document on stdout (main prints a refusal's
# document where it has not).
_DOCUMENT_PRINTED: list[bool] = [False]

Backend = Annotated[
    str | None,
    typer.Option(
        "--backend", help="sagemaker, ec2 or local (default: from the job's record, its local folder, else sagemaker)"
    ),
]
Region = Annotated[str | None, typer.Option("--region", help="AWS region (default: AWS_REGION / profile)")]
Json = Annotated[bool, typer.Option("--json", help="machine-readable output")]
Yes = Annotated[
    bool, typer.Option("--yes", "-y", help="cloud jobs: submit without asking (needed where no terminal can ask)")
]
Workdir = Annotated[Path, typer.Option("--workdir", help="local backend: folder holding local jobs")]

# The job's options that `submit` and `export` share: one declaration each, so their names, types,
# defaults and help cannot drift apart (tests/launcher/test_cli_conventions.py compares them). What
# an export engine does not express, export refuses by name (export._refuse_inexpressible).
Instance = Annotated[
    str | None,
    typer.Option(
        "--instance",
        "-i",
        help="local, ml.p3.8xlarge (SageMaker), g4dn.12xlarge (EC2), ...; export: a type whose GPUs to use",
    ),
]
Nodes = Annotated[int | None, typer.Option("--nodes", "-n", help="instances (each: one process per GPU)")]
Processes = Annotated[
    int | None, typer.Option("--processes", help="processes to start per node: local, or export's cpu nodes")
]
Strategy = Annotated[
    str | None,
    typer.Option(
        "--strategy",
        "-s",
        help="auto (default: ddp, or fsdp for long compiled runs on one node's GPUs), ddp, zero1, zero2, "
        "zero3, zero2-offload, zero3-offload, fsdp, single",
    ),
]
Precision = Annotated[str | None, typer.Option("--precision", help="no, fp16, bf16 or fp8 (default: by GPU)")]
Spot = Annotated[bool | None, typer.Option("--spot/--on-demand", help="spot capacity, resumed from checkpoints")]
MaxRun = Annotated[
    str | None,
    typer.Option("--max-run", help="wall-clock limit: 3600, 90m, 6h (local: stops with a checkpoint, as cancel)"),
]
MaxWait = Annotated[str | None, typer.Option("--max-wait", help="spot: limit including waiting")]
MaxCost = Annotated[
    float | None, typer.Option("--max-cost", help="USD cap: EC2 nodes stop the job at it, SageMaker refuses above")
]
Name = Annotated[str | None, typer.Option("--name", help="job name prefix")]
PushToHub = Annotated[
    str | None, typer.Option("--push-to-hub", metavar="REPO", help="push the final model to this Hub repo")
]
HubRevision = Annotated[
    str | None,
    typer.Option(
        "--hub-revision", metavar="BRANCH", help="the Hub repo's branch to push to, created from main if missing"
    ),
]
HubPrivate = Annotated[bool | None, typer.Option("--hub-private/--no-hub-private", help="create the Hub repo private")]
WandbProject = Annotated[str | None, typer.Option("--wandb-project", help="W&B project")]
WandbEntity = Annotated[str | None, typer.Option("--wandb-entity", help="W&B team or user")]
RunName = Annotated[str | None, typer.Option("--run-name", help="W&B run name (default: the job name)")]
ResumeFrom = Annotated[str | None, typer.Option("--resume-from", help="continue from this earlier job's checkpoints")]
Inputs = Annotated[list[str] | None, typer.Option("--input", help="CHANNEL=S3-URI-or-path; repeatable")]


@app.command(context_settings={"help_option_names": ["-h", "--help"]})
def submit(
    spec: Annotated[Path | None, typer.Argument(help="job spec YAML (optional); flags override it")] = None,
    instance: Instance = None,
    backend_: Annotated[
        str | None,
        typer.Option("--backend", help="where the job runs: local, sagemaker or ec2 (default: from --instance)"),
    ] = None,
    nodes: Nodes = None,
    processes: Processes = None,
    strategy: Strategy = None,
    precision: Precision = None,
    spot: Spot = None,
    max_run: MaxRun = None,
    max_wait: MaxWait = None,
    max_cost: MaxCost = None,
    max_restarts: Annotated[
        int | None,
        typer.Option(
            "--max-restarts", help="EC2 spot: new attempts after interruptions, on AWS's side (0: none; default 3)"
        ),
    ] = None,
    on_demand_after: Annotated[
        int | None,
        typer.Option(
            "--on-demand-after", metavar="K", help="EC2 spot: replacements are on-demand after K interruptions"
        ),
    ] = None,
    name: Name = None,
    push_to_hub: PushToHub = None,
    hub_revision: HubRevision = None,
    hub_private: HubPrivate = None,
    wandb_project: WandbProject = None,
    wandb_entity: WandbEntity = None,
    run_name: RunName = None,
    resume_from: ResumeFrom = None,
    region: Region = None,
    secret: Annotated[
        list[str] | None,
        typer.Option("--secret", help="ENV=REFERENCE (Secrets Manager ARN or ssm:/name); repeatable"),
    ] = None,
    input_: Inputs = None,
    image_uri: Annotated[str | None, typer.Option("--image-uri", help="SageMaker: explicit training image")] = None,
    keep_alive: Annotated[
        str | None,
        typer.Option(
            "--keep-alive", help="SageMaker: keep the instances warm this long after the job (at most 1h), billed"
        ),
    ] = None,
    role: Annotated[
        str | None, typer.Option("--role", help="SageMaker: execution role name or ARN (default: the job's own)")
    ] = None,
    stack: Annotated[
        str | None,
        typer.Option(
            "--stack",
            help="the `infra up` stack whose roles, bucket and security group cloud jobs use (default distrain-cloud)",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan; send nothing")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="with --dry-run: also run the read-only AWS checks (role, bucket, quota)")
    ] = False,
    bundle_files: Annotated[
        bool, typer.Option("--bundle-files", help="with --dry-run: list the code bundle's files and sizes")
    ] = False,
    as_json: Json = False,
    wait: Annotated[bool, typer.Option("--wait", help="follow the job until it ends")] = False,
    yes: Yes = False,
) -> None:
    """Plan a training job and run it (or only print the plan with --dry-run).

    SPEC is an optional job YAML (see examples/); flags override it. Training flags go
    after `--`, e.g. `submit --instance local -- --task causal-lm --max-steps 50`.
    """
    from .api import check_same_training, plan_job, previous_spec, spec_changes
    from .spec import load_spec, user_defaults

    overrides = {
        "instance": instance,
        "backend": backend_,
        "nodes": nodes,
        "strategy": strategy,
        "precision": precision,
        "spot": spot,
        "max_run": max_run,
        "max_wait": max_wait,
        "max_cost": max_cost,
        "ec2.max_restarts": max_restarts,
        "ec2.on_demand_after": on_demand_after,
        "name": name,
        "region": region,
        "resume_from": resume_from,
        "stack": stack,
        "secrets": _pairs(secret, "--secret"),
        "inputs": _pairs(input_, "--input"),
        "local.processes": processes,
        "hub.repo_id": push_to_hub,
        "hub.revision": hub_revision,
        "hub.private": hub_private,
        "wandb.project": wandb_project,
        "wandb.entity": wandb_entity,
        "wandb.run_name": run_name,
        "sagemaker.image_uri": image_uri,
        "sagemaker.keep_alive": keep_alive,
        "sagemaker.role": role,
        "train_args": list(_TRAIN_ARGS) or None,
    }
    previous = previous_spec(resume_from, region=region) if resume_from else None
    # A resumed job keeps its own settings; a new one starts from this user's defaults.
    base = previous.model_dump(mode="json", exclude_defaults=True) if previous else user_defaults()
    job = load_spec(spec, overrides, base=base)
    if previous is not None:
        check_same_training(previous, job)
    plan = plan_job(job, dry_run=dry_run, check=check or not dry_run)
    if previous is not None:
        plan.summary["resumes"] = f"{plan.summary.get('resumes') or resume_from}, with its spec and training flags"
        plan.summary["changed"] = "; ".join(spec_changes(previous, job)) or "nothing"
    if dry_run:  # a submit's --json document is printed once it returns (_act)
        _echo_plan(plan, as_json)
    if bundle_files:
        listing = plan.bundle_listing
        typer.echo(
            f"code bundle files:\n{listing}"
            if listing
            else f"code bundle files: none ({plan.backend} jobs run the installed code, not a bundle)",
            err=as_json,  # stdout holds the JSON document alone
        )
    _act(plan, job, dry_run=dry_run, as_json=as_json, wait=wait, yes=yes)


@app.command("export")
def export_(
    engine: Annotated[str, typer.Argument(help="skypilot, trainjob (Kubeflow Trainer v2) or pytorchjob (Kubeflow)")],
    spec: Annotated[Path | None, typer.Argument(help="job spec YAML (optional); flags override it")] = None,
    accelerator: Annotated[
        str | None, typer.Option("--accelerator", "-a", help="GPUs per node, A100:8, L4:4, H100-80GB:8, or cpu")
    ] = None,
    instance: Instance = None,
    nodes: Nodes = None,
    processes: Processes = None,
    strategy: Strategy = None,
    precision: Precision = None,
    spot: Spot = None,
    max_run: MaxRun = None,
    max_wait: MaxWait = None,
    max_cost: MaxCost = None,
    name: Name = None,
    region: Region = None,
    push_to_hub: PushToHub = None,
    hub_revision: HubRevision = None,
    hub_private: HubPrivate = None,
    wandb_project: WandbProject = None,
    wandb_entity: WandbEntity = None,
    run_name: RunName = None,
    resume_from: ResumeFrom = None,
    input_: Inputs = None,
    secret: Annotated[
        list[str] | None,
        typer.Option("--secret", help="ENV (SkyPilot, given at launch) or ENV=SECRET/KEY (Kubernetes); repeatable"),
    ] = None,
    image: Annotated[str | None, typer.Option("--image", help="a container image with distrain-cloud[train]")] = None,
    checkpoints: Annotated[
        str | None, typer.Option("--checkpoints", help="s3://BUCKET/prefix (SkyPilot) or pvc:CLAIM (Kubernetes)")
    ] = None,
    runtime: Annotated[str, typer.Option("--runtime", help="trainjob: its ClusterTrainingRuntime")] = (
        "torch-distributed"
    ),
    output: Annotated[Path | None, typer.Option("--output", "-o", help="file (default: JOB.ENGINE.yaml)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the manifest; write nothing")] = False,
) -> None:
    """Write the manifest of the job `submit` would run, for SkyPilot or Kubernetes.

    The same entry point and training flags, with precision and strategy resolved for
    --accelerator. Training flags go after `--`, as for submit. Of submit's options, --spot,
    --region and --input are SkyPilot's only and --max-run Kubernetes' only; --max-wait,
    --max-cost and --resume-from are refused (no engine expresses them).
    """
    from .export import ExportOptions, export_job
    from .spec import load_spec

    overrides = {
        "instance": instance,
        "nodes": nodes,
        "strategy": strategy,
        "precision": precision,
        "spot": spot,
        "max_run": max_run,
        "max_wait": max_wait,
        "max_cost": max_cost,
        "name": name,
        "region": region,
        "resume_from": resume_from,
        "inputs": _pairs(input_, "--input"),
        "hub.repo_id": push_to_hub,
        "hub.revision": hub_revision,
        "hub.private": hub_private,
        "wandb.project": wandb_project,
        "wandb.entity": wandb_entity,
        "wandb.run_name": run_name,
        "train_args": list(_TRAIN_ARGS) or None,
    }
    job = load_spec(spec, overrides)
    secrets = dict(item.partition("=")[::2] for item in secret or [])
    options = ExportOptions(engine, accelerator, processes, image, checkpoints, secrets, runtime)
    exported = export_job(job, options)
    for note in exported.notes:
        print(_human(f"note: {note}"), file=sys.stderr)
    if dry_run:
        typer.echo(exported.text(), nl=False)
        return
    path = output or Path(f"{exported.job_name}.{engine}.yaml")
    path.write_text(exported.text())
    typer.echo(f"wrote {path}\nstart it: {exported.next_step.replace(f'{exported.job_name}.{engine}.yaml', str(path))}")


@app.command()
def status(
    job: str, backend: Backend = None, region: Region = None, workdir: Workdir = Path("runs"), as_json: Json = False
) -> None:
    """Show a job's status (its backend is found from the record written at submit)."""
    from .backends import get_backend
    from .jobs import find_job

    ref = find_job(job, backend=backend, region=region, workdir=workdir)
    _show({**get_backend(ref.backend).status(ref), "backend": ref.backend}, as_json)


@app.command("ls")
def list_jobs(
    backend: Backend = None,
    region: Region = None,
    workdir: Workdir = Path("runs"),
    limit: Annotated[int, typer.Option("--limit", help="most recent jobs to show")] = 20,
    as_json: Json = False,
) -> None:
    """List recent jobs of every backend (or of --backend)."""
    from .backends import BACKENDS, get_backend

    jobs = []
    for name in [backend] if backend else list(BACKENDS):
        try:
            jobs += get_backend(name).list_jobs(region=region, workdir=workdir, limit=limit)
        except UserError as e:
            if backend:
                raise
            print(_human(f"note: {name} jobs not listed: {e}"), file=sys.stderr)  # e.g. no credentials
    jobs = sorted(jobs, key=lambda j: _epoch(j.get("created")) or 0.0, reverse=True)[:limit]
    if not jobs and backend in (None, "local"):  # say where it looked: a job may be in another folder
        from .jobs import records_dir

        print(
            f"note: no jobs; local ones are looked for in {workdir.resolve()} and in the folders this machine's "
            f"records ({records_dir()}) name: --workdir FOLDER for another folder",
            file=sys.stderr,
        )
    if as_json:
        import json

        typer.echo(json.dumps(jobs, indent=2, default=str))
        return
    _print_jobs(jobs)


# The `ls` table's columns after the job's name, with the least and the most characters each is
# given: the least first, then each in this order grows to its content (up to its most).
_LS_COLUMNS = {"status": (4, 12), "backend": (4, 9), "created": (4, 19), "instance": (4, 16), "detail": (8, 10_000)}
_LS_ORDER = ("backend", "status", "instance", "created", "detail")
_LS_GAP = 2  # between two columns: a space of padding and the (blank) divider


def _ls_widths(room: int, natural: dict[str, int]) -> dict[str, int]:
    """Each column's width in `room` characters (at least their least widths together)."""
    widths = {name: min(_LS_COLUMNS[name][0], natural[name]) for name in natural}
    room -= sum(widths.values())
    for name in widths:
        grow = max(0, min(min(natural[name], _LS_COLUMNS[name][1]) - widths[name], room))
        widths[name] += grow
        room -= grow
    return widths


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    """The `ls` table. A job's name is what users copy into the next command: it is never cut or
    wrapped, whatever the terminal's width; the other columns wrap to make room (one that is
    empty for every job is left out), and where even that is not enough the table is wider than
    the terminal (which wraps its lines, the name still whole). A detail that would get fewer than
    _DETAIL_BELOW characters of a line (a word per line at 80 columns) goes under its job's row
    instead, across the terminal's width."""
    from rich.console import Console

    rows = [
        {
            "job": _human(str(j.get("job_name") or "")),
            **{k: _human(str(j.get(k) or "")) for k in ("backend", "status", "instance", "detail")},
            "created": _created(j.get("created")),
        }
        for j in jobs
    ]
    shown = [c for c in _LS_ORDER if c in ("backend", "status") or any(r[c] for r in rows)]
    name_width = max([len("job"), *(len(r["job"]) for r in rows)])
    console = Console()
    width, widths = _ls_layout(rows, shown, name_width, console.width)
    if "detail" in shown and widths["detail"] < min(max(len(r["detail"]) for r in rows), _DETAIL_BELOW):
        shown.remove("detail")
        width, widths = _ls_layout(rows, shown, name_width, console.width)
        out = Console(width=width)
        out.print(_ls_table([], shown, name_width, widths, fixed=True))  # the header
        for r in rows:
            out.print(_ls_table([r], shown, name_width, widths, fixed=True))
            if r["detail"]:
                _print_detail(out, r["detail"], console.width)
        return
    Console(width=width).print(_ls_table(rows, shown, name_width, widths, fixed=False))


_DETAIL_BELOW = 24  # fewer characters than this for a detail's column: it goes under its row


def _ls_layout(rows: list[dict[str, str]], shown: list[str], name_width: int, room: int) -> tuple[int, dict]:
    """(the table's width, each shown column's width) in a terminal `room` characters wide."""
    natural = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in _LS_COLUMNS if c in shown}
    frame = _LS_GAP * len(shown)
    least = frame + name_width + sum(min(_LS_COLUMNS[c][0], natural[c]) for c in shown)
    width = max(room, least)
    return width, _ls_widths(width - frame - name_width, natural)


def _ls_table(rows: list[dict[str, str]], shown: list[str], name_width: int, widths: dict, *, fixed: bool) -> Any:
    """The `ls` rows as a table whose columns are at most `widths` wide (`fixed`: exactly, so
    that tables of one row each line up under one header: a table of no rows)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, show_header=not (fixed and rows)
    )
    table.add_column("job", no_wrap=True, min_width=name_width, width=name_width if fixed else None)
    for column in shown:
        size = {"width" if fixed else "max_width": widths[column]}
        table.add_column(column, overflow="fold", **size)
    for r in rows:
        # Text cells, not strings: rich would read a job's "[...]" as markup (a stray closing
        # tag is an exception) and passes escape sequences through.
        table.add_row(*(Text(r[c]) for c in ("job", *shown)))
    return table


def _print_detail(console: Any, detail: str, width: int) -> None:
    """A job's detail under its row: indented, wrapped at words (a long one, such as a job name
    in a resume command, is kept whole where it fits a line)."""
    import textwrap

    from rich.text import Text

    lines = textwrap.wrap(detail, max(width - 4, 20), break_on_hyphens=False)
    for line in lines:
        console.print(Text("    " + line), soft_wrap=True)


def _epoch(value: object) -> float | None:
    """A job's creation time as seconds since the epoch: local records keep that; EC2 writes UTC
    as `YYYY-MM-DD HH:MM:SS`, SageMaker an ISO time with its zone. None when it is neither."""
    from datetime import datetime, timezone

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _created(value: object) -> str:
    """The creation time in this machine's local time, as `status` shows times; as given when
    it is not a time."""
    epoch = _epoch(value)
    try:
        return _when(epoch) if epoch is not None else str(value or "")
    except (OverflowError, OSError, ValueError):  # a time no calendar holds
        return str(value)


@app.command()
def logs(
    job: str,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    backend: Backend = None,
    region: Region = None,
    workdir: Workdir = Path("runs"),
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON Lines: one {time, host, message} object per log line")
    ] = False,
) -> None:
    """Print a job's logs (all hosts); --follow until it ends."""
    from .backends import get_backend
    from .jobs import find_job
    from .logs import print_log_lines

    ref = find_job(job, backend=backend, region=region, workdir=workdir)
    raise typer.Exit(print_log_lines(get_backend(ref.backend).log_lines(ref, follow=follow), as_json=as_json))


@app.command()
def report(
    job: Annotated[str, typer.Argument(help="job name, or a job folder holding output/metrics.jsonl")],
    out: Annotated[
        Path | None, typer.Option("--out", help="folder for report.html and plots/ (default: JOB/report)")
    ] = None,
    backend: Backend = None,
    region: Region = None,
    workdir: Annotated[
        Path, typer.Option("--workdir", help="folder holding local jobs; a cloud job's metrics are fetched to it")
    ] = Path("runs"),
) -> None:
    """Write one HTML page with plots (loss, learning rate, eval metrics, tokens/s, GPU memory), the final
    metrics, the generated sample and the run's settings, from the job's metrics: no W&B needed.
    A cloud job's metrics are fetched from S3 into WORKDIR/JOB first (they get there when it ends).
    A resumed job's page plots its whole lineage: the attempts it resumed first, from step 1."""
    from .backends import get_backend
    from .jobs import find_job
    from .plan import JobRef
    from .report import lineage_folders, write_report

    folder, status = Path(job), None
    ref = JobRef(folder.resolve().name, "local", workdir=folder.resolve().parent)  # a job folder, named by path
    if not (folder / "output").is_dir():
        ref = find_job(job, backend=backend, region=region, workdir=workdir)
        folder = ref.workdir / ref.name
        if ref.backend != "local":
            status = {**get_backend(ref.backend).fetch_outputs(ref, folder), "backend": ref.backend}
    # A resumed job's lineage: the earlier attempts' metrics too (a cloud attempt's fetched from S3).
    fetch = get_backend(ref.backend).fetch_outputs if ref.backend != "local" else None
    earlier, missing = lineage_folders(ref, fetch)
    typer.echo(str(write_report(folder, out, status=status, earlier=earlier, missing=missing)))


@app.command()
def wait(
    job: str,
    backend: Backend = None,
    region: Region = None,
    workdir: Workdir = Path("runs"),
    poll: Annotated[float, typer.Option("--poll", help="seconds between status checks")] = 15.0,
) -> None:
    """Follow a job until it ends; exit 0 only if it completed."""
    from .backends import get_backend, wait_for
    from .jobs import find_job

    ref = find_job(job, backend=backend, region=region, workdir=workdir)
    raise typer.Exit(wait_for(get_backend(ref.backend), ref, poll=poll))


@app.command()
def cancel(
    job: str,
    now: Annotated[
        bool,
        typer.Option("--now", help="EC2: terminate the instances at once; local: kill the job; neither saves"),
    ] = False,
    backend: Backend = None,
    region: Region = None,
    workdir: Workdir = Path("runs"),
) -> None:
    """Stop a running job (it saves a checkpoint on the way out; --now does not wait for that).
    A local job stops as Ctrl-C in its terminal would; this waits until it has."""
    from .backends import get_backend
    from .jobs import find_job

    ref = find_job(job, backend=backend, region=region, workdir=workdir)
    # A local job is stopped from any shell: its processes are signalled, checked to be the job's.
    # --now where the backend cannot stop at once is refused by it (Backend.stops_now).
    typer.echo(_human(get_backend(ref.backend).cancel(ref, now=now)))


@app.command()
def resume(
    job: str,
    backend: Backend = None,
    region: Region = None,
    workdir: Workdir = Path("runs"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the new attempt's plan; send nothing")] = False,
    as_json: Json = False,
    wait: Annotated[bool, typer.Option("--wait", help="follow the new job until it ends")] = False,
    yes: Yes = False,
) -> None:
    """Continue a stopped, interrupted or failed job from its checkpoints: a new job of the same
    lineage, with the spec JOB was submitted with (SageMaker: the same as `submit --resume-from JOB`)."""
    from .api import plan_job, resume_spec
    from .backends import get_backend
    from .jobs import find_job

    ref = find_job(job, backend=backend, region=region, workdir=workdir)
    _refuse_completed(ref)
    # Never a silent retraining from step 1 (optional in the Protocol: a local job's checkpoints are here).
    getattr(get_backend(ref.backend), "refuse_empty_resume", lambda job: None)(ref)
    spec = resume_spec(ref)
    plan = plan_job(spec, dry_run=dry_run)
    if dry_run:  # a submit's --json document is printed once it returns (_act)
        _echo_plan(plan, as_json)
    _act(plan, spec, dry_run=dry_run, as_json=as_json, wait=wait, yes=yes)


@app.command()
def push(
    job: str,
    repo: Annotated[str | None, typer.Option("--repo", help="the Hub repo (default: the job's --push-to-hub)")] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", help="the branch (default: the job's --hub-revision, else main)")
    ] = None,
    backend: Backend = None,
    region: Region = None,
    workdir: Workdir = Path("runs"),
) -> None:
    """Push a local job's kept model to the Hub, without retraining: the retry of a push that failed."""
    from .jobs import find_job
    from .push import push_job

    ref = find_job(job, backend=backend, region=region, workdir=workdir)
    typer.echo(push_job(ref, repo=repo, revision=revision))


def _refuse_completed(ref: Any) -> None:
    """A completed job has trained every step it was asked for: resumed as it was, its new job
    would train none and report completed again."""
    from .backends import get_backend

    if get_backend(ref.backend).status(ref).get("status") == "Completed":
        raise UserError(
            f"{ref.name} completed: every step it was asked for is trained. To train further, resume it "
            f"with a higher --max-steps: distrain-cloud submit --resume-from {ref.name} -- --max-steps N"
        )


rehearse_app = typer.Typer(help="Rehearse a fault on your own account, with real (small) costs.", no_args_is_help=True)
app.add_typer(rehearse_app, name="rehearse")


@rehearse_app.command("spot")
def rehearse_spot(
    region: Region = None,
    instance: Annotated[str | None, typer.Option("--instance", "-i", help="default: the cheapest GPU type")] = None,
    interrupt: Annotated[str, typer.Option("--interrupt", help="fis (a spot notice) or terminate")] = "fis",
    fis_role: Annotated[str | None, typer.Option("--fis-role", help="the role AWS FIS assumes (name or ARN)")] = None,
    steps: Annotated[int, typer.Option("--steps", help="training steps of the tiny model")] = 10000,
    max_cost: Annotated[float, typer.Option("--max-cost", help="refuse if the worst case exceeds this USD")] = 3.0,
    stack: Annotated[str | None, typer.Option("--stack", help="the `infra up` stack (default distrain-cloud)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan; send nothing")] = False,
    yes: Yes = False,
) -> None:
    """Run the smallest spot lineage (2 nodes), interrupt one node, check that it recovers, completes
    and leaves nothing, and print what it cost; exit 1 on any failed check (docs/ec2.md)."""
    from .backends import rehearsal as rehearsal_of
    from .plan import refuse_failed_checks

    spot = rehearsal_of("spot")  # backends.REHEARSALS says which backend plays it, and why not a flag here
    options = spot.Options(region, instance, interrupt, fis_role, steps, max_cost, stack)
    rehearsal = spot.plan_rehearsal(options, dry_run=dry_run)
    typer.echo(_human(rehearsal.render(full=dry_run)))
    refuse_failed_checks(rehearsal.plan, exit_code=1 if dry_run else 2)
    if dry_run:
        return
    if not yes:
        _confirm(rehearsal.plan)
    outcome = spot.run_rehearsal(rehearsal)
    typer.echo(_human(outcome.render()))
    raise typer.Exit(0 if outcome.ok else 1)


@app.command()
def instances(
    fit: Annotated[
        Path | None, typer.Option("--fit", help="job spec YAML: which GPU types fit it, and cost per million tokens")
    ] = None,
    as_json: Json = False,
) -> None:
    """The instance catalog: GPUs, memory, price (--fit JOB.yaml: which types fit that job)."""
    from .catalog import all_instances
    from .pricing import list_price_basis

    if fit is not None:
        from .memory import fit_table, render_fit_table
        from .spec import load_spec

        what, fits = fit_table(load_spec(fit))
        if as_json:
            import json

            typer.echo(json.dumps({"job": what, "instances": [{**vars(f), "fits": f.fits} for f in fits]}, indent=2))
        else:
            typer.echo(render_fit_table(what, fits))
        return
    rows = [i for i in all_instances() if i.gpus]
    if as_json:
        import dataclasses
        import json

        typer.echo(json.dumps([dataclasses.asdict(i) for i in rows], indent=2))
        return
    for i in rows:
        price = i.hourly_usd.get("us-east-1")
        # Each row's source and date: EC2 and SageMaker figures come from different sources.
        basis = list_price_basis(i.name, "us-east-1").removeprefix("AWS ")
        typer.echo(
            f"{i.name:22} {i.gpus} x {i.gpu_model:5} {i.gpu_memory_gib:4} GiB  "
            f"cc {i.compute_capability_str}  ${price if price else '?'}/h (us-east-1, {basis})"
        )


def _notice_default_limit(spec: JobSpec, plan: Plan) -> None:
    """A cloud job bills until it ends: say so when its limit is the default, not a choice."""
    from .backends import get_backend

    if not get_backend(plan.backend).billed or "max_run" in spec.model_fields_set:
        return
    worst = (plan.cost or {}).get("worst_case_usd")
    cost = f" (worst case ${worst:.2f}, {plan.cost['basis']})" if plan.cost and worst is not None else ""
    hours = spec.max_run / 3600
    print(f"note: no --max-run given: the job may run {hours:g} h{cost}; set --max-run, e.g. 2h", file=sys.stderr)


def _confirm(plan: Plan) -> None:
    """Paid work starts only on a yes: --yes, or an answer at the terminal."""
    worst = (plan.cost or {}).get("worst_case_usd")
    basis = f" ({plan.cost['basis']})" if plan.cost and worst else ""
    what = f"{plan.job_name} on {plan.summary.get('instance')}" + (f", worst case ${worst:.2f}{basis}" if worst else "")
    if not sys.stdin.isatty():
        raise UserError(f"submitting {what} costs money: add --yes to submit without a terminal to confirm")
    if not typer.confirm(f"Submit {what}?", default=False, err=True):
        raise UserError("not submitted (answered no); add --yes to skip the question")


def _act(plan: Plan, spec: JobSpec, *, dry_run: bool, as_json: bool, wait: bool, yes: bool) -> NoReturn:
    """A dry run ends after the plan (a failed check as its last line); a submit runs it. With
    --json, stdout holds one JSON document once submit returns, the plan with its `result` (the
    job's own output goes to stderr), so `| jq` and `| python -m json.tool` read it."""
    import contextlib

    from .api import submit_job
    from .backends import get_backend
    from .plan import refuse_failed_checks

    try:
        refuse_failed_checks(plan, exit_code=1 if dry_run else 2)
        _notice_default_limit(spec, plan)
        if dry_run:
            raise typer.Exit(0)
        if get_backend(plan.backend).billed and not yes:  # paid work starts only on a yes
            _confirm(plan)
        if plan.summary.get("wandb"):  # before the job starts: a local job runs in the foreground
            print(f"W&B run: {plan.summary['wandb']}", file=sys.stderr)
        if not as_json:
            raise typer.Exit(submit_job(plan, wait=wait))
        with contextlib.redirect_stdout(sys.stderr):
            code = submit_job(plan, wait=wait)
    except UserError as e:
        if dry_run or not as_json:
            raise
        refused = {"job": plan.job_name, "status": "NotSubmitted", "exit_code": e.exit_code, "error": str(e)}
        _echo_document(plan, refused)
        raise
    _echo_document(plan, _result(plan, code))
    raise typer.Exit(code)


def _echo_plan(plan: Plan, as_json: bool) -> None:
    """A dry run's plan: with --json, the one document on stdout."""
    typer.echo(plan.to_json() if as_json else _human(plan.render()))  # a resumed spec comes from S3
    _DOCUMENT_PRINTED[0] = as_json


def _echo_document(plan: Plan | None, result: dict[str, Any]) -> None:
    import json

    typer.echo(json.dumps({**(plan.to_dict() if plan else {}), "result": result}, indent=2, default=str))
    _DOCUMENT_PRINTED[0] = True


def _json_refusal(argv: list[str], error: str, exit_code: int) -> None:
    """`submit/resume --json` refused before it printed its document (a bad flag or spec, no
    credentials, a refused preflight): stdout still holds one document, the refusal's, shaped as
    a refused plan's `result` is (README's `submit --json`), with no plan around it."""
    if argv[:1] in (["submit"], ["resume"]) and "--json" in argv and not _DOCUMENT_PRINTED[0]:
        job = argv[1] if argv[0] == "resume" and len(argv) > 1 and not argv[1].startswith("-") else None
        _echo_document(None, {"job": job, "status": "NotSubmitted", "exit_code": exit_code, "error": error})


def _result(plan: Plan, code: int) -> dict[str, Any]:
    """What a script wants once submit returns: the job, its state, where the model is, and its
    last metrics (a local job's, read from its metrics.jsonl; a cloud job's reach S3 when it ends:
    `distrain-cloud report JOB`)."""
    from .backends import get_backend
    from .jobs import find_job

    try:
        info = get_backend(plan.backend).status(find_job(plan.job_name))
    except UserError as e:  # a cloud job just submitted may not be visible yet
        info = {"status": "Submitted", "detail": str(e)}
    model, metrics = info.get("model_artifacts"), None
    if plan.backend == "local":
        root = Path(plan.request["cwd"])
        model = str(root / "model") if (root / "model" / "config.json").is_file() else None
        metrics = last_metrics(root / "output" / "metrics.jsonl")
    return {
        "job": plan.job_name,
        "backend": plan.backend,
        "status": info.get("status"),
        "exit_code": code,
        "model": model,
        "metrics": metrics,
        "detail": info.get("detail") or None,
    }


def last_metrics(path: Path, limit: int = 64 << 20) -> dict[str, float | int] | None:
    """Each metric's last value in a metrics.jsonl (the step it was logged at as `step`), or None
    without one. Read as untrusted: lines that are not objects of numbers are skipped, and a file
    past `limit` bytes is read from its end only."""
    import json
    import math

    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    last: dict[str, float | int] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(row, dict):
            continue
        for key, value in row.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if isinstance(key, str) and len(key) <= 100 and number and math.isfinite(value):
                last[key] = value
    return last or None


def _pairs(items: list[str] | None, flag: str) -> dict[str, str] | None:
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            # Name the flag only: a value pasted without NAME= may be the secret itself.
            raise UserError(f"{flag} expects NAME=VALUE (one of them is not)")
        out[key] = value
    return out


# `status` for people: where the job stands first; what only scripts use (--json has all) left out.
_STATUS_FIRST = ("job_name", "status", "step", "loss", "elapsed", "eta", "created")
_STATUS_FOR_SCRIPTS = ("terminal",)


def _show(info: dict, as_json: bool) -> None:
    import json

    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
    else:
        first = {k: info[k] for k in _STATUS_FIRST if k in info}
        shown = {**first, **info}
        for k, v in shown.items():
            if k in _STATUS_FOR_SCRIPTS or v is None or v == "":  # `exit_code: None` says nothing
                continue
            if k == "started" and info.get("backend") == "local":  # its process's start in clock ticks
                continue
            if isinstance(v, list) and v and all(isinstance(item, dict) for item in v):  # a lineage's attempts
                typer.echo(f"{k}:")
                for item in v:
                    typer.echo(_human("  " + ", ".join(f"{a}: {b}" for a, b in item.items() if b not in ("", None))))
                continue
            typer.echo(_human(f"{k}: {_when(v) if k in ('created', 'updated') else v}"))


def _human(text: str) -> str:
    """`text` for a terminal: its lines as they are, any control character in them shown, not obeyed."""
    from .logs import printable

    return "\n".join(printable(line) for line in text.split("\n"))


def _when(value: object) -> str:
    """A time as people read it: seconds since the epoch (local records) become local time."""
    import time

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    return str(value)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _TRAIN_ARGS.clear()
    _DOCUMENT_PRINTED[0] = False
    if "--" in argv:
        cut = argv.index("--")
        _TRAIN_ARGS[:] = argv[cut + 1 :]
        argv = argv[:cut]
    try:
        if argv[:1] in (["submit"], ["resume"]) and "--json" in argv:
            # click's own refusals (an unknown flag, a bad value) come back here rather than exit.
            sys.exit(app(args=argv, prog_name="distrain-cloud", standalone_mode=False))
        app(args=argv, prog_name="distrain-cloud", standalone_mode=True)
    except click.ClickException as e:  # standalone_mode=False only
        _json_refusal(argv, e.format_message(), e.exit_code)
        e.show()
        sys.exit(e.exit_code)
    except click.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except UserError as e:
        _json_refusal(argv, str(e), e.exit_code)
        if os.environ.get("DISTRAIN_DEBUG"):
            raise
        print(_human(f"error: {e}"), file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
