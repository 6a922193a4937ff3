"""fp8 against bf16 on a small byte-level Llama trained on the standard library's source (CPU or GPU).

    python bench/fp8_plateau_study.py [--batch 8,32] [--steps 300] [--recipes bf16,fp8,fp8-e4m3,fp8-qk] [--seeds 0,1,2]

Session 35 found fp8 (llama-1b, 200 steps at micro-batch 16 on an H200) ahead of bf16 to step 60
and behind from the plateau near 3.3 on, 7.3% at the end, with no gap at micro-batch 8; GPU time to
screen a recipe is 30 minutes a session. This asks whether a model small enough to train in
seconds shows the same, so that recipes can be screened several seeds each where a llama-1b run
takes four minutes (on a CPU fp8's matmuls are slow, about 1.5 s a step at batch 8: the GPU is
where to run it). Every recipe starts from the same initial weights and reads the same batches;
each batch size and seed is a run of its own; the eval loss is on held-out text, the train loss
every `--log-every` steps, and each recipe's mean eval loss is set against bf16's per batch size.

The recipes use the trainer's own float8 layers (training/fp8.py, training/fp8_linear.py) with the
model's own loss (the head bf16, as under `--no-fp8-head`): `fp8` is the layers of the recipe before
session 36 (e5m2 gradients, every block linear float8), `fp8-e4m3` adds `--fp8-grad-dtype e4m3`,
`fp8-qk` adds `--fp8-bf16-layers q_proj,k_proj`, `fp8-qke4` both (the default's layers since).
Session 36 ran it on an H200 (bench/measurements/2026-11-30-session36.md): 128 and 256 wide, batch
8 and 32, three seeds, and no recipe showed llama-1b's gap (fp8 within 0.4% of bf16's at both). The
learning rate decays linearly from --lr to 0 and the gradient is clipped at 1.0, as in the bench's
loss protocol.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

try:
    from distrain_cloud.training import fp8
except ModuleNotFoundError:  # a checkout not `pip install -e`'d (the GPU machines): run.py's symlink package
    from run import package_shim

    sys.path.insert(0, str(package_shim(Path(tempfile.mkdtemp(prefix="fp8-plateau-")))))
    from distrain_cloud.training import fp8

from _benchlib import stdlib_sources

RECIPES = {  # name: use_fp8's keywords, None for bf16
    "bf16": None,
    "fp8": {},
    "fp8-e4m3": {"grad_dtype": "e4m3"},
    "fp8-qk": {"bf16_layers": ("q_proj", "k_proj")},
    "fp8-qke4": {"grad_dtype": "e4m3", "bf16_layers": ("q_proj", "k_proj")},
}


def byte_text(max_bytes: int) -> torch.Tensor:
    """The standard library's sources as raw bytes, the files the bench's corpus reads in its order
    (blank lines kept: bytes, not the trainer's documents), at most `max_bytes`."""
    chunks, total = [], 0
    for src in stdlib_sources():
        data = src.read_bytes()
        chunks.append(data[: max_bytes - total])
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()


def build(a: argparse.Namespace, seed: int) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=a.hidden,
        intermediate_size=3 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=a.hidden // 32,
        num_key_value_heads=max(1, a.hidden // 128),
        max_position_embeddings=a.seq,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).float()


def train(base: torch.nn.Module, recipe: str, batch: int, text: torch.Tensor, evals: list[torch.Tensor], a) -> dict:
    """One run: `recipe`'s copy of `base`, `a.steps` steps of `batch` sequences read in order."""
    model = copy.deepcopy(base).to(a.device)
    if RECIPES[recipe] is not None:
        fp8.use_fp8(model, fast_accum="grad-input", **RECIPES[recipe])
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    autocast = torch.autocast(torch.device(a.device).type, dtype=torch.bfloat16)
    curve, window, start = {}, [], time.perf_counter()
    for step in range(a.steps):
        for group in opt.param_groups:
            group["lr"] = a.lr * (1 - step / a.steps)
        first = step * batch * a.seq
        ids = text[first : first + batch * a.seq].view(batch, a.seq).to(a.device)
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.item())
        if (step + 1) % a.log_every == 0:
            curve[step + 1] = round(sum(window) / len(window), 4)
            window = []
    with torch.no_grad(), autocast:
        losses = [model(input_ids=chunk.to(a.device), labels=chunk.to(a.device)).loss.item() for chunk in evals]
    return {
        "recipe": recipe,
        "batch": batch,
        "eval_loss": round(sum(losses) / len(losses), 4),
        "curve": curve,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", default="8,32", help="sequences a step, one run per value (default 8,32)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq", type=int, default=128, help="bytes a sequence (default 128)")
    p.add_argument("--hidden", type=int, default=128, help="width, a multiple of 128 (default 128)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-sequences", type=int, default=64)
    p.add_argument("--recipes", default="bf16,fp8", help=f"of {', '.join(RECIPES)} (default bf16,fp8)")
    p.add_argument("--seeds", default="0", help="initial weights, one run each (default 0)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="also write the runs here")
    a = p.parse_args(argv)
    recipes = a.recipes.split(",")
    if unknown := [r for r in recipes if r not in RECIPES]:
        p.error(f"--recipes: {', '.join(unknown)} not among {', '.join(RECIPES)}")
    if a.hidden % 128:
        p.error(f"--hidden must be a multiple of 128 (float8 matmuls need multiples of 16 per head), not {a.hidden}")
    batches = [int(b) for b in a.batch.split(",")]
    need = max(batches) * a.steps * a.seq
    held = a.eval_sequences * a.seq
    text = byte_text(need + held)
    if len(text) < need + held:
        p.error(f"the standard library's source has {len(text):,} bytes; {need + held:,} needed: fewer --steps")
    evals = text[need : need + held].view(a.eval_sequences, a.seq).split(16)
    seeds = [int(x) for x in a.seeds.split(",")]
    print(f"{sum(t.numel() for t in build(a, seeds[0]).parameters()):,} parameters, {a.steps} steps of {a.seq} "
          f"bytes, lr {a.lr}, device {a.device}")  # fmt: skip
    runs = []
    for batch in batches:
        for seed in seeds:
            base = build(a, seed)
            for recipe in recipes:
                run = {**train(base, recipe, batch, text, evals, a), "seed": seed}
                runs.append(run)
                print(f"batch {batch:3d} seed {seed} {recipe:9s} eval {run['eval_loss']:.4f} ({run['seconds']} s) "
                      + " ".join(f"{k}:{v:.3f}" for k, v in run["curve"].items()), flush=True)  # fmt: skip
        for recipe in recipes:
            mine = [r["eval_loss"] for r in runs if r["batch"] == batch and r["recipe"] == recipe]
            ref = [r["eval_loss"] for r in runs if r["batch"] == batch and r["recipe"] == "bf16"]
            against = f", {statistics.fmean(mine) / statistics.fmean(ref) - 1:+.2%} of bf16's" if ref else ""
            print(f"batch {batch:3d} {recipe:9s} mean eval {statistics.fmean(mine):.4f} over {len(mine)}{against}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "runs": runs}, indent=1))
    if diverged := [f"{r['recipe']} at batch {r['batch']}" for r in runs if not math.isfinite(r["eval_loss"])]:
        raise SystemExit(f"diverged: {', '.join(diverged)} (a lower --lr)")
    return runs


if __name__ == "__main__":
    main()
