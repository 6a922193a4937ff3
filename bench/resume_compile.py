"""What a resumed compiled job pays to compile again: with and without the compiler cache that the
trainer keeps beside its checkpoints (issue 15, P6).

Three runs of the real entry point, one after the other, on one GPU (or CPU with --cpu):
  first   a compiled run from scratch that saves a checkpoint: the cold compile;
  resumed the same lineage resumed in a fresh process: Inductor's caches are in
          <checkpoints>/compile-cache, as they are when a spot job restarts on another machine;
  cold    the same checkpoint resumed without that folder: what a resume cost before.
Each run prints `first_step_s=` (data loading excluded: the first optimizer step, compilation
included) and `compile_cache_hits=`; the table compares them.

    python bench/resume_compile.py                  # GPU: gpt2-small, block 1024, batch 16
    python bench/resume_compile.py --cpu --tiny     # plumbing check on CPU (~2 min)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import REQUIRED_ENV  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def run(name: str, work: Path, checkpoints: Path, flags: list[str], steps: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTRAIN_", "TORCHINDUCTOR_", "TRITON_"))}
    env.update(REQUIRED_ENV)
    env.update(
        {
            "DISTRAIN_MODEL_DIR": str(work / name / "model"),
            "DISTRAIN_OUTPUT_DIR": str(work / name / "output"),
            "DISTRAIN_CHECKPOINT_DIR": str(checkpoints),
            # Triton's own cache follows Inductor's unless set; a fresh home keeps a user cache out.
            "HOME": str(work / name / "home"),
            "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "PYTHONUNBUFFERED": "1",
        }
    )
    cmd = [sys.executable, "-m", "distrain_cloud.training", *flags, "--max-steps", str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=900)
    if out.returncode != 0:
        sys.exit(f"{name} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    first = re.search(r"first_step_s=([\d.]+) compile_cache_hits=(\d+)", out.stdout)
    assert first, out.stdout[-2000:]
    return {"run": name, "steps": steps, "first_step_s": float(first.group(1)), "cache_hits": int(first.group(2))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="no GPU: a plumbing check, not a measurement")
    p.add_argument("--tiny", action="store_true", help="the tiny-gpt2 preset instead of gpt2-small")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    a = p.parse_args()
    preset, block, batch = ("tiny-gpt2", 64, 8) if a.tiny else ("gpt2-small", 1024, 16)
    corpus = (REPO / "training/assets/corpus.txt").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "corpus.txt"
        data.write_text(corpus * (1 if a.tiny else 20))  # enough 1024-token blocks for 30 steps of 16
        flags = [
            "--task",
            "causal-lm",
            "--preset",
            preset,
            "--train-file",
            str(data),
            "--block-size",
            str(block),
            "--batch-size",
            str(batch),
            "--compile",
            "--save-every",
            "10",
            "--log-every",
            "10",
            "--max-eval-samples",
            "16" if a.tiny else "400",  # raw lines: 400 make ~20 blocks of 1024
            "--generate-tokens",
            "0",
            "--no-save-model",
            "--report-to",
            "none",
        ]
        flags += ["--precision", "no"] if a.cpu else ["--precision", "bf16"]
        lineage = work / "checkpoints"
        rows = [run("first", work, lineage, flags, 10)]
        cold = work / "checkpoints-without-cache"
        shutil.copytree(lineage, cold, ignore=shutil.ignore_patterns("compile-cache"))
        rows.append(run("resumed", work, lineage, flags, 20))
        rows.append(run("cold", work, cold, flags, 20))
    base = rows[0]["first_step_s"]
    lines = ["| run | first step (s, compile included) | vs first | Inductor cache hits |", "|---|---|---|---|"]
    lines += [
        f"| {r['run']} | {r['first_step_s']} | {r['first_step_s'] / base:.0%} | {r['cache_hits']} |" for r in rows
    ]
    table = "\n".join(lines)
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "resume_compile.md").write_text(table + "\n")
    (a.out / "resume_compile.json").write_text(json.dumps({"preset": preset, "cpu": a.cpu, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
