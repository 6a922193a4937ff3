"""What a run tells the outside about itself: its W&B run (which one, in which group, with which
config) and the model card beside the saved model."""

from __future__ import annotations

import configparser
import hashlib
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .args import TrainArgs
from .contract import Contract

WANDB_RESERVED = ":;,#?/'"  # characters W&B refuses in a run id
WANDB_CLOUD_API = "https://api.wandb.ai"
# With no route to W&B, wandb.init waits its init_timeout (90 s) and raises CommError before step
# 1. Two short requests (the Hub's probe, offline.py) tell in at most ~11 s, usually in one.
WANDB_PROBE_TIMEOUT_S = 5.0
WANDB_PROBE_ATTEMPTS = 2
_OFFLINE_MODES = ("offline", "dryrun", "disabled")


def start_wandb(accelerator: Any, args: TrainArgs, contract: Contract, run_id: str | None, say: Callable) -> str:
    """Start the job's W&B run (every process: Accelerate's trackers are collective) and return its
    id, which the checkpoints record so that a resumed job appends to the same run."""
    acc, a = accelerator, args
    offline_why = None if wandb_online(os.environ) else f"WANDB_MODE={os.environ['WANDB_MODE']}"
    if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
        # No key: write the run offline (sync it later with `wandb sync`) instead of failing.
        os.environ["WANDB_MODE"] = "offline"
        offline_why = "no WANDB_API_KEY"
    run_id = choose_wandb_run_id(run_id, os.environ)
    wandb_dir = contract.output_dir
    if acc.is_main_process:  # the one process that talks to W&B (Accelerate's trackers run there)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        quiet_wandb_when_piped(os.environ, (sys.stdout, sys.stderr))
        if wandb_online(os.environ):
            why = wandb_unreachable(os.environ)
            if why is not None:
                go_offline(why, wandb_dir, say)
                offline_why = None  # said
    extra = wandb_settings(a, contract, os.environ)
    kwargs = {
        "project_name": a.wandb_project,
        "config": {**a.to_dict(), **extra.pop("config"), "world_size": acc.num_processes},
        "init_kwargs": {
            "wandb": {
                "id": run_id,
                "resume": "allow",
                "name": a.run_name,
                "entity": a.wandb_entity,
                "dir": str(wandb_dir),
                **extra,
            }
        },
    }
    try:
        acc.init_trackers(**kwargs)
    except Exception as e:  # noqa: BLE001 - W&B answered the probe, then refused or timed out: train on
        acc.trackers.clear()  # the tracker whose start failed, which Accelerate keeps
        if not wandb_online(os.environ):
            say(f"note: W&B failed to start ({_first_line(e)}): this run is not tracked")
            return run_id
        go_offline(_first_line(e), wandb_dir, say)
        offline_why = None
        try:
            acc.init_trackers(**kwargs)
        except Exception as again:  # noqa: BLE001 - not even offline: the run goes on untracked
            acc.trackers.clear()
            say(f"note: W&B failed to start offline too ({_first_line(again)}): this run is not tracked")
            return run_id
    if offline_why and os.environ.get("WANDB_MODE") == "offline":  # W&B's own line is silenced when piped
        runs = wandb_dir / "wandb"
        say(
            f"note: the W&B run is written offline ({offline_why}); upload it later with "
            f"`wandb sync {runs}/offline-run-*`"
        )
    run = acc.get_tracker("wandb", unwrap=True) if acc.is_main_process else None
    url = getattr(run, "url", None) if os.environ.get("WANDB_MODE") != "offline" else None
    if url:  # once, where the job's log shows it: the launcher may not know the entity
        say(f"wandb_run={url}")
    return run_id


def wandb_online(env: Mapping[str, str]) -> bool:
    """Whether wandb.init would talk to a server: WANDB_MODE is not offline, dryrun or disabled."""
    return env.get("WANDB_MODE", "online").strip().lower() not in _OFFLINE_MODES


def wandb_base_url(env: Mapping[str, str]) -> str:
    """The W&B server the SDK talks to, found as it finds it: WANDB_BASE_URL, else `wandb login
    --host`'s settings file (its base_url), else W&B's cloud."""
    if env.get("WANDB_BASE_URL", "").strip():
        return env["WANDB_BASE_URL"].strip().rstrip("/")
    folder = env.get("WANDB_CONFIG_DIR") or str(Path(env.get("HOME") or Path.home()) / ".config" / "wandb")
    settings = configparser.ConfigParser()
    try:
        settings.read(Path(folder).expanduser() / "settings", encoding="utf-8")
        saved = settings.get("default", "base_url", fallback="").strip()
    except (configparser.Error, OSError, UnicodeDecodeError):
        saved = ""  # not ours to fix: W&B reads the same file and says what is wrong with it
    return saved.rstrip("/") or WANDB_CLOUD_API


def wandb_unreachable(env: Mapping[str, str], timeout_s: float = WANDB_PROBE_TIMEOUT_S) -> str | None:
    """Why the W&B server cannot be reached from here ("cannot reach URL: ..."), or None. At most
    WANDB_PROBE_ATTEMPTS requests of `timeout_s` each, through the proxies the environment names
    (HTTPS_PROXY, NO_PROXY: W&B's own client honours the same); any HTTP answer, even an error
    status, means the server is there."""
    import urllib.error  # here: the launcher imports this module for wandb_base_url alone
    import urllib.request

    url = wandb_base_url(env)
    if not url.startswith(("http://", "https://")):
        return f"WANDB_BASE_URL {url!r} is not an http(s) URL"
    reason = ""
    for attempt in range(WANDB_PROBE_ATTEMPTS):
        if attempt:
            time.sleep(1.0)  # a blip passes; a machine with no route says the same again
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
                return None
        except urllib.error.HTTPError:  # an answer: the server is there (auth is W&B's to judge)
            return None
        except Exception as e:  # noqa: BLE001 - any transport failure (DNS, refused, timeout, TLS, proxy)
            reason = _first_line(getattr(e, "reason", None) or e)
    return f"cannot reach {url}: {reason[:200]}"


def go_offline(why: str, wandb_dir: Path, say: Callable) -> None:
    """Write this run offline from now on, and say once why and how to upload it later."""
    os.environ["WANDB_MODE"] = "offline"
    say(
        f"note: W&B is out of reach ({why}): training goes on and writes its W&B run offline; upload it "
        f"later with `wandb sync {wandb_dir / 'wandb'}/offline-run-*`"
    )


def quiet_wandb_when_piped(env: dict[str, str] | os._Environ[str], streams: tuple[Any, ...]) -> bool:
    """W&B's terminal lines carry colour codes even into a file or pipe (its service process
    writes some of them itself, whatever the terminal is): where this process's output is not a
    terminal, silence them (WANDB_SILENT), unless the user chose (WANDB_SILENT or WANDB_QUIET set).
    The lines that matter are ours: the run's URL, the offline note with its `wandb sync`."""
    if "WANDB_SILENT" in env or "WANDB_QUIET" in env:
        return False
    if all(getattr(s, "isatty", lambda: False)() for s in streams):
        return False
    env["WANDB_SILENT"] = "true"
    return True


# How long the end of a run waits for W&B to finish (an online run uploads what it still holds).
# Past it the job ends anyway: a W&B upload stuck on a network gone mid-run must not keep a
# paid instance up. The run's files stay on disk for `wandb sync`.
WANDB_FINISH_TIMEOUT_S = 120.0


class GuardedTracking:
    """The run's W&B logging, which must never end the run or hold it up: a log or finish that
    raises (the W&B service gone, a full disk under its folder) is said once, and tracking stops
    there; a finish that does not return within `finish_timeout_s` is left behind (the entry
    point ends its process without waiting for other threads)."""

    def __init__(self, accelerator: Any, say: Callable[[str], None], finish_timeout_s: float = WANDB_FINISH_TIMEOUT_S):
        self.accelerator, self.say, self.finish_timeout_s = accelerator, say, finish_timeout_s

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if not self.accelerator.trackers:
            return
        try:
            self.accelerator.log(dict(metrics), step=step)
        except Exception as e:  # noqa: BLE001 - training matters more than its charts
            self._give_up(f"logging step {step}", e)

    def finish(self) -> None:
        """Finish the trackers (W&B's run) that are still going; the process group is the caller's."""
        trackers = list(self.accelerator.trackers)
        self.accelerator.trackers.clear()  # end_training must not finish them again
        for tracker in trackers:
            failed: list[BaseException] = []

            def finish(tracker: Any = tracker, failed: list[BaseException] = failed) -> None:
                try:
                    tracker.finish()
                except Exception as e:  # noqa: BLE001
                    failed.append(e)

            worker = threading.Thread(target=finish, name="wandb-finish", daemon=True)
            worker.start()
            worker.join(self.finish_timeout_s)
            if worker.is_alive():
                self.say(
                    f"note: W&B did not finish within {self.finish_timeout_s:g} s (an upload that cannot get "
                    "through?): the job ends without it; its files stay for `wandb sync`"
                )
            elif failed:
                self._give_up("finishing the run", failed[0])

    def _give_up(self, what: str, error: BaseException) -> None:
        self.accelerator.trackers.clear()
        self.say(
            f"note: W&B failed {what} ({_first_line(error)}): training goes on untracked from here; "
            "the metrics stay in metrics.jsonl (`distrain-cloud report JOB` plots them)"
        )


def _first_line(error: object) -> str:
    """An error's first line, for a one-line note (W&B's carry advice on the lines below)."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def choose_wandb_run_id(saved: str | None, env: Mapping[str, str]) -> str:
    """The W&B run this job logs to: the one its checkpoint names (a resumed job appends to it),
    else the one the launcher chose (DISTRAIN_WANDB_RUN_ID, so it could print the run's URL at
    submit), else a new one."""
    if saved:
        return saved
    chosen = env.get("DISTRAIN_WANDB_RUN_ID", "").strip()
    if chosen and not any(c in chosen for c in WANDB_RESERVED):
        return chosen
    return secrets.token_hex(4)


def wandb_settings(args: TrainArgs, contract: Contract, env: Mapping[str, str]) -> dict[str, Any]:
    """W&B group, tags and the config beyond the flags: the runs of one lineage (a job and the jobs
    that resumed it) side by side, and where and with what code each ran."""
    # A lineage shares the first job's checkpoint folder: for our contracts, <first job>/checkpoints.
    lineage = env.get("DISTRAIN_LINEAGE") or (
        contract.checkpoint_dir.parent.name if contract.source == "distrain" else None
    )
    instance = env.get("SM_CURRENT_INSTANCE_TYPE") or env.get("DISTRAIN_INSTANCE_TYPE")
    config = {
        "job": args.run_name,
        "lineage": lineage or args.run_name,
        "instance": instance,  # as the backend names it; None where it does not
        "image": env.get("DISTRAIN_IMAGE_URI") or env.get("SAGEMAKER_TRAINING_IMAGE"),
        "backend": contract.source,
        "code_hash": code_hash(),
    }
    tags = [t for t in (args.task, args.strategy, args.precision, contract.source) if t]
    return {"group": lineage or args.run_name, "tags": tags, "config": config}


def code_hash() -> str:
    """The training code that ran, as 12 hex digits of sha256 over this package's .py files (the
    engines' folder too)."""
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def model_card(args: TrainArgs, metrics: Mapping[str, float], num_parameters: int, world_size: int) -> str:
    """The model folder's README.md (the Hub shows it): what was trained, on what, how, and how well."""
    base = args.model or args.model_config or "the built-in tiny GPT-2 configuration"
    data = args.dataset or args.train_file or "the job's train channel"
    rows = "".join(f"| {k} | {fmt(v)} |\n" for k, v in metrics.items())
    settings = {
        "task": args.task,
        "strategy": args.strategy,
        "precision": args.precision,
        "processes": world_size,
        "batch size": args.batch_size,
        "gradient accumulation": args.grad_accum,
        "learning rate": args.lr,
        "max steps": args.max_steps,
        "epochs": args.epochs,
        "seed": args.seed,
    }
    shown = "".join(f"| {k} | {v} |\n" for k, v in settings.items() if v is not None)
    return (
        "---\n"
        f"tags: [distrain-cloud, {args.task}]\n"
        + (f"base_model: {args.model}\n" if args.model else "")
        + "library_name: transformers\n---\n\n"
        f"# {args.run_name or 'distrain-cloud model'}\n\n"
        f"A {args.task} model ({num_parameters:,} parameters) trained from {base} on {data} with distrain-cloud.\n\n"
        f"## Final evaluation\n\n| metric | value |\n| --- | --- |\n{rows}\n"
        f"## Training settings\n\n| setting | value |\n| --- | --- |\n{shown}"
    )


def fmt(v: float | str) -> str:
    """A metric as a log line and the model card show it."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)
