"""The host (CPU) time a training step costs per strategy, measured where no GPU hides it.

A compiled GPT-2-small step on an H100 is short enough that the host's Python work (FSDP2's
hooks, DTensor dispatch, the optimizer's loops) sets its pace: compiled fsdp left the GPU idle
17 ms a step on 2 H100s (bench/README.md, session 8). That host work depends on how many tensors a
step touches, not on their size. So this runs the real entry point on CPU processes over gloo,
eagerly, with GPT-2 small's structure (12 blocks, 148 parameter tensors) at a width of 64, where
the arithmetic is small and the step is mostly that host work, and reads the trainer's own
profile of steps START:END (`profile_host_forward_ms=` ... `profile_host_optimizer_ms=`).

Not a GPU measurement: the figures rank and size host costs (a baseline strategy in the same
run); the GPU machines say what they are worth there.

    python bench/host_overhead.py                         # ddp and fsdp, 2 processes (~1 min)
    python bench/host_overhead.py --strategies ddp,fsdp,zero3 --processes 2
    python bench/host_overhead.py --compile --strategies ddp,fsdp12,fsdp0   # Inductor's C++ (~4 min)

`fsdp0` is fsdp with --fsdp-blocks-per-unit 0 (the model one FSDP2 unit, compiled whole), `fsdp12`
with --fsdp-blocks-per-unit 12 (the twelve blocks one unit, a graph a block); plain `fsdp` is the
default, which for this small model is `fsdp12` eager and `fsdp0` compiled (session 32). With
--compile the steps run Inductor's CPU kernels, at this width a small part of the step: the host
time of calling the compiled graphs (a graph a block under FSDP2's units, one for DDP and fsdp0)
is what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib  # noqa: E402

PHASES = ("forward", "backward", "clip", "optimizer")
# --strategies names beyond the strategies themselves: (strategy, its extra flags)
NAMED = {"fsdp0": ("fsdp", ("--fsdp-blocks-per-unit", "0")), "fsdp12": ("fsdp", ("--fsdp-blocks-per-unit", "12"))}


def model_config(path: Path) -> Path:
    """GPT-2 small's 12 blocks and parameter tensors at width 64, its vocabulary the shipped tokenizer's."""
    tok = lib.load_tokenizer()
    shape = {**lib.GPT2_SHAPES["gpt2-small"], "n_embd": 64, "n_head": 2, "vocab_size": len(tok)}
    ids = {"bos_token_id": tok.eos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    path.write_text(json.dumps({"model_type": "gpt2", **shape, **ids}))
    return path


def run_to_end(cmd: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run `cmd` (node_launch and its training processes) to its end, its output captured; past
    `timeout_s`, or when this script is interrupted, its whole process tree is stopped
    (_benchlib.stop_process_tree), not only the launcher, whose ranks would go on spinning."""
    p = subprocess.Popen(
        cmd, env=env, cwd=lib.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout_s)
    except BaseException:  # the timeout, or Ctrl-C
        lib.stop_process_tree(p, grace_s=10.0)
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)


def run(strategy: str, processes: int, config: Path, work: Path, port: int, a: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTRAIN_")}
    name, (strategy, extra) = strategy, NAMED.get(strategy, (strategy, ()))
    env.update(
        {
            "DISTRAIN_MODEL_DIR": str(work / name / "model"),
            "DISTRAIN_OUTPUT_DIR": str(work / name / "output"),
            "DISTRAIN_CHECKPOINT_DIR": str(work / name / "checkpoints"),
            "DISTRAIN_MAIN_PORT": str(port),
            "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": "1",  # one core a process: the host work, not intra-op threading
        }
    )
    flags = [
        *("--task", "causal-lm", "--model-config", str(config), "--block-size", "32", "--batch-size", "2"),
        *("--max-steps", str(a.steps), "--log-every", str(a.log_every), "--max-grad-norm", "1.0"),
        *("--strategy", strategy, *extra, "--compile" if a.compile else "--no-compile"),
        *("--profile-steps", a.profile_steps, "--report-to", "none"),
        *("--generate-tokens", "0", "--max-eval-samples", "4", "--no-save-model"),
    ]
    cmd = [sys.executable, "-m", "distrain_cloud.training.node_launch", "--processes", str(processes), "--", *flags]
    out = run_to_end(cmd, env, timeout_s=900)
    if out.returncode != 0:
        sys.exit(f"{name} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    train = [r for r in lib.read_jsonl(work / name / "output" / "metrics.jsonl") if "step_time" in r]
    # The trainer's windows after the first (warm-up), without the profiled ones (as run.py does).
    windows, _ = lib.without_profiled(lib.windows_of(train)[1:], lib.profiled_steps(out.stdout))
    profile = next(line for line in out.stdout.splitlines() if line.startswith("profile_steps="))
    phases = lib.parse_kv(profile)
    step_ms = [1e3 * w[2]["step_time"] for w in windows]
    return {
        "strategy": name,
        "processes": processes,
        "compiled": a.compile,
        "step_ms": lib.median(step_ms),
        "step_ms_windows": step_ms,
        "host_ms": {k: float(phases[f"profile_host_{k}_ms"]) for k in PHASES if f"profile_host_{k}_ms" in phases},
        "final_train_loss": train[-1]["train_loss"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategies", default="ddp,fsdp", help="comma list; the first is the baseline")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="compiled steps (Inductor), not eager ones")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--profile-steps", default="72:77", help="START:END, profiled (inside the last window)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = model_config(work / "gpt2-small-structure.json")
        rows = [run(s, a.processes, config, work, 29700 + i, a) for i, s in enumerate(a.strategies.split(","))]
    base = rows[0]["step_ms"]
    lines = [
        f"| strategy | step ms (median) | vs {rows[0]['strategy']} | "
        + " | ".join(f"host {k} ms" for k in PHASES)
        + " | final loss |",
        "|---" * (4 + len(PHASES)) + "|",
    ]
    for r in rows:
        host = " | ".join(f"{r['host_ms'].get(k, float('nan')):.1f}" for k in PHASES)
        step = f"{r['step_ms']:.1f} | {r['step_ms'] / base:.2f}x"
        lines.append(f"| {r['strategy']} | {step} | {host} | {r['final_train_loss']:.6g} |")
    table = "\n".join(lines)
    how = "compiled (Inductor)" if a.compile else "eager"
    print(f"{a.processes} CPU processes (gloo), {how}, GPT-2 small's structure at width 64\n{table}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "host_overhead.md").write_text(table + "\n")
    (a.out / "host_overhead.json").write_text(json.dumps({"processes": a.processes, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
