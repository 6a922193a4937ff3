"""Every eval loss the bench has recorded, pooled by protocol and recipe, against bf16's.

    python bench/loss_ledger.py                      # every protocol with two or more recipes
    python bench/loss_ledger.py --model llama-1b     # one model's

Issue 40 asks fp8's eval loss to stay within 1% of bf16's after 400 steps, and one run's loss
varies by about 1.5% (bf16's sd): the comparison is of means over runs from several sessions, and
was summed by hand until session 24, when it pooled a bf16 run measured on another text (session
20's first 4.1 M characters of the corpus, eval on 256 samples) with five on the full one. Here a
run joins a pool only with runs of the same protocol: model, sequence, batch (sequences an optimizer
step: the micro-batch times --grad-accum), steps, learning rate, corpus (its sha256) and eval samples.
Its recipe is what changes the numbers: precision, the fp8 settings, the residual stream's dtype (as
the run cast it: `--residual-dtype auto`, the default since session 25, casts Llama's to bf16), the
fused projections, the LM loss, the gradient clip, and the micro-batch where the batch accumulates. Not
the fp8 layers' owner (native or torchao's): both run the same tensorwise recipe, the same
operands, scales and cuBLAS kernel (tests/training/test_fp8_linear.py), and the table names each
run's source. A file the bench did not write, or a run without a final eval loss or whose timed
windows did not finish, is passed over: the files come back from other machines.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEASUREMENTS = Path(__file__).parent / "measurements"
# The training fields that change a run's numbers (the recipe), by their flags' names
RECIPE_FIELDS = (
    "precision",
    "fp8_recipe",
    "fp8_head",
    "fp8_head_grad_input",
    "fp8_head_forward",
    "fp8_head_backward",
    "fp8_scaling",
    "fp8_grad_dtype",
    "fp8_fast_accum",
    "fp8_bf16_edge_blocks",
    "fp8_bf16_layers",
    "residual_dtype",
    "fuse_projections",
    "rope_tables",
    "lm_loss",
    "max_grad_norm",  # session 35 ran --max-grad-norm 0 at 200 steps
)


@dataclass(frozen=True)
class LossRun:
    source: str  # the measurement file's name, without .json
    run: str  # the bench's run id
    protocol: tuple
    recipe: str  # "bf16", or the flags that differ from bf16's
    eval_loss: float


def recipe_and_protocol(cmd: str, meta: dict[str, Any], run: dict[str, Any]) -> tuple[str, tuple] | None:
    """The run's recipe (its numerics flags away from the defaults, "" for bf16's) and protocol,
    from the training command the bench recorded; None where the command does not parse."""
    from distrain_cloud.training.args import ArgumentError, TrainArgs, parse_args

    words = shlex.split(cmd)
    if "--" not in words:
        return None
    try:
        args = parse_args(words[words.index("--") + 1 :])
    except (ArgumentError, SystemExit, ValueError):
        return None
    default = TrainArgs()
    fp8 = fp8_settings(args, run)
    if fp8 is None:
        return None
    flags = []
    for name in RECIPE_FIELDS:
        value = getattr(args, name)
        if name in fp8:  # as the run resolved them, named against the defaults before auto's recipe
            if fp8[name] != {**BEFORE_AUTO, **LAYERS_BEFORE_AUTO}[name]:
                flag = "--" + name.replace("_", "-")
                flags.append(flag if fp8[name] is True else f"{flag} {fp8[name]}")
        elif name == "precision":  # not given: bf16 on the bench's H100s and H200s (precision.pick_precision)
            flags.append(str(value or "bf16"))
        elif name == "residual_dtype":  # the stream the run cast to, not the flag (auto picks bf16 for Llama)
            stream = residual_dtype(args.residual_dtype, run)
            if stream == "unknown":
                return None
            if stream == "bf16":
                flags.append("--residual-dtype bf16")
        elif name == "rope_tables":  # likewise: what the trainer did (auto tables a compiled model)
            tables = rope_tables(args.rope_tables, run)
            if tables == "unknown":
                return None
            if tables == "on":
                flags.append("--rope-tables")
        elif value != getattr(default, name):
            flag = "--" + name.replace("_", "-")
            flags.append(flag if value is True else f"{flag} {value}")
    if args.grad_accum > 1:  # the same sequences a step in smaller matmuls: a recipe of that protocol
        flags.append(f"--batch-size {args.batch_size} --grad-accum {args.grad_accum}")
    corpus = meta.get("lm_corpus") if isinstance(meta.get("lm_corpus"), dict) else {}
    sha = corpus.get("sha256")
    protocol = (
        run.get("model"),
        args.block_size,
        args.batch_size * args.grad_accum,
        args.max_steps,
        args.lr,
        sha if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{1,64}", sha) else "unknown",
        args.max_eval_samples,
    )
    return " ".join(flags), protocol


# The fp8 head's and fast accumulation's settings before --precision fp8's auto recipe (session 33):
# what an unrecorded run's flags left at auto meant, and what a recipe's name is written against
BEFORE_AUTO: dict[str, Any] = {
    "fp8_head": False,
    "fp8_head_grad_input": "fp8",
    "fp8_head_forward": "fp8",
    "fp8_head_backward": "fp8",
    "fp8_fast_accum": "none",
}
HEAD_PARTS = ("grad-input", "forward", "backward")  # the head's matmuls that `bf16-<part>` keeps in bf16


# The layers' part of the recipe before session 36's auto (e4m3 gradients, the query and key
# projections bf16): what an unrecorded run's flags left at auto meant
LAYERS_BEFORE_AUTO: dict[str, str] = {"fp8_grad_dtype": "e5m2", "fp8_bf16_layers": "none"}
LAYER_NAMES = re.compile(r"none|[A-Za-z_]\w*(?:,[A-Za-z_]\w*)*")


def fp8_settings(args: Any, run: dict[str, Any]) -> dict[str, Any] | None:
    """The fp8 settings a run trained with (BEFORE_AUTO's keys and LAYERS_BEFORE_AUTO's); None
    where a recorded value does not parse."""
    head = fp8_head_settings(args, run)
    layers = fp8_layer_settings(args, run)
    return None if head is None or layers is None else {**head, **layers}


def fp8_layer_settings(args: Any, run: dict[str, Any]) -> dict[str, Any] | None:
    """The layers' output gradients' format and the block linears kept bf16 a run trained with: the
    trainer's line, which the bench records since session 36 (`fp8_grad_dtype`: e5m2, e4m3, or
    torchao, whose recipe picks its own and is named by --fp8-recipe; `fp8_bf16_layers`: names or
    none); before that, the flags, where auto did not exist (LAYERS_BEFORE_AUTO)."""
    if "fp8_grad_dtype" not in run and "fp8_bf16_layers" not in run:
        given = {name: getattr(args, name) for name in LAYERS_BEFORE_AUTO}
        return {name: LAYERS_BEFORE_AUTO[name] if value in ("", "auto") else value for name, value in given.items()}
    grads, layers = run.get("fp8_grad_dtype"), run.get("fp8_bf16_layers")
    if grads not in ("e5m2", "e4m3", "torchao") or not (isinstance(layers, str) and LAYER_NAMES.fullmatch(layers)):
        return None
    return {"fp8_grad_dtype": "e5m2" if grads == "torchao" else grads, "fp8_bf16_layers": layers}


def fp8_head_settings(args: Any, run: dict[str, Any]) -> dict[str, Any] | None:
    """The fp8 head's and fast accumulation's settings a run trained with (BEFORE_AUTO's keys):
    the trainer's line, which the bench records since session 33 (`fp8_head`: "bf16", or "fp8" with
    the parts kept bf16, "fp8+bf16-backward"; `fp8_fast_accum`); before that, the flags, where auto
    did not exist (BEFORE_AUTO). None where a recorded value does not parse."""
    if "fp8_head" not in run and "fp8_fast_accum" not in run:
        given = {name: getattr(args, name) for name in BEFORE_AUTO}
        return {name: BEFORE_AUTO[name] if value in (None, "auto") else value for name, value in given.items()}
    head, accum = run.get("fp8_head"), run.get("fp8_fast_accum")
    if accum not in ("none", "grad-input", "all") or not isinstance(head, str):
        return None
    first, *kept = head.split("+")
    if first not in ("bf16", "fp8") or (first == "bf16" and kept) or any(k[5:] not in HEAD_PARTS for k in kept):
        return None
    parts = {f"fp8_head_{part.replace('-', '_')}": "bf16" if f"bf16-{part}" in kept else "fp8" for part in HEAD_PARTS}
    return {"fp8_head": first == "fp8", **parts, "fp8_fast_accum": accum}


def residual_dtype(flag: str, run: dict[str, Any]) -> str:
    """The residual stream's dtype a run trained with: the trainer's own line, which the bench
    records since session 25 (`residual_dtype`, "fp32" where the trainer cast nothing); before
    that, the flag, whose default (the stream autocast leaves fp32) was the only other case."""
    said = run.get("residual_dtype")
    if "residual_dtype" in run:
        return said if said in ("bf16", "fp32") else "unknown"
    return "bf16" if flag == "bf16" else "fp32"


def rope_tables(flag: bool | None, run: dict[str, Any]) -> str:
    """Whether a run read RoPE's tables ("on"/"off"): the trainer's line, which the bench records
    since session 27 (`rope_tables`); before that, the flag (off unless given: no default tabled)."""
    if "rope_tables" in run:
        said = run.get("rope_tables")
        return said if said in ("on", "off") else "unknown"
    return "on" if flag else "off"


SAFE = re.compile(r"[\w.+-]{1,200}")  # a model or run id to print: no terminal escapes, no Markdown


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def read_runs(folder: Path = MEASUREMENTS) -> list[LossRun]:
    """Every complete run with a final eval loss in the bench's results files under `folder`, each
    once (the bench once reported one run under two ids: a second row with the same loss, train
    loss and speed in one file is that)."""
    out: list[LossRun] = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("suites"), dict):
            continue
        meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
        seen = set()
        for suite in data["suites"].values():
            runs = suite.get("runs") if isinstance(suite, dict) else None
            for run in runs if isinstance(runs, list) else []:
                if not isinstance(run, dict) or run.get("impl") != "ours" or not run.get("complete"):
                    continue
                loss, cmd, model = run.get("final_eval_loss"), run.get("cmd"), run.get("model")
                if not isinstance(loss, (int, float)) or not math.isfinite(loss) or not isinstance(cmd, str):
                    continue
                if not (isinstance(model, str) and SAFE.fullmatch(model)):
                    continue  # it names the table, printed to a terminal
                same = (loss, _number(run.get("final_train_loss")), _number(run.get("tokens_per_sec")))
                if same in seen:
                    continue
                seen.add(same)
                parsed = recipe_and_protocol(cmd, meta, run)
                if parsed:
                    name = run.get("id") if isinstance(run.get("id"), str) and SAFE.fullmatch(run["id"]) else "?"
                    out.append(LossRun(path.stem, name, parsed[1], parsed[0], float(loss)))
    return out


@dataclass(frozen=True)
class Pool:
    recipe: str
    losses: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.losses)

    @property
    def sd(self) -> float | None:
        return statistics.stdev(self.losses) if len(self.losses) > 1 else None


def compare(pool: Pool, base: Pool) -> tuple[float, float | None]:
    """(pool's mean over base's - 1, two standard errors of that difference over base's mean), the
    second None where either pool has one run."""
    diff = pool.mean / base.mean - 1
    if pool.sd is None or base.sd is None:
        return diff, None
    se = math.sqrt(pool.sd**2 / len(pool.losses) + base.sd**2 / len(base.losses))
    return diff, 2 * se / base.mean


def pools(runs: list[LossRun]) -> dict[tuple, list[Pool]]:
    """Per protocol, a pool per recipe, bf16's first."""
    by: dict[tuple, dict[str, list[float]]] = {}
    for r in runs:
        by.setdefault(r.protocol, {}).setdefault(r.recipe, []).append(r.eval_loss)
    return {
        protocol: [Pool(k, tuple(v)) for k, v in sorted(recipes.items(), key=lambda kv: (kv[0] != "bf16", kv[0]))]
        for protocol, recipes in by.items()
    }


# bf16's recipe as the trainer runs it by default since session 27 (a Llama's residual stream cast to
# bf16, RoPE read from tables): the reference where a protocol has no run of plain bf16
BF16_DEFAULT = "bf16 --residual-dtype bf16 --rope-tables"


def reference(recipes: list[Pool]) -> Pool | None:
    """The pool the others are compared with: plain bf16's, else the bf16 default's."""
    by = {p.recipe: p for p in recipes}
    return by.get("bf16") or by.get(BF16_DEFAULT)


def render(runs: list[LossRun], model: str | None = None) -> str:
    lines = []
    for protocol, recipes in pools(runs).items():
        if (model and protocol[0] != model) or len(recipes) < 2:
            continue
        name, seq, batch, steps, lr, sha, evals = protocol
        lines += [
            f"## {name}, sequence {seq}, batch {batch}, {steps} steps, lr {lr}, corpus {sha[:12]}, "
            f"eval on at most {evals} samples (--max-eval-samples: the held-out part may hold fewer)",
            "",
            "| recipe | runs | eval losses | mean | sd | mean ÷ bf16's | ± two standard errors |",
            "|---|---|---|---|---|---|---|",
        ]
        base = reference(recipes)
        for pool in recipes:
            diff, err = compare(pool, base) if base and pool is not base else (None, None)
            lines.append(
                f"| {pool.recipe} | {len(pool.losses)} | {', '.join(f'{x:.4f}' for x in sorted(pool.losses))} "
                f"| {pool.mean:.4f} | {'–' if pool.sd is None else f'{pool.sd:.4f}'} "
                f"| {'–' if diff is None else f'{diff:+.2%}'} | {'–' if err is None else f'{err:.2%}'} |"
            )
        sources = sorted({f"{r.source} ({r.run})" for r in runs if r.protocol == protocol})
        if base is not None and base.recipe != "bf16":
            lines += ["", f"bf16's here: `{base.recipe}` (the bf16 default; this protocol has no plain bf16 run)"]
        lines += ["", "Runs: " + "; ".join(sources), ""]
    return "\n".join(lines) if lines else "no protocol with two recipes"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="one model's protocols (e.g. llama-1b)")
    p.add_argument("--folder", type=Path, default=MEASUREMENTS, help="the results files (bench/measurements)")
    a = p.parse_args(argv)
    print(render(read_runs(a.folder), a.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
