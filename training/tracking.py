"""What a run tells the outside about itself: its W&B run (which one, in which group, with which
config) and the model card beside the saved model."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .args import TrainArgs
from .contract import Contract

WANDB_RESERVED = ":;,#?/'"  # characters W&B refuses in a run id


def start_wandb(accelerator: Any, args: TrainArgs, contract: Contract, run_id: str | None, say: Callable) -> str:
    """Start the job's W&B run (every process: Accelerate's trackers are collective) and return its
    id, which the checkpoints record so that a resumed job appends to the same run."""
    acc, a = accelerator, args
    if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
        # No key: write the run offline (sync it later with `wandb sync`) instead of failing.
        os.environ["WANDB_MODE"] = "offline"
    run_id = choose_wandb_run_id(run_id, os.environ)
    wandb_dir = contract.output_dir
    if acc.is_main_process:
        wandb_dir.mkdir(parents=True, exist_ok=True)
    extra = wandb_settings(a, contract, os.environ)
    acc.init_trackers(
        a.wandb_project,
        config={**a.to_dict(), **extra.pop("config"), "world_size": acc.num_processes},
        init_kwargs={
            "wandb": {
                "id": run_id,
                "resume": "allow",
                "name": a.run_name,
                "entity": a.wandb_entity,
                "dir": str(wandb_dir),
                **extra,
            }
        },
    )
    run = acc.get_tracker("wandb", unwrap=True) if acc.is_main_process else None
    url = getattr(run, "url", None) if os.environ.get("WANDB_MODE") != "offline" else None
    if url:  # once, where the job's log shows it: the launcher may not know the entity
        say(f"wandb_run={url}")
    return run_id


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
