"""What every job tells W&B about itself, and where its run will be.

Each backend puts `tracking_env` in its job's environment: training's W&B run takes the lineage
as its group and records where it ran (training/tracking.py `wandb_settings`). The launcher also
chooses the run id, so that it can say where the run is at submit instead of only in the job's
log (`wandb_run`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distrain_cloud.training.args import TrainArgs

    from .spec import JobSpec

WANDB_APP = "https://wandb.ai"
_OFFLINE_MODES = ("offline", "disabled", "dryrun")


def wandb_run_id(lineage: str) -> str:
    """One W&B run per lineage: a job resumed from another appends to the run its first job
    started (which its checkpoint names too). A job name is a valid run id as it is."""
    return lineage


def tracking_env(*, lineage: str, instance: str, image: str | None = None) -> dict[str, str]:
    """The job's variables for its W&B run: the lineage (the first job of a resume chain), the
    instance type (or "local"), the image it ran in where there is one, and the run id."""
    env = {
        "DISTRAIN_LINEAGE": lineage,
        "DISTRAIN_INSTANCE_TYPE": instance,
        "DISTRAIN_WANDB_RUN_ID": wandb_run_id(lineage),
    }
    if image:
        env["DISTRAIN_IMAGE_URI"] = image
    return env


def wandb_run(
    spec: JobSpec, args: TrainArgs, env: Mapping[str, str], here: Mapping[str, str] | None = None
) -> str | None:
    """Where the job's W&B run will be, for the plan's summary and the submit: its URL, or its
    project and id where the entity is the key's default (the job's log prints the URL); None
    when the run is not online. `args` are the job's training flags as its plan parsed them;
    `env` is the job's tracking_env; `here` this process's environment, which a local job inherits."""
    if args.report_to != "wandb" or not _online(spec, os.environ if here is None else here):
        return None
    run_id = env["DISTRAIN_WANDB_RUN_ID"]
    app = _app_url(spec, os.environ if here is None else here)
    if args.wandb_entity and app:
        return f"{app}/{args.wandb_entity}/{args.wandb_project}/runs/{run_id}"
    return f"project {args.wandb_project}, run id {run_id} (the job's log prints its URL)"


def _app_url(spec: JobSpec, here: Mapping[str, str]) -> str | None:
    """The W&B web app the job's run will be on, as the W&B SDK finds it (wandb.util.app_url):
    WANDB_APP_URL, else derived from the server WANDB_BASE_URL names (a self-hosted W&B), else
    from `wandb login --host`'s settings file, else W&B's cloud. A local job inherits this
    process's environment and settings; a cloud job sees only its secrets, so a server named
    there is not known here (None: the job's log prints the URL)."""
    if spec.backend != "local":
        return None if {"WANDB_APP_URL", "WANDB_BASE_URL"} & set(spec.secrets) else WANDB_APP
    from distrain_cloud.training.tracking import wandb_base_url  # the server, as the job's probe finds it

    if here.get("WANDB_APP_URL", "").strip():
        return here["WANDB_APP_URL"].strip().rstrip("/")
    base = wandb_base_url(here)  # W&B's cloud API when nothing names another
    if "://api.wandb." in base:  # W&B's cloud API: the app is the same host without api.
        return base.replace("://api.", "://")
    if "://api." in base:  # a dedicated deployment: app. beside api.
        return base.replace("://api.", "://app.")
    return base  # a self-hosted server serves its app and API at one address


def _online(spec: JobSpec, here: Mapping[str, str]) -> bool:
    """Whether the job's W&B run goes online: with a key (training writes a run offline without
    one). A local job also inherits this process's key and WANDB_MODE (set: W&B's own login)."""
    if spec.backend != "local":
        return "WANDB_API_KEY" in spec.secrets
    mode = here.get("WANDB_MODE", "").lower()
    if mode in _OFFLINE_MODES:
        return False
    return bool("WANDB_API_KEY" in spec.secrets or here.get("WANDB_API_KEY") or mode)
