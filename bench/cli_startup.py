"""CLI start-up: `distrain-cloud --help` and `submit --dry-run` wall time, next to
`accelerate launch --help` on the same machine. Median of N runs of each.

    python bench/cli_startup.py --runs 7

Targets (issue: SageMaker backend): --help <= 150 ms, dry run <= 1 s. No AWS credentials or
network are used: the dry runs are offline by design.
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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def timed(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-500:]}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=7)
    a = p.parse_args()
    cli = str(BIN / "distrain-cloud")
    cases = {
        "distrain-cloud --help": [cli, "--help"],
        "distrain-cloud submit --help": [cli, "submit", "--help"],
        "submit --instance local --dry-run": [cli, "submit", "--instance", "local", "--dry-run"],
        "submit examples/sagemaker-gpt2-emotion.yaml --dry-run": [
            cli,
            "submit",
            str(REPO / "examples/sagemaker-gpt2-emotion.yaml"),
            "--dry-run",
            "--json",
        ],
        "accelerate launch --help (reference)": [str(BIN / "accelerate"), "launch", "--help"],
    }
    with tempfile.TemporaryDirectory() as cwd:
        empty = Path(cwd) / "aws-empty"  # no ~/.aws of the developer's
        empty.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_CONFIG_FILE=str(empty), AWS_SHARED_CREDENTIALS_FILE=str(empty), AWS_EC2_METADATA_DISABLED="true")
        rows = []
        for name, cmd in cases.items():
            timed(cmd, env, cwd)  # warm the file cache
            samples = [timed(cmd, env, cwd) for _ in range(a.runs)]
            rows.append((name, statistics.median(samples), min(samples), max(samples)))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {a.runs} runs (after one warm-up)\n")
    print("| command | median ms | min ms | max ms |\n|---|---|---|---|")
    for name, med, lo, hi in rows:
        print(f"| `{name}` | {med * 1000:.0f} | {lo * 1000:.0f} | {hi * 1000:.0f} |")


if __name__ == "__main__":
    main()
