"""The local backend: the container contract in a work folder on this machine, no Docker.

`<workdir>/<job>/` holds the contract's folders (model/, output/, checkpoints/), the plan
(job.json), the log (job.log) and the exit status (status.json). The job runs the same
node launcher every backend runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError, value_errors_as_user_errors
from distrain_cloud.training.contract import STOP_EXIT_CODES, Contract, free_port
from distrain_cloud.training.node_launch import EXIT_FILE_ENV, LOG_TIMES_ENV, plan_node
from distrain_cloud.training.stopping import (
    LAUNCHER_MARGIN_S,
    STOP_UNSAVED_EXIT_CODE,
    ProcessTree,
    _start_time,
    child_dies_with_us,
)
from distrain_cloud.training.strategies import choose_precision

from ..lease import launched as lineage_launched
from ..plan import Check, JobRef, LeaseTarget, Plan, refuse_failed_checks, unique_job_name
from ..tracking import tracking_env, wandb_run

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..logs import LogLine
    from ..spec import JobSpec


def local_gpus() -> tuple[int, tuple[int, int] | None]:
    """(GPU count, lowest compute capability) from nvidia-smi; no torch import."""
    if not shutil.which("nvidia-smi"):
        return 0, None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return 0, None
    caps = [tuple(int(x) for x in c.split(".")) for c in out if c[:1].isdigit()]
    return len(caps), (min(caps) if caps else None)  # type: ignore[return-value]


class LocalBackend:
    name = "local"
    title = "local"
    billed = False
    stops_now = True  # the job's process tree killed at once, no checkpoint
    finds_by_name = False  # a job of this machine has a record or a folder: jobs.find_job finds it first
    lease_fields: tuple[str, ...] = ("workdir",)  # the runs folder the holder's job folder is in

    def plan(self, spec: JobSpec) -> Plan:
        if spec.nodes != 1:
            raise UserError(
                f"--nodes {spec.nodes}: the local backend runs one node; drop --nodes or use a SageMaker instance type"
            )
        if spec.spot:
            raise UserError("--spot applies to cloud instances, not --instance local")
        gpus, capability = local_gpus()
        with value_errors_as_user_errors():
            precision = choose_precision(spec.precision, gpus, capability, "this machine")
        job_name = unique_job_name(spec.name)
        spec = _with_absolute_data_paths(spec)
        flags = spec.training_args(precision, job_name)
        argv, train_args = flags.argv, flags.args
        root = (spec.local.workdir / job_name).resolve()
        # A lineage shares one checkpoint folder: the first job's.
        checkpoints, lineage = root / "checkpoints", job_name
        if spec.resume_from:
            checkpoints, lineage = _lineage(spec.local.workdir, spec.resume_from)
            if not checkpoints.is_dir():
                raise UserError(f"--resume-from {spec.resume_from}: no checkpoints at {checkpoints}")
        contract = Contract(
            model_dir=root / "model",
            output_dir=root / "output",
            checkpoint_dir=checkpoints,
            channels={k: Path(v).resolve() for k, v in spec.inputs.items()},
            gpus_per_node=gpus,
            main_port=free_port(),
        )
        with value_errors_as_user_errors():
            node = plan_node(argv, contract, processes=spec.local.processes, args=train_args)
        processes = node.config["num_processes"]
        command = [sys.executable, "-m", "distrain_cloud.training.node_launch"]
        if spec.local.processes:
            command += ["--processes", str(spec.local.processes)]
        command += ["--", *argv]
        tracking = tracking_env(lineage=lineage, instance="local")
        env = {**contract.to_env(), **node.env, **tracking}
        if spec.secrets:
            # References only: the wrapper resolves them inside the job's own process.
            env["DISTRAIN_SECRETS"] = json.dumps(dict(spec.secrets))
            command = [sys.executable, "-m", "distrain_cloud.infra.secret_env", "--", *command]
        configs: dict[str, Any] = {"accelerate_config": node.config}
        from distrain_cloud.training.decisions import shown as strategy_shown

        from ..memory import planned_decisions

        # How long a stop may take before this process kills what is left: the trainers' grace,
        # node_launch's margin, and one more for node_launch's own end.
        stop_bound_s = train_args.stop_grace + 2 * LAUNCHER_MARGIN_S
        saved = saved_state(checkpoints)
        # As the job will resolve --strategy auto, but for the GPUs' link, which the job checks itself.
        decisions = planned_decisions(  # its refusals are one line (e.g. fp8 on a checkpoint trained sharded)
            train_args, world_size=processes, nodes=1, gpu_model=None, cuda=gpus > 0, saved=saved
        )
        shown = strategy_shown(decisions)
        if decisions.strategy.shards_state:
            from distrain_cloud.training.decisions import plan_configs

            configs.update(plan_configs(decisions, processes))
        wandb = wandb_run(spec, train_args, tracking)
        stack = _has_training_stack()
        checks = [
            Check("training arguments parse", True),
            Check("work folder is new", not root.exists(), str(root)),
            Check("training stack installed", stack, "" if stack else "pip install 'distrain-cloud[train]'"),
        ]
        for name, path in contract.channels.items():
            checks.append(Check(f"input channel {name} exists", path.exists(), str(path)))
        if spec.secrets:
            checks.append(Check("secrets", True, "resolved inside the job from: " + ", ".join(spec.secrets)))
        if spec.resume_from and saved is not None:
            checks.append(_steps_beyond(saved, train_args.max_steps))
        # Only a limit the user set: the default (24 h) bounds a cloud bill, and a local job bills nothing.
        max_run_s = spec.max_run if "max_run" in spec.model_fields_set else None
        return Plan(
            backend=self.name,
            job_name=job_name,
            summary={
                "instance": "local",
                "processes": processes,
                "gpus": gpus,
                "strategy": shown,
                "precision": precision,
                "workdir": str(root),
                **({"resumes": f"{spec.resume_from} (lineage {lineage}: {checkpoints})"} if spec.resume_from else {}),
                **({"wandb": wandb} if wandb else {}),
                **({"max_run": f"{max_run_s} s, then it stops with a checkpoint, as cancel does"} if max_run_s else {}),
            },
            request={
                "command": command,
                "env": env,
                "cwd": str(root),
                "stop_bound_s": stop_bound_s,
                **({"max_run_s": max_run_s} if max_run_s else {}),
            },
            spec=spec,
            configs=configs,
            checks=checks,
            training=flags,
            record={"lineage": lineage, "resumed_from": spec.resume_from},
            # The lease is a file beside the job records; its holder is found in this runs folder.
            lease=LeaseTarget(lineage, None, None, extra=(("workdir", str(root.parent)),)),
        )  # no backend payload: submit reads the request and the spec alone

    def preflight(self, plan: Plan) -> Plan:
        return plan  # nothing to ask a cloud: every check ran in plan

    def submit(self, plan: Plan, *, wait: bool = True) -> int:
        refuse_failed_checks(plan)
        root = Path(plan.request["cwd"])
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir()  # exclusive: never reuse another job's folder
        (root / "job.json").write_text(plan.to_json())
        env = {
            **os.environ,
            **plan.request["env"],
            # Each line reaches job.log as it is printed, not 8 KB later: `logs` reads it live.
            "PYTHONUNBUFFERED": "1",
            # How the job ended, written by its node launcher: `status` reads it if this process is gone.
            EXIT_FILE_ENV: str(root / EXIT_FILE),
            "DISTRAIN_JOB_NAME": plan.job_name,  # for the resume command in a failure's line
            LOG_TIMES_ENV: "1",  # each line with its time: `logs --json` gives it
        }
        # The job's processes write job.log themselves (append: one file offset for them all), so
        # the log is whole however this process ends; this process shows it by reading it back.
        with open(root / "job.log", "ab") as log, open(root / "job.log", "rb") as tail:
            # A process group of its own: a terminal's Ctrl-C reaches this process only, which
            # passes it on once (the node launcher signals each training process). This process
            # ending any other way (killed, its terminal closed) stops the job as SIGTERM does.
            proc = subprocess.Popen(
                plan.request["command"],
                cwd=root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=child_dies_with_us(signal.SIGTERM),
            )
            lineage_launched(plan)  # the job's process exists: its status decides the lease from now on
            # Who runs it (its start time tells it from a later process given the same pid), so that
            # `status` can tell a job still running from one killed with us, and `cancel` can stop it.
            host = socket.gethostname()
            _write_status(root, "InProgress", pid=proc.pid, host=host, started=_start_time(proc.pid))
            tree, killed, timers = ProcessTree(proc.pid), threading.Event(), list[threading.Timer]()
            bound = float(plan.request.get("stop_bound_s", 80.0))

            def kill_after_bound() -> None:
                if proc.poll() is None:
                    print(f"job {plan.job_name}: still running {bound:g} s after the stop: killing it", file=sys.stderr)
                    killed.set()
                    tree.kill()  # every process, in whatever group or session it moved to

            def forward(signum: int, frame: Any) -> None:
                if not timers:  # the first stop starts the clock
                    tree.refresh()
                    timers.append(threading.Timer(bound, kill_after_bound))
                    timers[0].daemon = True
                    timers[0].start()
                proc.send_signal(signum)

            previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
            limit = plan.request.get("max_run_s")

            def stop_at_limit() -> None:
                # As `cancel` stops it: a request on record (status says why), then the signal.
                if proc.poll() is None:
                    (root / CANCEL_FILE).write_text(json.dumps({"now": False, "at": time.time(), "max_run": limit}))
                    print(f"job {plan.job_name}: --max-run {limit} s reached: stopping it with a checkpoint",
                          file=sys.stderr)  # fmt: skip
                    forward(signal.SIGTERM, None)

            deadline = threading.Timer(float(limit), stop_at_limit) if limit else None
            if deadline is not None:
                deadline.daemon = True
                deadline.start()
            shown = TerminalProgress(sys.stdout)
            try:
                code = _show_until_exit(proc, tail, shown)
                if killed.is_set():
                    code = STOP_UNSAVED_EXIT_CODE
                elif code < 0:  # killed by a signal (cancel --now): as a shell reports it
                    code = 128 - code
            finally:
                shown.close()
                if deadline is not None:
                    deadline.cancel()
                for timer in timers:  # the kill after a stop: the job ended before its bound
                    timer.cancel()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        status, detail = _ending(root, plan.job_name, code, stop_asked=bool(timers))
        _write_status(root, status, code, detail=detail)
        model = root / "model"
        saved = f"model in {model}, " if (model / "config.json").is_file() else ""
        report = (
            f"; plots: distrain-cloud report {plan.job_name}" if (root / "output" / "metrics.jsonl").is_file() else ""
        )
        # A stopped job's last words name how to go on (a failure's detail names it where it can).
        resume = f"; continue it: distrain-cloud resume {plan.job_name}" if status == "Stopped" else ""
        print(
            f"job {plan.job_name}: {status.lower()}{f' ({detail})' if status == 'Failed' else ''}; "
            f"{saved}logs in {root / 'job.log'}{report}{resume}",
            file=sys.stderr,
        )
        return code

    # ------------------------------------------------------------------ lifecycle

    def _root(self, job: JobRef) -> Path:
        root = job.workdir / job.name
        if not (root / "job.json").is_file():
            raise UserError(f"no local job {job.name!r} under {job.workdir}/ (see `distrain-cloud ls`)")
        return root

    def refuse_empty_resume(self, job: JobRef) -> None:
        """`resume` of a local job that would retrain for nothing: one whose model is whole (training
        finished; what failed came after, such as the push) or whose lineage kept no complete
        checkpoint (it would train again from step 1, silently). Refused, naming what the user likely
        wants. (Optional in the Protocol: cloud lineages keep their checkpoints in S3, and there
        training says so at its start.)"""
        from distrain_cloud.training.checkpoint import newest_state

        from ..push import MODEL_CARD

        model = job.workdir / job.name / "model"
        if (model / MODEL_CARD).is_file():
            raise UserError(
                f"{job.name} trained every step and saved its model in {model.resolve()}: what failed came after (its "
                f"push to the Hub: `distrain-cloud push {job.name}` retries only that). To train further, resume it "
                f"with a higher --max-steps: distrain-cloud submit --resume-from {job.name} -- --max-steps N"
            )
        checkpoints, _ = _lineage(job.workdir, job.name)
        if newest_state(checkpoints) is None:
            raise UserError(
                f"{job.name} has no checkpoint to resume from in {checkpoints} (it saved none): a resume would train "
                f"again from step 1; to train afresh, submit its spec again (without --resume-from {job.name})"
            )

    def find(self, name: str, region: str | None) -> JobRef | None:
        """None: a local job is found by its record or its folder (jobs.find_job), never elsewhere."""
        return None

    def holder_state(self, holder: dict[str, Any]) -> tuple[bool, str] | None:
        """(ended, status) of the job holding a lineage's lease (launcher/lease.py), from its folder
        in the runs folder its lease names; None when there is no such job (yet)."""
        runs = Path(holder["workdir"])
        if not (runs / holder["job"] / "job.json").is_file():
            return None
        if not (runs / holder["job"] / "status.json").is_file():
            return False, "starting"  # its folder is there, its process not yet
        try:
            info = self.status(JobRef(holder["job"], "local", workdir=runs))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise UserError(f"its status.json is malformed ({type(e).__name__})") from None
        return bool(info["terminal"]), str(info["status"])

    def status(self, job: JobRef) -> dict[str, Any]:
        root = self._root(job)
        info = _read_status(root)
        if info["status"] == "InProgress" and _gone(info):
            # Ended with nobody left to record how (its CLI killed, a closed terminal, a reboot):
            # its node launcher's exit record says, if it lived to write one. Recorded now, so a
            # reused pid cannot revive it.
            code, stopped = _read_exit(root)
            if code is not None:
                status, detail = _ending(root, job.name, code, stop_asked=stopped)
            elif _cancel_asked(root) == "now":  # killed at once, node_launch included
                code = 128 + signal.SIGKILL
                status, detail = _ending(root, job.name, code, stop_asked=True)
            else:
                status = "Lost"
                detail = f"its processes (pid {info['pid']}) ended without recording an exit status; see job.log"
            _write_status(root, status, code, detail=detail)
            info = _read_status(root)
        return {
            "job_name": job.name,
            **info,
            "terminal": info["status"] != "InProgress",
            "detail": info.get("detail", ""),
            "created": _created(root),
            **last_progress(root / "job.log", running=info["status"] == "InProgress"),
        }

    def list_jobs(self, *, region: str | None, workdir: Path, limit: int) -> list[dict[str, Any]]:
        """The jobs in `workdir`, and those this machine's job records (written at submit, from
        any folder) place elsewhere: `ls` finds a job wherever it was submitted from."""
        from ..jobs import recorded_jobs
        from ..logs import printable
        from ..spec import JOB_NAME

        folders = sorted(workdir.iterdir()) if workdir.is_dir() else []
        for record in recorded_jobs():
            name, folder = record.get("name"), record.get("workdir")
            # A name, never a path out of its folder.
            if record["backend"] == self.name and folder and isinstance(name, str) and JOB_NAME.fullmatch(name):
                folders.append(Path(folder) / name)
        jobs, seen = [], set()
        for p in folders:
            if not (p / "job.json").is_file() or not (p / "status.json").is_file():
                continue  # not a job folder (a record's job may have been deleted since)
            key = p.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                info = self.status(JobRef(p.name, self.name, workdir=p.parent))
                jobs.append({**info, "backend": self.name, "workdir": str(p.parent)})
            except (UserError, OSError) as e:  # one broken folder must not hide the others
                print(printable(f"note: skipped local job {p.name}: {e}"), file=sys.stderr)
        return sorted(jobs, key=lambda j: j["created"] or 0.0, reverse=True)[:limit]

    def log_lines(self, job: JobRef, *, follow: bool = False) -> Iterator[LogLine]:
        from ..logs import LOCAL_HOST, split_lines, unstamp

        path = self._root(job) / "job.log"  # here, not in the loop: an unknown job fails before any line

        def lines() -> Iterator[LogLine]:
            partial = b""  # a line still being written: it goes out once whole, or at the end
            with open(path, "rb") as f:
                while True:
                    ended = not follow or self.status(job)["terminal"]  # before reading: nothing is missed
                    *whole, partial = (partial + f.read()).split(b"\n")
                    for line in whole:
                        when, text = unstamp(line.decode(errors="replace"))
                        yield from split_lines(text, LOCAL_HOST, when)
                    if ended:
                        if partial:
                            when, text = unstamp(partial.decode(errors="replace"))
                            yield from split_lines(text, LOCAL_HOST, when)
                        return
                    time.sleep(1)

        return lines()

    def cancel(self, job: JobRef, *, now: bool = False) -> str:
        """Stop the job as Ctrl-C in its terminal would (SIGTERM to its node launcher, which
        stops each training process at its step's end, with a checkpoint), or with `now` kill
        its whole process tree at once; then wait, within the stop's bound, for its status."""
        root = self._root(job).resolve()
        info = self.status(job)
        if info["terminal"]:
            return f"{job.name} already ended: {info['status']}"
        pid = info.get("pid")
        if pid is None:
            raise UserError(
                f"{job.name} has not recorded its process yet (it is starting): cancel it again in a moment"
            )
        if info.get("host") != socket.gethostname():
            raise UserError(f"{job.name} runs on host {info.get('host')}, not this one: cancel it there")
        why = _not_this_job(root, pid, info.get("started"))
        if why:  # status.json is a file anyone may edit, and pids are reused: signal nothing
            raise UserError(f"{job.name}: its status.json names pid {pid}, {why}: nothing was signalled")
        (root / CANCEL_FILE).write_text(json.dumps({"now": now, "at": time.time()}))
        if now:
            ProcessTree(pid).kill()  # every process of the job, wherever it moved
            bound = 10.0
        else:
            os.kill(pid, signal.SIGTERM)
            bound = _stop_bound(root) + LAUNCHER_MARGIN_S
            print(
                f"stopping {job.name}: it saves a checkpoint at the end of this step (at most {bound:g} s; "
                f"`distrain-cloud cancel {job.name} --now` ends it at once)",
                file=sys.stderr,
            )
        deadline = time.monotonic() + bound
        while not (info := self.status(job))["terminal"]:
            if time.monotonic() > deadline:
                raise UserError(
                    f"{job.name} is still running {bound:g} s after the stop: "
                    f"`distrain-cloud cancel {job.name} --now` ends it at once"
                )
            time.sleep(0.2)
        return f"{job.name}: {info['status'].lower()}" + (f" ({info['detail']})" if info["detail"] else "")


def saved_state(checkpoints: Path, limit: int = 1 << 20) -> dict[str, Any] | None:
    """The trainer state of the newest complete checkpoint in `checkpoints` (unverified, as the
    job's own choice of strategy reads it), or None. Its bytes may be anyone's: a file past
    `limit`, not JSON, or not an object counts as no state."""
    from distrain_cloud.training.checkpoint import STATE, complete_checkpoints

    for _, path in reversed(complete_checkpoints(checkpoints)):
        try:
            with open(path / STATE, "rb") as f:
                data = f.read(limit + 1)
            state = json.loads(data) if len(data) <= limit else None
        except (OSError, ValueError, RecursionError):  # ValueError: not UTF-8, not JSON, too many digits
            state = None
        return state if isinstance(state, dict) else None
    return None


def _steps_beyond(saved: dict[str, Any], max_steps: int | None) -> Check:
    """A resumed job trains from its checkpoint's step to --max-steps: at or below that step it
    would train nothing and fail once started (training/trainer.py says the same, too late)."""
    step = saved.get("step")
    name = "--max-steps is beyond the checkpoint's step"
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return Check(name, None, "the checkpoint's trainer state names no step: the job checks it")
    if max_steps is None:
        return Check(name, None, f"the checkpoint is at step {step}; the job counts --epochs once the data loads")
    if max_steps > step:
        return Check(name, True, f"{step} -> {max_steps}")
    return Check(
        name,
        False,
        f"the checkpoint is at step {step} and --max-steps {max_steps} trains nothing further: "
        f"give more, e.g. --max-steps {2 * step or 1}",
    )


def _created(root: Path) -> float | None:
    """When the job was submitted: its plan's time, which nothing writes again (as `ls` shows it)."""
    try:
        return (root / "job.json").stat().st_mtime
    except OSError:
        return None


# A step line's fields that `status` shows, as the trainer prints them (`step=N ... train_loss=L
# ... progress=N/T elapsed=H:MM:SS eta=H:MM:SS`); each field at most this many characters.
_PROGRESS_FIELDS = {"progress": "step", "train_loss": "loss", "elapsed": "elapsed", "eta": "eta"}
_FIELD_CHARS = 40


def last_progress(log: Path, *, running: bool, tail: int = 64 << 10) -> dict[str, str]:
    """Where the job stands, from the last step line in its log's last `tail` bytes: step N/T,
    loss and elapsed time (and the ETA while it runs). Empty before its first step line. The log
    holds what anything in the job printed: only the known fields are taken, each short."""
    from ..logs import unstamp

    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        text = unstamp(line)[1]
        if not text.startswith("step=") or " progress=" not in text:
            continue
        fields = dict(token.split("=", 1) for token in text.split() if "=" in token)
        return {
            name: fields[key][:_FIELD_CHARS]
            for key, name in _PROGRESS_FIELDS.items()
            if fields.get(key) and (running or key != "eta")
        }
    return {}


# Beside job.log in a job's folder: the node launcher's exit record, and a cancel's request.
EXIT_FILE = "exit.json"
CANCEL_FILE = "cancel.json"


def _show_until_exit(proc: subprocess.Popen, log: Any, shown: TerminalProgress) -> int:
    """Show job.log (`log`, open for reading) as it grows until the job's process ends, then
    the rest, each line without the time it starts with; its exit code."""
    from ..logs import unstamp

    partial = b""  # a line still being written: shown once whole, or at the end
    while True:
        code = proc.poll()  # before reading: lines written before the end are all read below
        chunk = log.read()
        *whole, partial = (partial + chunk).split(b"\n")
        for line in whole:
            shown.write(unstamp(line.decode(errors="replace"))[1].encode() + b"\n")
        if code is not None:
            if partial:
                shown.write(unstamp(partial.decode(errors="replace"))[1].encode())
            return code
        if not chunk:
            time.sleep(0.1)


def _ending(root: Path, job_name: str, code: int, *, stop_asked: bool) -> tuple[str, str]:
    """(status, detail) of a job that exited `code`; `stop_asked`: a stop signal reached it."""
    cancel = _cancel_asked(root)
    if code == 0:
        return "Completed", ""
    resume = f"resume with --resume-from {job_name}"
    if cancel == "now":
        return "Stopped", f"cancelled at once (cancel --now), no checkpoint of the step in progress; {resume}"
    if code in STOP_EXIT_CODES or (code == STOP_UNSAVED_EXIT_CODE and (stop_asked or cancel is not None)):
        saved = "" if code in STOP_EXIT_CODES else ", no checkpoint saved: the step in progress did not end in time"
        if cancel == "max_run":
            return "Stopped", f"stopped at its --max-run limit{saved}; {resume}"
        how = "distrain-cloud cancel" if cancel else "Ctrl-C or SIGTERM"
        return "Stopped", f"stopped on request ({how}){saved}; {resume}"
    failure = root / "output" / "failure"
    detail = _text(failure).strip().removeprefix("error: ") if failure.is_file() else ""
    return "Failed", detail or f"training exited with code {code} (see {root / 'job.log'})"


def _text(path: Path, limit: int = 4000) -> str:
    """A file the job wrote, as text: its first `limit` bytes (a failure line, not a disk's worth)."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def _read_exit(root: Path) -> tuple[int | None, bool]:
    """(exit code, whether it was stopped) from the node launcher's record; (None, False) if
    there is none, or it is not what node_launch writes."""
    try:
        record = json.loads(_text(root / EXIT_FILE))
    except (ValueError, RecursionError):
        return None, False
    code = record.get("exit_code") if isinstance(record, dict) else None
    if not isinstance(code, int) or isinstance(code, bool) or not -256 < code < 256:
        return None, False
    return code, record.get("stopped") is not None


def _cancel_asked(root: Path) -> str | None:
    """`now` or `stop` when `cancel` asked this job to end, `max_run` when its --max-run did,
    else None."""
    try:
        record = json.loads(_text(root / CANCEL_FILE))
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    return "now" if record.get("now") is True else "max_run" if record.get("max_run") else "stop"


def _stop_bound(root: Path) -> float:
    """The job's stop bound (`stop_bound_s` in its plan), 80 s where the plan does not say."""
    try:
        plan = json.loads(_text(root / "job.json", 10_000_000))
        bound = plan["request"]["stop_bound_s"]
    except (ValueError, RecursionError, KeyError, TypeError):
        return 80.0
    return float(bound) if isinstance(bound, (int, float)) and 0 < bound < 86_400 else 80.0


def _not_this_job(root: Path, pid: int, started: int | None) -> str:
    """Why process `pid` is not the job in `root` (empty when it is): a later process given a
    reused pid starts at another time; the job's runs in its folder, a distrain-cloud command."""
    start = _start_time(pid)
    if start is None:
        return "which no longer runs"
    if started is not None and start != started:
        return "now a later process reusing that pid"
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "which this user cannot inspect (another user's process?)"
    if cwd != root:
        return "a process that runs elsewhere, not in this job's folder"
    if b"distrain_cloud." not in cmdline:
        return "a process that is not a distrain-cloud job"
    return ""


def _lineage(workdir: Path, job: str) -> tuple[Path, str]:
    """(checkpoint folder, lineage) that job `job` used: its plan names them, so a resumed job's
    resume keeps the first job's folder; a folder with no plan falls back to its own."""
    plan_file = workdir / job / "job.json"
    if plan_file.is_file():
        try:  # what submit wrote, unless someone changed it: any other shape counts as no plan
            plan = json.loads(plan_file.read_bytes())
        except (ValueError, RecursionError):
            plan = None
        request = plan.get("request") if isinstance(plan, dict) else None
        env = request.get("env") if isinstance(request, dict) else None
        folder = env.get("DISTRAIN_CHECKPOINT_DIR") if isinstance(env, dict) else None
        if folder and isinstance(folder, str):
            lineage = env.get("DISTRAIN_LINEAGE") if isinstance(env, dict) else None
            return Path(folder), lineage if isinstance(lineage, str) and lineage else Path(folder).parent.name
    return (workdir / job / "checkpoints").resolve(), job


class TerminalProgress:
    """The job's output as it comes; on a terminal, its step lines (`step=N ... progress=N/T ...`)
    redraw one status line in place (a bar, loss, tokens/s, elapsed, ETA) instead of scrolling.
    The log file always gets every line in full."""

    def __init__(self, stream: Any):
        self.stream, self.showing = stream, False
        self.live = hasattr(stream, "isatty") and stream.isatty()

    def write(self, line: bytes) -> None:
        text = line.decode(errors="replace")
        if self.live and text.startswith("step=") and " progress=" in text and "train_loss=" in text:
            self.stream.write("\r\x1b[K" + self.render(text))
            self.showing = True
        else:
            if self.showing:  # a log line goes above the status line, which the next step redraws
                self.stream.write("\r\x1b[K")
                self.showing = False
            self.stream.write(text)
        self.stream.flush()

    @staticmethod
    def render(text: str) -> str:
        kv = dict(token.split("=", 1) for token in text.split() if "=" in token)
        done, _, total = kv["progress"].partition("/")
        filled = int(20 * int(done) / max(int(total), 1))
        tokens = float(kv.get("tokens_per_sec", "0"))
        return (
            f"[{'#' * filled}{'.' * (20 - filled)}] step {kv['progress']} | loss {kv['train_loss']} | "
            f"{tokens:,.0f} tokens/s | elapsed {kv.get('elapsed', '?')} | ETA {kv.get('eta', '?')}"
        )

    def close(self) -> None:
        if self.showing:
            self.stream.write("\n")
            self.stream.flush()
            self.showing = False


def _has_training_stack() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "accelerate"))


# status.json as `_write_status` writes it: the keys `status` and `ls` read, and their types.
LOCAL_STATUSES = ("InProgress", "Completed", "Failed", "Stopped", "Lost")
_STATUS_KEYS: dict[str, tuple[type, ...]] = {
    "exit_code": (int,),
    "pid": (int,),
    "host": (str,),
    "updated": (int, float),
    "detail": (str,),
    "started": (int,),
}


def _with_absolute_data_paths(spec: JobSpec) -> JobSpec:
    """`spec` with its relative data paths made absolute against this working directory, where
    the user named them (args.absolute_data_paths): the job runs in a folder of its own, and a
    resume from another folder reads the same files."""
    from distrain_cloud.training.args import absolute_data_paths

    here = Path.cwd()
    hyperparameters = dict(spec.hyperparameters)
    for key, value in spec.hyperparameters.items():
        flag = "--" + key.replace("_", "-")
        if flag in ("--train-file", "--validation-file", "--dataset") and isinstance(value, str):
            hyperparameters[key] = absolute_data_paths([flag, value], here)[1]
    update = {"train_args": absolute_data_paths(spec.train_args, here), "hyperparameters": hyperparameters}
    return spec.model_copy(update=update)


def _read_status(root: Path) -> dict[str, Any]:
    """`root/status.json`, checked: a file that is not what `_write_status` writes (a hand
    edit, a disk that filled mid-write) is one UserError naming it."""
    path = root / "status.json"

    def bad(why: str) -> UserError:
        return UserError(f"{path} is not a job status ({why}): the job's own log is {root / 'job.log'}")

    try:
        info = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise UserError(f"{root.name} has no {path.name} yet: it is starting, or it was not started") from None
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON, too many digits
        raise bad(f"not JSON: {type(e).__name__}") from None
    if not isinstance(info, dict):
        raise bad(f"a JSON {type(info).__name__}, not an object")
    if info.get("status") not in LOCAL_STATUSES:
        raise bad(f"its status is {str(info.get('status'))[:40]!r}, not one of {', '.join(LOCAL_STATUSES)}")
    for key, types in _STATUS_KEYS.items():
        value = info.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise bad(f"its {key!r} is a {type(value).__name__}")
    if info.get("pid") is not None and info["pid"] <= 0:  # os.kill(0 or -1, ...) asks about other processes
        raise bad(f"its pid is {info['pid']}")
    return info


def _write_status(root: Path, status: str, exit_code: int | None = None, **extra: Any) -> None:
    record = {"status": status, "exit_code": exit_code, "updated": time.time(), **extra}
    (root / "status.json").write_text(json.dumps(record))


def _gone(info: dict[str, Any]) -> bool:
    """Whether the job's recorded process no longer runs (on this host: a work folder shared
    with another machine may hold that machine's running jobs)."""
    if "pid" not in info or info.get("host") != socket.gethostname():
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's process: alive
        return False
    try:  # a zombie (ended, not yet reaped: a container's init may never reap it) is gone too
        stat = Path(f"/proc/{info['pid']}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].startswith("Z")


BACKEND = LocalBackend()
