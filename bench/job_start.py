"""Start-up of a one-process job: the training process started directly (what node_launch does
now) next to the same process under `accelerate launch` (what it did before), on this machine,
alternating, median of N runs of each.

    python bench/job_start.py --runs 5

Both run the entry point's offline default for 2 steps in a fresh folder, with the command and
variables node_launch renders (`plan_node`): the direct one with `simple_launcher_env`, the
launched one with the rendered Accelerate config and `--num_cpu_threads_per_process`, exactly as
node_launch ran it. What differs is only the launcher in between.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from distrain_cloud.training.contract import Contract
from distrain_cloud.training.node_launch import _threads_per_process, plan_node

TRAIN = ["--max-steps", "2", "--report-to", "none", "--eval-every", "100"]


def commands(config_file: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (command, variables over this process's): the same job both ways."""
    here = Path.cwd()
    contract = Contract(model_dir=here / "model", output_dir=here / "output", checkpoint_dir=here / "checkpoints")
    launch = plan_node(TRAIN, contract, gpus=0)
    assert launch.direct, "this machine's one-process plan should start directly"
    config_file.write_text(yaml.safe_dump(launch.config, sort_keys=True))
    accelerate = [sys.executable, "-m", "accelerate.commands.launch"]
    accelerate += ["--num_cpu_threads_per_process", str(_threads_per_process(launch.config))]
    accelerate += ["--config_file", str(config_file), "-m", "distrain_cloud.training", *TRAIN]
    cpu = {"ACCELERATE_USE_CPU": "true"}  # what node_launch set for CPU processes before, too
    return {"direct (now)": (launch.command, launch.env), "accelerate launch (before)": (accelerate, cpu)}


def timed(cmd: list[str], env: dict[str, str]) -> float:
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-800:]}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = commands(Path(tmp) / "accelerate.yaml")
        envs = {name: {**os.environ, **extra} for name, (_, extra) in cases.items()}
        for name, (cmd, _) in cases.items():
            timed(cmd, envs[name])  # warm the file cache
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(a.runs):  # alternating, so a slow spell of the machine hits both
            for name, (cmd, _) in cases.items():
                samples[name].append(timed(cmd, envs[name]))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {a.runs} runs each, alternating\n")
    print("| one-process job, 2 steps | median s | min s | max s |\n|---|---|---|---|")
    for name, got in samples.items():
        print(f"| {name} | {statistics.median(got):.2f} | {min(got):.2f} | {max(got):.2f} |")


if __name__ == "__main__":
    main()
