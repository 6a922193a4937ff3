"""Plan checks every backend shares: what can be known offline, before anything is paid for.

Each is a Check in the plan, so `--dry-run` shows it and submit refuses a failed one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .plan import Check

if TYPE_CHECKING:
    from distrain_cloud.training.args import TrainArgs

    from .plan import Plan
    from .spec import JobSpec

# Presets whose model has no masked-LM head (GPT-2 is causal); no preset or model means tiny-gpt2.
_CAUSAL_FAMILIES = {"gpt2": "GPT-2", "llama": "Llama"}  # presets' model types with no masked-LM head
_DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet", ".txt")


def offline_checks(spec: JobSpec, plan: Plan) -> list[Check]:
    if plan.training is None:
        return []  # a plan without training flags: nothing of theirs to check
    # As the plan parsed them, once (from the spec as the backend planned it: local's data paths absolute).
    argv, args = plan.training.argv, plan.training.args
    checks = [_learning_rate(args), _task_fits_preset(args), _builtin_dataset(args), _config_overrides(args, argv)]
    if plan.backend == "local":
        checks += _local_data_files(args, Path(plan.request["cwd"]))
        checks.append(_processes_fit_cores(plan))
    else:
        checks += _cloud_data_files(args)
    return [c for c in checks if c is not None]


def _learning_rate(args: TrainArgs) -> Check:
    ok = args.lr is not None and args.lr > 0
    return Check("learning rate is positive", ok, "" if ok else f"--lr {args.lr}: give a positive rate, e.g. 3e-4")


def _task_fits_preset(args: TrainArgs) -> Check | None:
    from distrain_cloud.training.modeling import PRESETS

    if args.task != "masked-lm" or args.model or args.model_config:
        return None  # a Hub model's head is known only where it is downloaded
    preset = args.preset or "tiny-gpt2"
    family = _CAUSAL_FAMILIES.get(PRESETS[preset].get("model_type", ""))  # every preset's, llama-8b's too
    ok = family is None
    detail = "" if ok else f"preset {preset} is {family}, which has no masked-LM head: add --preset tiny-bert"
    return Check("task masked-lm fits the model", ok, detail)


def _builtin_dataset(args: TrainArgs) -> Check | None:
    from distrain_cloud.training.data import BUILTIN

    dataset = args.dataset or ""
    if not dataset.startswith("builtin:"):
        return None
    ok = dataset.removeprefix("builtin:") in BUILTIN
    choices = " or ".join(f"builtin:{b}" for b in BUILTIN)
    return Check(f"--dataset {dataset} is a builtin", ok, "" if ok else f"no such builtin: choose {choices}")


# The child of _config_overrides: a config is read without torch (transformers imports it when it
# can, 2-3 s) and without the Hub (a plan sends nothing).
_OVERRIDES_CHILD = (
    "import sys; sys.modules['torch'] = None; "
    "from distrain_cloud.training.modeling import check_overrides_main; check_overrides_main()"
)
_OVERRIDES_TIMEOUT_S = 60.0


def _config_overrides(args: TrainArgs, argv: list[str]) -> Check | None:
    """--config-overrides names keys of the model's config: a typo is found here, not after the job
    has started (and, on a cloud, been paid for). transformers reads the config in a process of its
    own, so the launcher never imports it (nor the torch it brings); only plans with overrides pay
    for it (about 1.5 s)."""
    import importlib.util
    import json
    import subprocess
    import sys

    if not args.config_overrides:
        return None
    name = "--config-overrides fit the model's config"
    if importlib.util.find_spec("transformers") is None:
        return Check(name, None, "checked when the job starts (transformers is not installed here)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    try:
        child = subprocess.run(
            [sys.executable, "-c", _OVERRIDES_CHILD],
            input=json.dumps(argv),
            capture_output=True,
            text=True,
            env=env,
            timeout=_OVERRIDES_TIMEOUT_S,
        )
        answer = json.loads(child.stdout.strip().splitlines()[-1])
        ok, detail = answer["ok"], str(answer["detail"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError, TypeError):
        return Check(name, None, "checked when the job starts (the offline check gave no answer)")
    return Check(name, ok if isinstance(ok, bool) else None, detail)


def _local_data_files(args: TrainArgs, job_folder: Path) -> list[Check]:
    from distrain_cloud.training.args import exists_here

    files = {"--train-file": args.train_file, "--validation-file": args.validation_file}
    dataset = args.dataset
    if dataset and (dataset.startswith(("/", ".", "~")) or dataset.endswith(_DATA_SUFFIXES)):
        files["--dataset"] = dataset  # a path, not a Hub id
    checks = []
    for flag, value in files.items():
        if not value:
            continue
        path = Path(value).expanduser()
        # The job runs in its own folder: a relative path is read from there.
        where = path if path.is_absolute() else job_folder / path
        ok = exists_here(where)
        detail = str(where)
        if not ok and not path.is_absolute() and exists_here(path):
            detail = f"{value} is relative and the job runs in {job_folder}: give {path.resolve()}"
        if ok and where.is_dir() and flag != "--dataset":  # --dataset reads a folder's files as splits
            detail = (
                "it is a directory: give one data file in it (csv, json, jsonl, parquet or txt), "
                f"or the folder as --dataset {value}"
            )
            checks.append(Check(f"{flag} {value} is a file", False, detail))
            continue
        checks.append(Check(f"{flag} {value} exists", ok, detail if not ok else ""))
    return checks


def _cloud_data_files(args: TrainArgs) -> list[Check]:
    """A data path that names a file of this machine, or a relative one: a cloud job runs on
    another machine, in a folder of its own, with only training/ shipped in its code bundle.
    Absolute paths that do not exist here may be the job's own (a channel's folder): not checked."""
    from distrain_cloud.training.args import exists_here, is_data_path

    here = Path.cwd()
    checks = []
    for flag, value in (("--train-file", args.train_file), ("--validation-file", args.validation_file)) + (
        ("--dataset", args.dataset),
    ):
        if not value or not is_data_path(flag, value, here):
            continue
        path = Path(value).expanduser()
        if path.is_absolute() and not exists_here(path):
            continue
        checks.append(
            Check(
                f"{flag} {value} reaches the job",
                False,
                "a cloud job cannot read files of this machine (its code bundle holds training/ only): upload it "
                "to S3 and pass --input train=s3://BUCKET/PREFIX/ instead of the flag (the job trains on its "
                "train channel), or give the path inside the job (/opt/ml/input/data/<channel>/...)",
            )
        )
    return checks


def _processes_fit_cores(plan: Plan) -> Check | None:
    processes, cores = plan.summary.get("processes"), os.cpu_count() or 1
    if plan.summary.get("gpus") or not isinstance(processes, int):
        return None
    ok = processes <= cores
    detail = f"{processes} processes on {cores} CPU cores" + ("" if ok else f": give --processes {cores} or fewer")
    return Check("processes fit the CPU cores", ok, detail)
