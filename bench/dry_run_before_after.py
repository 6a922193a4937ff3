"""`submit --dry-run` wall time of two trees side by side, in one run on one machine: the tree of
this checkout against an older one (a folder holding `distrain_cloud/{launcher,training,infra}`,
e.g. symlinks into `git archive REV` output), alternating, median of N runs each.

    python bench/dry_run_before_after.py --old OLD_PKG --runs 9

Offline by design: no AWS credentials or region are set (the plans assume us-east-1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "ec2": ["--instance", "g5.12xlarge", "--max-run", "2h"],
    "ec2 --spot": ["--instance", "g5.12xlarge", "--max-run", "2h", "--spot"],
    "sagemaker": ["--instance", "ml.g5.12xlarge", "--max-run", "2h"],
    "local": ["--instance", "local"],
}


def timed(pythonpath: str | None, flags: list[str], cwd: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHONPATH"))}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = (
        "import sys; from distrain_cloud.launcher.cli import main; sys.argv = ['distrain-cloud', *sys.argv[1:]]; main()"
    )
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, "submit", *flags, "--dry-run"], env=env, cwd=cwd,
                          capture_output=True, text=True)  # fmt: skip
    took = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: a dry run whose plan has a failed check (offline: none expected)
        raise SystemExit(f"{flags}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="folder holding the old tree's distrain_cloud package")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cwd:
        print("| dry run | before (median s) | after (median s) | after / before |")
        print("|---|---|---|---|")
        for name, flags in CASES.items():
            timed(None, flags, cwd), timed(args.old, flags, cwd)  # warm the file cache, once each
            before, after = [], []
            for _ in range(args.runs):
                before.append(timed(args.old, flags, cwd))
                after.append(timed(None, flags, cwd))
            b, a = statistics.median(before), statistics.median(after)
            print(f"| {name} | {b:.3f} | {a:.3f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
