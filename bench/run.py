"""Benchmark driver: our trainer vs `transformers.Trainer`, in one invocation.

    python bench/run.py --suite all --gpus 4 --deadline-min 9     # on the GPU machine
    python bench/run.py --suite single,accum --gpus 1
    python bench/run.py --dry-run --suite all --gpus 4            # print the commands only
    python bench/run.py --cpu-smoke                               # tiny CPU run of the plumbing

Suites (see bench/README.md): single, scaling, zero, xl, accum, varlen (or all).

Every child gets the required NCCL/NVSHMEM environment, fresh model/output/checkpoint
folders, `--report-to none`, a timeout, and its own log under <out>/logs/. The tables are
rewritten after every run (<out>/results.md, <out>/results.json), so a run cut short
still leaves what finished. <out> defaults to $OUT when set, else bench/results/.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib  # noqa: E402

SUITES = ("single", "entry", "llama", "accum", "scaling", "zero", "varlen", "xl")  # also the order they run in
BASELINE = lib.BENCH / "hf_trainer_baseline.py"
PLACEHOLDER_WORK = "$WORK"  # shown instead of the temp folder in --dry-run


# ---------------------------------------------------------------- runs


@dataclass
class Run:
    id: str
    impl: str  # "ours" | "hf_trainer"
    label: str
    cmd: list[str]
    gpus: int  # processes: one per GPU (CPU processes under --cpu-smoke)
    model: str
    task: str  # "lm" | "classification"
    strategy: str
    seq_len: int
    batch_size: int
    grad_accum: int
    steps: int
    warmup: int
    log_every: int | None
    timeout: int
    needs: tuple[str, ...] = ()
    n_params: int | None = None
    fpt: float | None = None  # training FLOPs per token, for MFU
    variant: str = ""  # --variant NAME: compared with the runs of the same variant
    repeat: int = 1  # --repeat: the k-th run of the same command
    result: dict = field(default_factory=dict)

    @property
    def key(self):
        return (self.impl, tuple(self.cmd), self.gpus, self.repeat)


def repeats(r: Run, n: int) -> list[Run]:
    """`r` and n - 1 runs of the same command after it (--repeat), each its own run: ids ending
    -r2 ... -rN, and variants of their own, so the llama suite compares each with the plain run."""
    return [r] + [
        replace(r, id=f"{r.id}-r{k}", label=f"{r.label} (run {k})", variant=f"{r.variant or 'ours'}-r{k}", repeat=k)
        for k in range(2, n + 1)
    ]


@dataclass
class Ctx:
    a: argparse.Namespace
    gpus: int
    work: Path
    lm_file: Path
    varlen_file: Path
    bert_dir: Path
    cpu: bool
    peak: float

    @property
    def precision(self):
        return "no" if self.cpu else "bf16"


def gpt2_fpt(preset: str, seq_len: int) -> tuple[int, float]:
    """(parameters, training FLOPs per token) of a preset: GPT-2's or llama-1b's."""
    if preset in lib.LLAMA_SHAPES:
        ls = lib.LLAMA_SHAPES[preset]
        n = lib.llama_num_params(ls)
        return n, lib.flops_per_token(n, ls["num_hidden_layers"], ls["hidden_size"], seq_len)
    s = lib.GPT2_SHAPES[preset]
    n = lib.gpt2_num_params(s["n_layer"], s["n_embd"], s["vocab_size"] or lib.SHIPPED_VOCAB, s["n_positions"])
    return n, lib.flops_per_token(n, s["n_layer"], s["n_embd"], seq_len)


ENV_WORD = re.compile(r"[A-Z][A-Z0-9_]*=")  # NAME=VALUE among a variant's flags


def ours_cmd(
    ctx: Ctx,
    *,
    gpus: int,
    strategy: str,
    task: str,
    batch: int,
    accum: int,
    total_steps: int,
    log_every: int,
    model_flags: list[str],
    data_flags: list[str],
    compile_: bool = False,
    extra: list[str] = (),
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "distrain_cloud.training.node_launch",
        "--processes",
        str(max(1, gpus)),
        "--",
        "--task",
        task,
        *model_flags,
        *data_flags,
        "--strategy",
        strategy,
        "--precision",
        ctx.precision,
        "--batch-size",
        str(batch),
        "--grad-accum",
        str(accum),
        "--max-steps",
        str(total_steps),
        "--log-every",
        str(log_every),
        "--report-to",
        "none",
        "--lr",
        str(lib.LR),
        # keep the untimed tail short: a small final evaluation, one generated token
        "--max-eval-samples",
        str(ctx.a.eval_samples),
        "--generate-tokens",
        "1",
    ]
    cmd.append("--no-save-model")  # the final save is untimed; skipping it saves budget
    if compile_:
        cmd.append("--compile")
    return with_variant(cmd + shlex.split(ctx.a.ours_extra), extra)


def with_variant(cmd: list[str], extra: list[str]) -> list[str]:
    """cmd with a variant's flags; its NAME=VALUE words set the run's environment (an A/B of an
    NCCL_ variable, say), through env(1), so logs and results.json show them."""
    env_words = [w for w in extra if ENV_WORD.match(w)]
    return (["env", *env_words] if env_words else []) + cmd + [w for w in extra if not ENV_WORD.match(w)]


def lm_data_flags(ctx: Ctx, seq_len: int) -> list[str]:
    if ctx.a.lm_data == "builtin":
        return ["--dataset", "builtin:corpus", "--block-size", str(seq_len)]
    return ["--train-file", str(ctx.lm_file), "--block-size", str(seq_len)]


def ours_lm(
    ctx: Ctx,
    *,
    gpus: int,
    strategy: str = "ddp",
    preset: str = "gpt2-small",
    batch: int | None = None,
    accum: int = 1,
    steps: int | None = None,
    warmup: int | None = None,
    log_every: int | None = None,
    compile_: bool = False,
    timeout: int | None = None,
    label: str | None = None,
    variant: tuple[str, list[str]] = ("", []),
    seq_len: int | None = None,
) -> Run:
    a = ctx.a
    preset = "tiny-gpt2" if ctx.cpu else preset
    batch = batch or a.batch_size
    seq_len = a.seq_len if ctx.cpu else (seq_len or a.seq_len)
    steps, warmup, log_every = steps or a.steps, a.warmup if warmup is None else warmup, log_every or a.log_every
    n, fpt = gpt2_fpt(preset, seq_len)
    cmd = ours_cmd(
        ctx,
        gpus=gpus,
        strategy=strategy,
        task="causal-lm",
        batch=batch,
        accum=accum,
        total_steps=warmup + steps,
        log_every=log_every,
        model_flags=["--preset", preset],
        data_flags=lm_data_flags(ctx, seq_len),
        compile_=compile_,
        extra=variant[1],
    )
    compiled = "--compile" in cmd  # also through --ours-extra or a variant
    # What the run really uses where --ours-extra or a variant names it again (the last one wins):
    # the table's columns, its id and the packages the run needs follow it.
    batch, accum = int(last_value(cmd, "--batch-size", batch)), int(last_value(cmd, "--grad-accum", accum))
    strategy = last_value(cmd, "--strategy", strategy)
    needs = packages_needed(cmd, strategy)
    tag = f"ours-{preset}-{strategy}{'-compile' if compiled else ''}-g{gpus}-b{batch}-k{accum}"
    if variant[0]:
        tag, label = f"{tag}-{variant[0]}", f"{label or 'ours ' + strategy} [{variant[0]}]"
    return Run(
        tag,
        "ours",
        label or f"ours {strategy}{' +compile' if compiled else ''}",
        cmd,
        gpus,
        preset,
        "lm",
        strategy,
        seq_len,
        batch,
        accum,
        steps,
        warmup,
        log_every,
        timeout or (a.compile_timeout if compiled else a.timeout),
        needs,
        n,
        fpt,
        variant=variant[0],
    )


def ours_entry(ctx: Ctx) -> Run:
    """Our entry point alone (`python -m distrain_cloud.training`), as SkyPilot, torchrun, Batch and
    Kubernetes start it: no node_launch, no --precision, no --compile, no --strategy. Its own
    defaults pick the precision (bf16 on an H100), the strategy, and whether to compile: with
    --entry-steps of at least 1,000 (strategies.COMPILE_MIN_STEPS) the default compiles."""
    a = ctx.a
    preset = "tiny-gpt2" if ctx.cpu else "gpt2-small"
    steps = a.entry_steps
    n, fpt = gpt2_fpt(preset, a.seq_len)
    cmd = [
        sys.executable,
        "-m",
        "distrain_cloud.training",
        "--task",
        "causal-lm",
        "--preset",
        preset,
        *lm_data_flags(ctx, a.seq_len),
        "--batch-size",
        str(a.batch_size),
        "--max-steps",
        str(a.warmup + steps),
        "--log-every",
        str(a.log_every),
        "--report-to",
        "none",
        "--lr",
        str(lib.LR),
        "--max-eval-samples",
        str(a.eval_samples),
        "--generate-tokens",
        "1",
        "--no-save-model",
    ]
    return Run(
        f"ours-{preset}-entry-g1-b{a.batch_size}-n{steps}",
        "ours",
        "ours, the entry point alone (no flags)",
        cmd,
        1,
        preset,
        "lm",
        "auto",
        a.seq_len,
        a.batch_size,
        1,
        steps,
        a.warmup,
        a.log_every,
        a.compile_timeout,
        ("datasets", "accelerate"),
        n,
        fpt,
    )


def hf_lm(
    ctx: Ctx,
    *,
    compile_: bool,
    gpus: int = 1,
    model: str = "gpt2-small",
    batch: int | None = None,
    seq_len: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    timeout: int | None = None,
    liger: bool = False,
) -> Run:
    a = ctx.a
    preset = "tiny-gpt2" if ctx.cpu else model
    batch = batch or a.batch_size
    seq_len = a.seq_len if ctx.cpu else (seq_len or a.seq_len)
    steps, warmup = steps or a.steps, a.warmup if warmup is None else warmup
    n, fpt = gpt2_fpt(preset, seq_len)
    cmd = hf_launcher(gpus) + [
        str(BASELINE),
        "--tf32",
        "--mode",
        "lm",
        *(["--model", model] if model != "gpt2-small" and not ctx.cpu else []),
        "--batch-size",
        str(batch),
        "--seq-len",
        str(seq_len),
        "--grad-accum",
        "1",
        "--steps",
        str(steps),
        "--warmup-steps",
        str(warmup),
        "--data-file",
        str(ctx.lm_file),
        "--peak-tflops",
        str(a.peak_tflops),
    ]
    if a.lm_data == "builtin":
        cmd[cmd.index("--data-file") : cmd.index("--data-file") + 2] = []
    if ctx.cpu:
        cmd.append("--tiny")
    if compile_:
        cmd.append("--compile")
    if liger:
        cmd.append("--liger")
    variant = ("compile" if compile_ else "defaults") + ("-liger" if liger else "")
    seq_tag = f"-s{seq_len}" if seq_len != a.seq_len else ""
    return Run(
        f"hf-{preset}-{variant}-g{gpus}-b{batch}{seq_tag}",
        "hf_trainer",
        f"HF Trainer {variant.replace('-', '+')}",
        cmd,
        gpus,
        preset,
        "lm",
        "ddp" if gpus > 1 else "single",
        seq_len,
        batch,
        1,
        steps,
        warmup,
        None,
        timeout or (a.compile_timeout if compile_ else a.timeout),
        ("transformers",) + (("liger_kernel",) if liger else ()),
        n,
        fpt,
    )


def hf_launcher(gpus: int) -> list[str]:
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
    return [sys.executable]


def varlen_runs(ctx: Ctx, variants: list[tuple[str, list[str]]] = ()) -> list[Run]:
    a = ctx.a
    bert = a.varlen_model == "bert-base"
    if ctx.cpu:
        model_flags = ["--preset", "tiny-bert" if bert else "tiny-gpt2"]
        name = "tiny-bert" if bert else "tiny-gpt2"
    else:
        model_flags = ["--model-config", str(ctx.bert_dir)] if bert else ["--preset", "gpt2-small"]
        name = a.varlen_model
    g = a.varlen_gpus
    bs, L = a.varlen_batch_size, a.varlen_max_length
    ours = ours_cmd(
        ctx,
        gpus=g,
        strategy="ddp",
        task="classification",
        batch=bs,
        accum=1,
        total_steps=a.warmup + a.steps,
        log_every=a.log_every,
        model_flags=model_flags,
        data_flags=["--train-file", str(ctx.varlen_file), "--max-length", str(L)],
    )
    hf = hf_launcher(g) + [
        str(BASELINE),
        "--tf32",
        "--mode",
        "classification",
        "--cls-model",
        a.varlen_model,
        "--batch-size",
        str(bs),
        "--seq-len",
        str(L),
        "--steps",
        str(a.steps),
        "--warmup-steps",
        str(a.warmup),
        "--data-file",
        str(ctx.varlen_file),
    ]
    if ctx.cpu:
        hf.append("--tiny")
    common = dict(
        gpus=g,
        model=name,
        task="classification",
        seq_len=L,
        batch_size=bs,
        grad_accum=1,
        steps=a.steps,
        warmup=a.warmup,
    )
    cls_needs = ("datasets", "accelerate", "yaml")
    extra = [
        Run(
            f"ours-cls-{name}-g{g}-b{bs}-{v}",
            "ours",
            f"ours (dynamic padding, length-grouped) [{v}]",
            with_variant(ours, flags),
            strategy="ddp",
            log_every=a.log_every,
            timeout=a.compile_timeout if "--compile" in flags else a.timeout,
            needs=cls_needs,
            variant=v,
            **common,
        )
        for v, flags in variants
    ]
    return [
        Run(
            f"ours-cls-{name}-g{g}-b{bs}",
            "ours",
            "ours (dynamic padding, length-grouped)",
            ours,
            strategy="ddp",
            log_every=a.log_every,
            timeout=a.timeout,
            needs=cls_needs,
            **common,
        ),
        Run(
            f"hf-cls-{name}-g{g}-b{bs}",
            "hf_trainer",
            "HF Trainer (padding=max_length)",
            hf,
            strategy="ddp" if g > 1 else "single",
            log_every=None,
            timeout=a.timeout,
            needs=("transformers",),
            **common,
        ),
        *extra,
    ]


def last_value(cmd: list[str], flag: str, default: object) -> str:
    """The value the last `flag VALUE` in `cmd` gives (argparse keeps the last), else `default`."""
    found = [cmd[i + 1] for i, arg in enumerate(cmd[:-1]) if arg == flag]
    return found[-1] if found else str(default)


def packages_needed(cmd: list[str], strategy: str) -> tuple[str, ...]:
    """The optional packages a run of ours imports, by the flags that win in `cmd`: deepspeed for
    ZeRO, torchao for fp8 on torchao's layers (args.fp8_linear_of: asked for, or a rowwise recipe)."""
    needs = ("datasets", "accelerate", "yaml") + (("deepspeed",) if strategy.startswith("zero") else ())
    torchao = last_value(cmd, "--fp8-linear", "auto") == "torchao" or last_value(cmd, "--fp8-recipe", "") not in (
        "",
        "tensorwise",
    )
    return needs + (("torchao",) if last_value(cmd, "--precision", "") == "fp8" and torchao else ())


def variant_strategy(flags: list[str], default: str) -> tuple[str, list[str]]:
    """The strategy a variant of the zero or xl suite runs: the one its flags name with
    --strategy (taken out of them), else `default`."""
    if "--strategy" in flags:
        i = flags.index("--strategy")
        if i + 1 < len(flags):
            return flags[i + 1], flags[:i] + flags[i + 2 :]
    return default, flags


def build_suites(ctx: Ctx, suites: list[str]) -> dict[str, list[Run]]:
    a, G = ctx.a, ctx.gpus
    out: dict[str, list[Run]] = {}
    for s in suites:
        variants = [(name, flags) for suite, name, flags in a.variants if suite == s]
        if s == "single":
            runs = [ours_lm(ctx, gpus=1, label="ours (ddp, 1 process)")]
            if a.ours_compile:
                runs.append(ours_lm(ctx, gpus=1, compile_=True, label="ours +compile"))
            # baselines before variants: a deadline cuts variants, never the comparison
            runs += [hf_lm(ctx, compile_=False), hf_lm(ctx, compile_=True)]
            runs += [ours_lm(ctx, gpus=1, compile_=True, label="ours +compile", variant=v) for v in variants]
        elif s == "entry":
            # baseline first: a deadline cuts ours' long run, never the comparison's reference
            runs = [hf_lm(ctx, compile_=True), ours_entry(ctx)]
        elif s == "llama":
            shape = dict(
                batch=a.llama_batch_size,
                seq_len=a.llama_seq_len,
                steps=a.llama_steps,
                warmup=a.llama_warmup,
                timeout=a.xl_timeout,
            )
            ll = dict(gpus=1, preset="llama-1b", log_every=a.llama_log_every, **shape)
            name = "tiny-gpt2" if ctx.cpu else "llama-1b"
            runs = [
                ours_lm(ctx, compile_=True, label=f"ours {name} +compile", **ll),
                hf_lm(ctx, compile_=True, model="llama-1b", **shape),
            ]
            # Liger's kernels both ways: its fused loss fails under torch.compile on some torch versions
            liger = [hf_lm(ctx, compile_=c, model="llama-1b", liger=True, **shape) for c in (False, True)]
            runs += liger if a.hf_liger and not ctx.cpu else []  # the CPU smoke runs tiny GPT-2: no Liger
            # e.g. fp8=--precision fp8: ours again with those flags, against ours and the Trainer
            runs += [ours_lm(ctx, compile_=True, label=f"ours {name} +compile", variant=v, **ll) for v in variants]
        elif s == "scaling":
            counts = sorted({n for n in (1, 2, 4, 8, 16) if n <= G} | {G})
            runs = [ours_lm(ctx, gpus=n, label=f"ours ddp x{n}") for n in counts]
            # variants of multi-GPU settings (e.g. --ddp-reduce-dtype bf16): counts above 1 only,
            # against the same 1-GPU run
            # (or the strategy their flags name, e.g. fsdp's weak scaling)
            for v in variants:
                st = variant_strategy(v[1], "ddp")[0]
                runs += [ours_lm(ctx, gpus=n, label=f"ours {st} x{n}", variant=v) for n in counts if n > 1]
        elif s == "zero":
            runs = [ours_lm(ctx, gpus=G, strategy=st, label=f"ours {st} x{G}") for st in a.zero_strategies]
            runs += [
                ours_lm(ctx, gpus=G, strategy=st, compile_=True, label=f"ours {st} +compile x{G}")
                for st in a.zero_compiled
            ]
            # variants tune ZeRO-3 (e.g. --no-zero3-block-fetch), or the strategy their flags name:
            # one more run each
            for name, flags in variants:
                st, rest = variant_strategy(flags, "zero3")
                runs.append(ours_lm(ctx, gpus=G, strategy=st, label=f"ours {st} x{G}", variant=(name, rest)))
        elif s == "xl":
            xl = dict(
                gpus=G,
                preset=a.xl_preset,
                batch=a.xl_batch_size,
                steps=a.xl_steps,
                warmup=a.xl_warmup,
                log_every=a.xl_log_every,
                timeout=a.xl_timeout,
                # llama-1b trains on sequences of 2048 (--llama-seq-len), GPT-2's positions stop at 1024
                seq_len=a.llama_seq_len if a.xl_preset in lib.LLAMA_SHAPES else None,
            )
            name = "tiny-gpt2" if ctx.cpu else a.xl_preset
            runs = [ours_lm(ctx, strategy=st, label=f"ours {name} {st} x{G}", **xl) for st in a.xl_strategies]
            for vname, flags in variants:
                st, rest = variant_strategy(flags, "zero3")
                runs.append(ours_lm(ctx, strategy=st, label=f"ours {name} {st} x{G}", variant=(vname, rest), **xl))
        elif s == "accum":
            g = a.accum_gpus
            k1 = ours_lm(ctx, gpus=g, accum=1, label="ours k=1")
            kk = ours_lm(
                ctx,
                gpus=g,
                accum=a.accum_k,
                steps=a.accum_steps,
                warmup=a.accum_warmup,
                log_every=a.accum_log_every,
                label=f"ours k={a.accum_k}",
            )
            runs = [k1, kk]
        elif s == "varlen":
            runs = varlen_runs(ctx, variants)
        else:
            raise SystemExit(f"unknown suite {s!r}; choose from {', '.join(SUITES)} or all")
        out[s] = runs
    return out


# ---------------------------------------------------------------- environment


def contract_env(dirs: dict[str, Path], port: int, shim: Path | None) -> dict[str, str]:
    """The DISTRAIN_* variables of a one-node job whose folders are `dirs`, as training/contract.py
    writes them for every backend (imported through the shim when distrain_cloud is not installed)."""
    if shim is not None and str(shim) not in sys.path:
        sys.path.insert(0, str(shim))
    from distrain_cloud.training.contract import Contract

    contract = Contract(
        model_dir=dirs["model"], output_dir=dirs["output"], checkpoint_dir=dirs["checkpoints"], main_port=port
    )
    return contract.to_env()


def child_env(ctx: Ctx, run: Run, dirs: dict[str, Path], port: int, shim: Path | None) -> dict[str, str]:
    # The job's contract is the bench's to set; DISTRAIN_DEBUG (full tracebacks in the log) passes.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTRAIN_", "SM_")) or k == "DISTRAIN_DEBUG"}
    env.update(lib.REQUIRED_ENV)  # required on the GPU machines; never remove
    env.update(contract_env(dirs, port, shim))
    env.update(
        {
            "HF_DATASETS_CACHE": str(ctx.work / "hf-datasets-cache"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # so CUDA's device i is nvidia-smi's GPU i (memory sampling)
        }
    )
    if shim is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(shim)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    # The job keeps its compile cache beside its checkpoints unless this is set (training/contract.py):
    # one folder for the invocation, or none, so that each run's own (a cold compile) is used.
    if ctx.a.compile_cache == "shared":
        env["TORCHINDUCTOR_CACHE_DIR"] = str(ctx.work / "compile-cache")
    else:
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    if ctx.cpu:
        # CPU smoke only: one thread per process, or OpenMP spin-waits on a busy small
        # machine make timings meaningless (GPU runs keep the environment untouched).
        env["OMP_NUM_THREADS"] = "1"
    if not ctx.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_devices()[: run.gpus])
    return env


def visible_devices() -> list[str]:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd:
        return [d.strip() for d in cvd.split(",") if d.strip()]
    return [str(i) for i in range(64)]


def package_shim(work: Path) -> Path | None:
    """Make `distrain_cloud.training` importable from this checkout when it isn't installed.

    The repository maps training/ to distrain_cloud.training only through pyproject's
    package-dir; on a machine where `pip install -e .` was not run, a folder of symlinks
    on PYTHONPATH gives the children the same package names, from this very checkout.
    """
    try:
        spec = importlib.util.find_spec("distrain_cloud.training")
    except ModuleNotFoundError:  # not even the namespace package is importable
        spec = None
    if (
        spec is not None
        and spec.submodule_search_locations
        and Path(list(spec.submodule_search_locations)[0]).resolve() == (lib.REPO / "training").resolve()
    ):
        return None
    shim = work / "pkgshim"
    pkg = shim / "distrain_cloud"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in ("training", "launcher", "infra"):
        link = pkg / name
        if not link.exists() and (lib.REPO / name).is_dir():
            link.symlink_to(lib.REPO / name, target_is_directory=True)
    return shim


def have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def versions() -> dict:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    packages = ("torch", "transformers", "accelerate", "deepspeed", "datasets", "tokenizers", "torchao", "liger-kernel")
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def gpu_holders(own: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The processes that hold memory on the GPUs, from nvidia-smi: (blocking, neighbours).

    Blocking, "pid 123 (8800 MiB)": with `own` None, every process on any GPU of the machine (a
    run's NCCL and host threads share more than its own cards). With `own`, the nvidia-smi indices
    (PCI bus order) the bench was pinned to by CUDA_VISIBLE_DEVICES, only those on them: one-GPU
    benches run side by side on a 2-GPU host, each pinned to its GPU, and must not skip each
    other's runs. The others are neighbours, "pid 124 (900 MiB) on GPU 0". A process whose GPU
    cannot be told (the GPU query fails, an unknown bus id) blocks. None of either where
    nvidia-smi is missing or fails (the run is then timed as before)."""
    if not shutil.which("nvidia-smi"):
        return [], []

    def query(what: str) -> list[list[str]] | None:
        try:
            out = subprocess.run(
                ["nvidia-smi", f"--query-{what}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            return None
        return [[part.strip() for part in line.split(",")] for line in out.stdout.splitlines()]

    apps = query("compute-apps=pid,used_memory,gpu_bus_id")
    if apps is None:
        return [], []
    index_of: dict[str, str] = {}
    if own is not None:  # bus id (nvidia-smi's 00000000:18:00.0, any case) -> index
        index_of = {row[1].lower(): row[0] for row in query("gpu=index,pci.bus_id") or [] if len(row) == 2}
    holders, neighbours = [], []
    for row in apps:
        pid, used, bus = (row + ["", ""])[:3]
        if not pid.isdigit():  # "No running processes found" and the like are not processes
            continue
        who = f"pid {pid} ({used})" if used else f"pid {pid}"
        gpu = index_of.get(bus.lower())
        if own is None or gpu is None or gpu in own:
            holders.append(who)
        else:
            neighbours.append(f"{who} on GPU {gpu}")
    return holders, neighbours


def gpu_inventory() -> list[dict]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        text = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total,memory.used",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            rows.append(
                {
                    "index": parts[0],
                    "name": parts[1],
                    "driver": parts[2],
                    "memory_total_mib": float(parts[3]),
                    "memory_used_mib": float(parts[4]),
                }
            )
    return rows


def git_commit() -> str | None:
    try:
        r = subprocess.run(
            ["git", "-C", str(lib.REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(lib.REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (r.stdout.strip() + ("+dirty" if dirty else "")) if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


# The folders whose Python a run executes: the product and the bench itself.
SOURCE_DIRS = ("training", "launcher", "infra", "bench")


def source_sha(root: Path = lib.REPO) -> str:
    """sha256 (first 16 hex digits) of the Python sources under SOURCE_DIRS, by path and content.
    A results file names the code it ran even where git's view is stale (a device copy of a
    working tree keeps the checkout's old HEAD): `bench/run.py --source-sha` at a commit gives the
    value to compare."""
    import hashlib

    digest = hashlib.sha256()
    files = sorted(
        f for d in SOURCE_DIRS for f in (root / d).rglob("*.py") if "__pycache__" not in f.relative_to(root).parts
    )
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class GpuMemSampler:
    """Peak nvidia-smi memory.used per GPU while a run is alive (context + cache + tensors)."""

    def __init__(self, interval: float = 0.5, enabled: bool = True):
        self.interval, self.peak = interval, {}
        self.enabled = enabled and bool(shutil.which("nvidia-smi"))
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _loop(self):
        while not self._stop.is_set():
            try:
                text = subprocess.run(
                    ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
                for line in text.strip().splitlines():
                    i, used = (p.strip() for p in line.split(","))
                    self.peak[i] = max(self.peak.get(i, 0.0), float(used))
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.interval)

    def max_gib(self, devices: list[str]) -> float | None:
        values = [v for i, v in self.peak.items() if i in devices] or list(self.peak.values())
        return max(values) / 1024 if values else None


# ---------------------------------------------------------------- running and parsing

OOM = re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|Cannot allocate memory", re.I)
DONE = re.compile(r"^done: \d+ steps", re.M)  # the trainer's last line (trainer.py)


class Runner:
    def __init__(self, ctx: Ctx, out: Path, shim: Path | None, deadline: float | None):
        self.ctx, self.out, self.shim, self.deadline = ctx, out, shim, deadline
        self.port = 29600
        self.current: subprocess.Popen | None = None
        self.stop_grace_s = 20.0  # a timed-out or interrupted run's time to stop before it is killed
        self.busy_wait_s = 30.0  # how long a run waits for other processes to leave the GPUs
        (out / "logs").mkdir(parents=True, exist_ok=True)

    def execute(self, run: Run) -> dict:
        missing = [m for m in run.needs if not have(m)]
        if missing:
            return {"status": f"SKIPPED (missing {', '.join(missing)})"}
        timeout = run.timeout
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left < 60:
                return {"status": "SKIPPED (deadline)"}
            timeout = int(min(timeout, left - 15))
        busy, neighbours = (None, None) if self.ctx.cpu else self.wait_for_free_gpus()
        if busy and not self.ctx.a.allow_busy_gpus:
            skipped = {"status": f"SKIPPED (GPUs busy: {busy})", "gpus_busy": busy}
            return skipped | ({"gpus_neighbours": neighbours} if neighbours else {})
        rundir = Path(tempfile.mkdtemp(prefix=f"{run.id}-", dir=self.ctx.work))
        dirs = {k: rundir / k for k in ("model", "output", "checkpoints")}
        self.port += 1
        env = child_env(self.ctx, run, dirs, self.port, self.shim)
        log = self.out / "logs" / f"{run.id}.log"
        t0 = time.monotonic()
        status = None
        with open(log, "w") as f, GpuMemSampler(enabled=not self.ctx.cpu) as mem:
            f.write("# " + shown(run.cmd, self.ctx) + "\n")
            f.flush()
            self.current = subprocess.Popen(
                run.cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=lib.REPO, start_new_session=True
            )
            try:
                rc = self.current.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop_current()
                rc, status = None, f"TIMEOUT ({timeout}s)"
            except BaseException:  # Ctrl-C / SIGTERM of this driver: take the run down with it
                self.stop_current()
                raise
            finally:
                self.current = None
        wall = time.monotonic() - t0
        text = log.read_text(errors="replace")
        res = {
            "wall_s": round(wall, 1),
            "log": str(log.relative_to(self.out)),
            "rc": rc,
            "peak_mem_smi_gb": mem.max_gib(env.get("CUDA_VISIBLE_DEVICES", "").split(","))
            if not self.ctx.cpu
            else None,
        }
        metrics = dirs["output"] / "metrics.jsonl"
        if metrics.exists():
            shutil.copy(metrics, self.out / "logs" / f"{run.id}.metrics.jsonl")
        profile = dirs["output"] / "profile.txt"  # --profile-steps: keep the kernel table (the trace is large)
        if profile.exists():
            shutil.copy(profile, self.out / "logs" / f"{run.id}.profile.txt")
        parsed = parse_ours(run, metrics, text) if run.impl == "ours" else parse_hf(run, text)
        res.update(parsed)
        if status is not None and run.impl == "ours" and res.get("complete") and DONE.search(text):
            # The trainer printed its last line (after the eval) and was still exiting, CUDA's and the
            # compile workers' teardown, when the deadline's clamp came: its figures are whole.
            status, res["note"] = "ok", f"stopped at its {timeout}s limit while exiting, after its done: line"
        if status is None:
            if rc == 0 and res.get("tokens_per_sec") is not None:
                status = "ok"
            elif OOM.search(text):
                status = "OOM"
            else:
                status = f"FAILED (rc={rc})"
        if status != "ok":
            res["error"] = last_error(text)
            res["tracebacks"] = [str(t.relative_to(self.out)) for t in keep_tracebacks(dirs["output"], log)]
            if res.get("tokens_per_sec") is not None and res.get("complete"):
                res["note"] = "all timed windows finished; the failure came after training (eval/save)"
        if busy:  # --allow-busy-gpus: timed beside another process, and the row says so
            res["gpus_busy"] = busy
            status = f"{status} (GPUs busy: {busy})"
        if neighbours:  # on the machine's other GPUs, outside CUDA_VISIBLE_DEVICES: noted, the row unchanged
            res["gpus_neighbours"] = neighbours
        res["status"] = status
        shutil.rmtree(rundir, ignore_errors=True)  # model files can be GBs
        return res

    def wait_for_free_gpus(self) -> tuple[str | None, str | None]:
        """(busy, neighbours). busy: None when no process holds a GPU, else who does ("pid 123
        (8800 MiB)"), after waiting up to `busy_wait_s` for them to let go (a finished run's ranks
        may take a moment). A stray rank of a timed-out run made a 2-GPU row read 46% weak scaling
        instead of 96.8%. Any process on any GPU of the machine counts: a run's NCCL and host
        threads share more than its own cards. Except where the bench was started with
        CUDA_VISIBLE_DEVICES naming some of the machine's GPUs by index (read as nvidia-smi's, PCI
        bus order, as the runs get CUDA_DEVICE_ORDER=PCI_BUS_ID): one-GPU benches run side by side
        on a 2-GPU host, each pinned to its GPU, and the run on GPU 1 was skipped for GPU 0's. Then
        only processes on those GPUs count; the others are neighbours ("pid 124 (900 MiB) on GPU
        0"), not waited for, and recorded. Names other than indices (UUIDs, MIG) count every GPU."""
        own = visible_devices() if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() else None
        if own is not None and not all(d.isdigit() for d in own):
            own = None
        end = time.monotonic() + self.busy_wait_s
        while True:
            holders, neighbours = gpu_holders(own)
            if not holders or time.monotonic() >= end:
                return ", ".join(holders) or None, ", ".join(neighbours) or None
            time.sleep(min(2.0, self.busy_wait_s))

    def stop_current(self):
        """SIGTERM the run's process group (ours saves and exits), then SIGKILL whatever of its
        process tree still runs `stop_grace_s` later. The tree, not the group: torchrun's workers
        lead sessions of their own, and a timed-out run's rank outlived the group's kill for 14
        minutes, holding 8.8 GiB of a GPU."""
        if self.current is not None:  # the package through the shim, as contract_env
            lib.stop_process_tree(self.current, self.stop_grace_s)


def keep_tracebacks(output: Path, log: Path) -> list[Path]:
    """Copy a failed run's traceback files (the trainer writes one per rank into its output folder)
    beside its log, <run id>.traceback[-rankN].txt, before the run folder is deleted: the log has
    only their one-line summary, and on a lent GPU machine what is not under the results folder
    is lost with it."""
    kept = []
    for tb in sorted(output.glob("traceback*.txt")):
        kept.append(log.with_name(f"{log.stem}.{tb.name}"))
        shutil.copy(tb, kept[-1])
    return kept


def last_error(text: str) -> str:
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith("# ") and "[WARNING]" not in line and "Warning:" not in line
    ]
    for line in reversed(lines):
        if OOM.search(line) or line.startswith("error:") or re.match(r"^[\w.]+(Error|Exception)\b", line):
            return line[:300]
    return lines[-1][:300] if lines else ""


def parse_ours(run: Run, metrics: Path, text: str) -> dict:
    rows = []
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    else:  # fall back to the key=value lines on stdout
        for line in text.splitlines():
            if line.startswith("step=") and "tokens_per_sec=" in line:
                kv = lib.parse_kv(line)
                rows.append(
                    {
                        k: float(v) if k != "step" else int(v)
                        for k, v in kv.items()
                        if re.fullmatch(r"[-+0-9.eE]+|nan|inf", v)
                    }
                )
    windows = lib.windows_of([r for r in rows if "tokens_per_sec" in r])
    post = [w for w in windows if w[0] >= run.warmup]
    note = None
    if not post and windows:
        post, note = windows[-1:], "no post-warmup window; used the last"
    # The profiled windows are kept apart, in profiled_windows.
    post, left_out = lib.without_profiled(post, lib.profiled_steps(text))
    pick = [w[2] for w in post]
    tps = lib.median([r["tokens_per_sec"] for r in pick]) if pick else None
    res = {
        "tokens_per_sec": tps,
        "step_time_ms": 1000 * lib.median([r["step_time"] for r in pick]) if pick and "step_time" in pick[0] else None,
        "data_wait_pct": lib.median([r["data_wait_pct"] for r in pick])
        if pick and "data_wait_pct" in pick[0]
        else None,
        "windows": [[w[0], w[1]] for w in post],
        "tokens_per_sec_windows": [round(r["tokens_per_sec"], 1) for r in pick],
    }
    if left_out:
        res["profiled_windows"] = [[w[0], w[1], round(w[2]["tokens_per_sec"], 1)] for w in left_out]
    if pick and "pad_pct" in pick[0]:  # measured by the trainer (padded positions it ran); wins over the replay
        res["pad_frac"] = lib.median([r["pad_pct"] for r in pick]) / 100.0
    peaks = [r["peak_mem_gb"] for r in rows if "peak_mem_gb" in r]
    res["peak_mem_gb"] = max(peaks) if peaks else None
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    res["final_train_loss"] = losses[-1] if losses else None  # the last window's (fp8 vs bf16)
    # The whole curve, a point per logged step: a final loss alone cannot tell a steady lag from
    # one spike (session 23's delayed scaling), and the logs do not come back from the GPU machines.
    res["train_loss_curve"] = [
        [r["step"], round(r["train_loss"], 5)]
        for r in rows  # a malformed row (the job's own file, but a whole call's results hang on it) is left out
        if isinstance(r.get("step"), int) and isinstance(r.get("train_loss"), (int, float))
    ]
    first = re.search(r"^first_step_s=([\d.]+)(?: compile_cache_hits=(\d+))?", text, re.M)
    if first:  # the first step's seconds, compile included; compiled, the compile cache's hits (--compile-cache)
        res["first_step_s"] = float(first.group(1))
        if first.group(2) is not None:
            res["compile_cache_hits"] = int(first.group(2))
    # The residual stream's dtype as the trainer cast it (--residual-dtype auto picks per model): the
    # loss ledger pools runs by it. No line: nothing cast (autocast's fp32 stream under ddp; the
    # sharded engines' 16-bit weights run it in bf16 with no cast, as before this field).
    stream = re.search(r"^residual_dtype=(bf16|fp32)\b", text, re.M)
    res["residual_dtype"] = stream.group(1) if stream else "fp32"
    # Likewise the rope tables (on by default for a compiled model since session 27). No line: the
    # trainer left the rotary module alone (eager, or --no-rope-tables).
    tables = re.search(r"^rope_tables=(on|off)\b", text, re.M)
    res["rope_tables"] = tables.group(1) if tables else "off"
    # And fp8's recipe as the trainer resolved it (--precision fp8's auto recipe since session 33):
    # the ledger reads an fp8 run's head and fast accumulation here, not from its flags, and since
    # session 36 its gradients' format and the block linears kept bf16. No line: no float8 layers,
    # or a trainer from before these fields (the ledger then reads the flags).
    fp8 = re.search(
        r"^fp8=on linear_layers=\d+ fast_accum=([\w-]+) head=([\w+-]+)(?: grads=(\w+) bf16_layers=([\w,]+))?",
        text,
        re.M,
    )
    if fp8:
        res["fp8_fast_accum"], res["fp8_head"] = fp8.group(1), fp8.group(2)
        if fp8.group(3):
            res["fp8_grad_dtype"], res["fp8_bf16_layers"] = fp8.group(3), fp8.group(4)
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    res["final_eval_loss"] = evals[-1] if evals else None  # held-out text: the loss comparison
    res["complete"] = bool(windows) and windows[-1][1] >= run.warmup + run.steps
    prof = next((line for line in text.splitlines() if line.startswith("profile_steps=")), None)
    if prof:  # --profile-steps: per-step GPU busy, collective and exposed-collective milliseconds
        res["profile"] = lib.parse_kv(prof)
    if note:
        res["note"] = note
    return res


def parse_hf(run: Run, text: str) -> dict:
    line = next((x for x in reversed(text.splitlines()) if x.startswith("bench=hf_trainer")), None)
    if line is None:
        return {"tokens_per_sec": None}
    kv = lib.parse_kv(line)

    def num(k):
        try:
            return float(kv[k])
        except (KeyError, ValueError):
            return None

    res = {
        "tokens_per_sec": num("tokens_per_sec"),
        "tokens_per_sec_step": num("tokens_per_sec_step"),
        "step_time_ms": num("step_time_ms"),
        "mfu_reported": num("mfu"),
        "peak_mem_gb": num("peak_mem_gb"),
        "peak_mem_reserved_gb": num("peak_mem_reserved_gb"),
        "pad_frac": num("pad_frac"),
        "n_params_counted": int(num("n_params")) if num("n_params") is not None else None,
        "baseline_line": line,
        "complete": True,
    }
    return res


def finish(run: Run, res: dict, peak: float, cpu: bool) -> dict:
    res["cpu"] = cpu
    tps = res.get("tokens_per_sec")
    world = max(1, run.gpus)
    res["tokens_per_sec_per_gpu"] = tps / world if tps is not None else None
    if run.task == "lm" and run.fpt is not None:
        res["mfu"] = lib.mfu(tps, run.fpt, world, peak)
    return res


# ---------------------------------------------------------------- tables


def fmt(v, spec=".3g"):
    if v is None:
        return "–"
    if isinstance(v, int) and not isinstance(v, bool) and spec == "int":
        return f"{v:,}"
    if isinstance(v, float):
        if spec == "int":
            return f"{v:,.0f}"
        return format(v, spec)
    return str(v)


def xfmt(q) -> str:
    return "–" if q is None else f"{q:.2f}x"


def run_row(r: Run) -> list[str]:
    res = r.result
    return [
        r.label,
        f"{r.gpus} cpu" if r.result.get("cpu") else str(r.gpus),
        r.strategy,
        str(r.batch_size),
        str(r.grad_accum),
        fmt(res.get("tokens_per_sec"), "int"),
        fmt(res.get("tokens_per_sec_per_gpu"), "int"),
        fmt(res.get("step_time_ms"), ".1f"),
        fmt(res.get("mfu"), ".1%") if res.get("mfu") is not None else "–",
        fmt(res.get("peak_mem_gb"), ".2f"),
        fmt(res.get("peak_mem_smi_gb"), ".2f"),
        fmt(res.get("data_wait_pct"), ".1f"),
        res.get("status", "pending"),
    ]


HEADER = [
    "run",
    "GPUs",
    "strategy",
    "micro-bs",
    "accum",
    "tokens/s",
    "tokens/s/GPU",
    "step ms",
    "MFU",
    "peak GiB (torch)",
    "peak GiB (nvidia-smi)",
    "data wait %",
    "status",
]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(x, y):
    return x / y if x is not None and y else None


def summarize(suite: str, runs: list[Run], ctx: Ctx) -> tuple[list[str], dict]:
    """Suite-specific derived numbers: (markdown lines, json)."""
    res = [r.result for r in runs]
    tps = [x.get("tokens_per_sec") for x in res]
    lines, out = [], {}
    if suite in ("single", "entry", "llama"):
        for o in (r for r in runs if r.impl == "ours"):
            for h in (r for r in runs if r.impl == "hf_trainer"):
                q = ratio(o.result.get("tokens_per_sec"), h.result.get("tokens_per_sec"))
                out[f"{o.id}_over_{h.id}"] = q
                lines.append(f"- {o.label} ÷ {h.label}: **{xfmt(q)}** tokens/s")
        counted = [r.result.get("n_params_counted") for r in runs if r.result.get("n_params_counted")]
        if counted and runs[0].n_params:
            same = counted[0] == runs[0].n_params
            lines.append(
                f"- parameters (N in MFU): {runs[0].n_params:,} by formula"
                + (", equal to the baseline's count" if same else f"; WARNING: the baseline counted {counted[0]:,}")
            )
        if suite == "llama":  # each variant (fp8) against the plain run: speed and the loss it reached
            base = next((r for r in runs if r.impl == "ours" and not r.variant), None)
            for v in (r for r in runs if r.impl == "ours" and r.variant):
                q = ratio(v.result.get("tokens_per_sec"), base.result.get("tokens_per_sec") if base else None)
                bl, vl = (base.result.get("final_train_loss") if base else None), v.result.get("final_train_loss")
                rel = (vl - bl) / bl if vl is not None and bl else None
                be, ve = (base.result.get("final_eval_loss") if base else None), v.result.get("final_eval_loss")
                erel = (ve - be) / be if ve is not None and be else None
                out[f"{v.variant}_over_ours"], out[f"{v.variant}_loss_rel"] = q, rel
                out[f"{v.variant}_eval_loss_rel"] = erel
                lines.append(
                    f"- ours [{v.variant}] ÷ ours: **{xfmt(q)}** tokens/s; eval loss after step "
                    f"{v.warmup + v.steps}: {fmt(ve, '.4f')} vs {fmt(be, '.4f')} "
                    f"(**{fmt(erel, '+.2%') if erel is not None else '–'}**); train loss (last window): "
                    f"{fmt(vl, '.4f')} vs {fmt(bl, '.4f')} ({fmt(rel, '+.2%') if rel is not None else '–'})"
                )
    elif suite == "scaling":
        for r, t in zip(runs, tps, strict=True):
            base = next((t1 for r1, t1 in zip(runs, tps, strict=True) if max(1, r1.gpus) == 1), None)
            n = max(1, r.gpus)
            eff = ratio(t, n * base) if base else None
            tag = f" [{r.variant}]" if r.variant else ""
            out[f"efficiency_x{n}" + (f"_{r.variant}" if r.variant else "")] = eff
            lines.append(
                f"- weak-scaling efficiency x{n}{tag} = tokens/s({n}{tag}) / ({n} × tokens/s(1)): "
                f"**{fmt(eff, '.1%') if eff is not None else '–'}**"
            )
    elif suite == "zero":
        # Each run against DDP run the same way (eager or compiled; eager DDP if no compiled one ran).
        compiled = lambda r: "--compile" in r.cmd  # noqa: E731
        ddps = {
            c: next((r for r in runs if r.strategy == "ddp" and not r.variant and compiled(r) == c), None)
            for c in (False, True)
        }
        for r, t in zip(runs, tps, strict=True):
            ddp = ddps[compiled(r)] or ddps[False]
            if r is ddp:
                continue
            q = ratio(t, ddp.result.get("tokens_per_sec") if ddp else None)
            ddp_name = "ddp +compile" if ddp is not None and compiled(ddp) else "ddp"
            name = r.strategy + (" +compile" if compiled(r) else "") + (f" [{r.variant}]" if r.variant else "")
            key = r.strategy + ("_compiled" if compiled(r) else "") + (f"_{r.variant}" if r.variant else "")
            out[f"{key}_over_{ddp_name.replace(' +compile', '_compiled')}"] = q
            lines.append(
                f"- {name} ÷ {ddp_name} tokens/s: **{xfmt(q)}**; peak GiB (torch) "
                f"{fmt(r.result.get('peak_mem_gb'), '.2f')} vs "
                f"{fmt(ddp.result.get('peak_mem_gb') if ddp else None, '.2f')}"
            )
    elif suite == "accum" and len({r.grad_accum for r in runs}) == 2:
        k1, kk = sorted(runs, key=lambda r: r.grad_accum)
        tps = [k1.result.get("tokens_per_sec"), kk.result.get("tokens_per_sec")]
        st1, stk = k1.result.get("step_time_ms"), kk.result.get("step_time_ms")
        q = ratio(stk, kk.grad_accum * st1) if st1 else None
        out["step_time_ratio"] = q
        lines.append(
            f"- step_time(k={kk.grad_accum}) / ({kk.grad_accum} × step_time(k=1)) = **{fmt(q, '.3f')}** "
            "(1.0 = accumulation costs exactly k micro-steps; below 1 = the skipped optimizer steps "
            "and gradient syncs are saved; above 1 = overhead)"
        )
        lines.append(f"- tokens/s k={kk.grad_accum} ÷ k=1: **{xfmt(ratio(tps[1], tps[0]))}**")
    elif suite == "varlen":
        hf = next((r for r in runs if r.impl == "hf_trainer"), None)
        hpf, htps = (hf.result.get("pad_frac"), hf.result.get("tokens_per_sec")) if hf else (None, None)
        out["hf_pad_frac"] = hpf
        lines.append(
            f"- HF Trainer padding fraction: {fmt(hpf, '.1%') if hpf is not None else '–'} (measured); "
            f"HF padded tokens/s: {fmt(htps / (1 - hpf), 'int') if htps and hpf is not None and hpf < 1 else '–'}"
        )
        for ours in (r for r in runs if r.impl == "ours"):
            otps = ours.result.get("tokens_per_sec")
            pf = ours.result.get("pad_frac")  # measured: the trainer's pad_pct
            key = "ours" + (f"_{ours.variant}" if ours.variant else "")
            out.update({f"{key}_pad_frac": pf, f"{key}_over_hf_nonpad": ratio(otps, htps)})
            lines.append(
                f"- {ours.label} ÷ HF Trainer, non-pad tokens/s: **{xfmt(ratio(otps, htps))}**; padding "
                f"{fmt(pf, '.1%') if pf is not None else '–'}"
                + (f"; padded tokens/s {fmt(otps / (1 - pf), 'int')}" if pf is not None and otps else "")
            )
    elif suite == "xl":
        for r in runs:
            lines.append(
                f"- {r.strategy}: {r.result.get('status', 'pending')}"
                + (f" — {r.result.get('error')}" if r.result.get("error") else "")
            )
    for r in runs:
        p = r.result.get("profile")
        if p and len(p) > 1:
            lines.append(
                f"- {r.label}, profiled steps {p['profile_steps']} (ms per step): GPU busy "
                f"{p.get('profile_gpu_busy_ms')}, idle {p.get('profile_gpu_idle_ms')}, collectives "
                f"{p.get('profile_comm_ms')}, of which not overlapped by compute "
                f"{p.get('profile_exposed_comm_ms')}"
            )
    return lines, out


SUITE_TITLES = {
    "single": "single — 1 GPU: ours vs transformers.Trainer (defaults, +torch_compile)",
    "entry": "entry — 1 GPU: our entry point alone, no flags (its defaults pick precision and compile) vs "
    "Trainer +torch_compile",
    "llama": "llama — 1 GPU: llama-1b (Llama 3.2 1B shapes), ours +compile vs Trainer +torch_compile",
    "scaling": "scaling — ours DDP on 1..N GPUs (weak scaling: fixed micro-batch per GPU)",
    "zero": "zero — ours DDP vs ZeRO-2 vs ZeRO-3 vs FSDP on N GPUs, 124M",
    "xl": "xl — gpt2-xl (~1.56B) on N GPUs: DDP, ZeRO-2, ZeRO-3, ZeRO-3 + CPU offload",
    "accum": "accum — gradient accumulation cost (ours)",
    "varlen": "varlen — variable-length classification: dynamic padding + length grouping vs padding=max_length",
}


def render(meta: dict, suites: dict[str, list[Run]], ctx: Ctx) -> tuple[str, dict]:
    md = ["# distrain-cloud benchmark", ""]
    v = meta["versions"]
    gpus = meta.get("gpus") or []
    md.append(
        f"- date: {meta['date']}  commit: {meta.get('commit')} (sources {meta.get('source_sha')})  host GPUs: "
        + (f"{len(gpus)} x {gpus[0]['name']} (driver {gpus[0]['driver']})" if gpus else "none (CPU)")
    )
    md.append("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    md.append(
        f"- settings: seq {ctx.a.seq_len}, micro-batch {ctx.a.batch_size}, {ctx.a.steps} timed steps after "
        f"{ctx.a.warmup} warmup steps (ours: median of per-window tokens/s over windows of {ctx.a.log_every} "
        f"steps after warmup; HF: one span over the timed steps), "
        f"precision {ctx.precision if not ctx.cpu else 'fp32'}; "
        f"xl: micro-batch {ctx.a.xl_batch_size}, {ctx.a.xl_steps} after {ctx.a.xl_warmup} "
        f"(windows of {ctx.a.xl_log_every}); "
        f"accum: k={ctx.a.accum_k}, {ctx.a.accum_steps} after {ctx.a.accum_warmup} "
        f"(windows of {ctx.a.accum_log_every}); "
        f"varlen: micro-batch {ctx.a.varlen_batch_size}, max length {ctx.a.varlen_max_length}"
    )
    md.append(
        f"- MFU = tokens/s × (6N + 12·L·d·T) / ({ctx.peak / 1e12:g} TFLOP/s × GPUs), N = all parameters "
        "incl. embeddings; peak GiB (torch) = max_memory_allocated (ours: its logged peak_mem_gb, "
        "when present); peak GiB (nvidia-smi) = sampled memory.used, max over the run's GPUs"
    )
    c = meta.get("lm_corpus")
    if c:
        md.append(
            f"- LM data: the Python {c['python']} standard library's source, not repeated: {c['files']:,} files, "
            f"{c['chars']:,} characters (about {c['tokens_estimate']:,} tokens), sha256 {c['sha256'][:16]}…"
        )
    data = {"meta": meta, "suites": {}}
    for name, runs in suites.items():
        md += [
            "",
            f"## {SUITE_TITLES[name]}",
            "",
            f"model {runs[0].model}, seq {runs[0].seq_len}" + (f", {runs[0].task}" if runs[0].task != "lm" else ""),
            "",
            md_table(HEADER, [run_row(r) for r in runs]),
            "",
        ]
        lines, derived = [], {}
        if all(r.result for r in runs):
            try:
                lines, derived = summarize(name, runs, ctx)
            except Exception as e:  # noqa: BLE001 - never lose the tables over a derived number
                lines = [f"- (derived numbers failed: {type(e).__name__}: {e})"]
        md += lines
        errs = [
            f"- {r.label}: {r.result.get('error')}"
            + (f" (kept: {', '.join(r.result['tracebacks'])})" if r.result.get("tracebacks") else "")
            for r in runs
            if r.result.get("error")
        ]
        if errs and name != "xl":
            md += ["", "errors:"] + errs
        near = [f"- {r.label}: {r.result['gpus_neighbours']}" for r in runs if r.result.get("gpus_neighbours")]
        if near:  # the bench was pinned by CUDA_VISIBLE_DEVICES; these held the machine's other GPUs
            md += ["", "on the machine's other GPUs as the run started (outside CUDA_VISIBLE_DEVICES, not waited for):"]
            md += near
        data["suites"][name] = {"derived": derived, "runs": [run_json(r, ctx) for r in runs]}
    return "\n".join(md) + "\n", data


def shown(cmd: list[str], ctx: Ctx) -> str:
    """A command as recorded (log headers, results.json, --dry-run): paths relative to the
    repository and the work folder, so results carry no machine's paths."""
    text = shlex.join(cmd)
    for path, alias in ((sys.executable, "python"), (str(ctx.work), PLACEHOLDER_WORK), (f"{lib.REPO}/", "")):
        text = text.replace(path, alias)
    return text


def run_json(r: Run, ctx: Ctx) -> dict:
    return {
        "id": r.id,
        "impl": r.impl,
        "label": r.label,
        "gpus": r.gpus,
        "model": r.model,
        "task": r.task,
        "strategy": r.strategy,
        "seq_len": r.seq_len,
        "batch_size": r.batch_size,
        "grad_accum": r.grad_accum,
        "steps": r.steps,
        "warmup": r.warmup,
        "log_every": r.log_every,
        "n_params": r.n_params,
        "flops_per_token": r.fpt,
        "cmd": shown(r.cmd, ctx),
        **r.result,
    }


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Run benchmark suites: our trainer vs transformers.Trainer.")
    p.add_argument("--suite", default="single", help=f"comma list of {', '.join(SUITES)}, or all")
    p.add_argument("--gpus", type=int, help="GPUs for the multi-GPU suites (default: all visible)")
    p.add_argument("--out", help="output folder (default: $OUT if set, else bench/results)")
    p.add_argument("--work-dir", help="scratch for data, model and checkpoint folders (default: a temp dir, removed)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny CPU plumbing check: tiny models, CPU processes (--gpus = processes, default 2)",
    )
    p.add_argument(
        "--source-sha",
        action="store_true",
        help="print the sha of the Python sources this checkout would run (results.json's source_sha) and exit",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each selected run N times, one after another (ids -r2 ... -rN): the run-to-run spread, of a "
        "loss say; without it a command runs once, however many --variant names give it",
    )
    p.add_argument(
        "--compile-cache",
        choices=("shared", "per-run"),
        default="shared",
        help="shared (default): every run of this invocation reads and fills one Inductor cache under the work "
        "folder, so a --repeat run or a variant with the same graphs skips most of its compile (about 100 s of "
        "a 400-step llama-1b run on an H200); per-run: each run starts cold, for timing a first step",
    )
    p.add_argument("--only", metavar="REGEX", help="run only the runs whose id matches (ids: see --dry-run logs)")
    p.add_argument("--deadline-min", type=float, help="start no run after this many minutes; clamp timeouts to it")
    p.add_argument(
        "--allow-busy-gpus",
        action="store_true",
        help="time runs even while another process holds a GPU (the row's status says so); by default such a "
        "run is skipped after waiting 30 s for the GPUs",
    )
    g = p.add_argument_group("shapes and steps (124M suites)")
    g.add_argument("--seq-len", type=int, default=None, help="default 1024 (64 with --cpu-smoke)")
    g.add_argument("--batch-size", type=int, default=None, help="per-GPU micro-batch (default 16; 4 CPU)")
    g.add_argument("--steps", type=int, default=None, help="timed steps (default 60; 4 CPU)")
    g.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 10; 2 CPU)")
    g.add_argument("--log-every", type=int, default=None, help="our log window (default 10; 2 CPU)")
    g.add_argument("--ours-extra", default="", help="extra training flags for every run of ours, e.g. '--compile'")
    g.add_argument("--ours-compile", action="store_true", help="single: also run ours with --compile")
    g.add_argument(
        "--hf-liger",
        action="store_true",
        help="llama: the Trainer again with use_liger_kernel=True, eager and compiled (needs liger-kernel), so "
        "ours is also measured against the Trainer with Liger's kernels (Liger has none for GPT-2: the Trainer "
        "would run without them)",
    )
    g.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SUITE:NAME=FLAGS",
        help="one more run of ours with these training flags, e.g. 'single:liger=--fused-ce --ce-kernel "
        "liger' (single: compiled, 1 GPU; scaling: every GPU count above 1, efficiency against the "
        "plain 1-GPU run; zero and xl: zero3, or the strategy FLAGS name with --strategy; varlen: ours). "
        "NAME=VALUE words among FLAGS set that run's environment. Repeatable",
    )
    g.add_argument(
        "--lm-data",
        choices=("stdlib", "file", "builtin"),
        default="stdlib",
        help="stdlib (default): the Python standard library's source, not repeated, as long as the longest "
        "run needs (the text for loss comparisons); file: corpus.txt repeated so one epoch covers the run; "
        "builtin: --dataset builtin:corpus (43 blocks of 1024: too few for bs 16 on several GPUs)",
    )
    g.add_argument("--eval-samples", type=int, default=256, help="ours --max-eval-samples (untimed tail)")
    g = p.add_argument_group("zero suite")
    g.add_argument(
        "--zero-strategies",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=["ddp", "zero2", "zero3", "fsdp"],
        help="comma list, run eager (default: ddp,zero2,zero3,fsdp)",
    )
    g.add_argument(
        "--zero-compiled",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=[],
        help="comma list: these strategies also run with --compile, each against compiled ddp (e.g. ddp,fsdp)",
    )
    g = p.add_argument_group("xl suite")
    g.add_argument(
        "--xl-preset",
        choices=("gpt2-xl", "llama-1b", "llama-8b"),
        default="gpt2-xl",
        help="the model of the xl suite: gpt2-xl (default), llama-1b or llama-8b (sequences of --llama-seq-len)",
    )
    g.add_argument("--xl-batch-size", type=int, default=4)
    g.add_argument("--xl-steps", type=int, default=15)
    g.add_argument("--xl-warmup", type=int, default=5)
    g.add_argument("--xl-log-every", type=int, default=5)
    g.add_argument("--xl-timeout", type=int, default=600)
    g.add_argument(
        "--xl-strategies",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=["ddp", "zero2", "zero3", "zero3-offload"],
        help="comma list (default: all four)",
    )
    g = p.add_argument_group("entry suite")
    g.add_argument(
        "--entry-steps",
        type=int,
        default=None,
        help="timed steps of the entry point's run (default 990: with --warmup 10 a 1,000-step run, long enough "
        "that its default compiles; 4 CPU)",
    )
    g = p.add_argument_group("llama suite (llama-1b, 1 GPU)")
    g.add_argument("--llama-batch-size", type=int, default=8)
    g.add_argument("--llama-seq-len", type=int, default=2048)
    g.add_argument("--llama-steps", type=int, default=30)
    g.add_argument("--llama-warmup", type=int, default=10)
    g.add_argument("--llama-log-every", type=int, default=10)
    g = p.add_argument_group("accum suite")
    g.add_argument("--accum-k", type=int, default=8)
    g.add_argument("--accum-steps", type=int, default=None, help="timed k-step optimizer steps (default 20; 4 CPU)")
    g.add_argument("--accum-warmup", type=int, default=None, help="default 5 (2 CPU)")
    g.add_argument("--accum-log-every", type=int, default=None, help="default 5 (2 CPU)")
    g.add_argument("--accum-gpus", type=int, default=1)
    g = p.add_argument_group("varlen suite")
    g.add_argument("--varlen-model", choices=("gpt2-small", "bert-base"), default="gpt2-small")
    g.add_argument("--varlen-batch-size", type=int, default=None, help="default 32 (8 CPU)")
    g.add_argument("--varlen-max-length", type=int, default=None, help="default 512 (128 CPU)")
    g.add_argument("--varlen-gpus", type=int, default=1)
    g = p.add_argument_group("limits")
    g.add_argument("--timeout", type=int, default=300, help="seconds per 124M run")
    g.add_argument("--compile-timeout", type=int, default=480, help="seconds per --compile run")
    g.add_argument("--peak-tflops", type=float, default=lib.H100_BF16_PEAK_FLOPS / 1e12)
    a = p.parse_args(argv)
    a.variants = []
    for spec in a.variant:
        head, eq, flags = spec.partition("=")
        suite, colon, name = head.partition(":")
        if not (
            eq
            and colon
            and name.replace("-", "").isalnum()
            and suite in ("single", "llama", "scaling", "zero", "xl", "varlen")
        ):
            p.error(
                f"--variant expects SUITE:NAME=FLAGS with SUITE one of single, llama, scaling, zero, xl, varlen and a "
                f"NAME of letters, digits and '-', got {spec!r}"
            )
        words = shlex.split(flags)
        fixed = sorted({w.split("=")[0] for w in words if ENV_WORD.match(w)} & set(lib.REQUIRED_ENV))
        if fixed:
            p.error(f"--variant {spec!r}: {', '.join(fixed)} must keep the value the GPU machines require")
        a.variants.append((suite, name, words))
    cpu = a.cpu_smoke
    defaults = dict(
        seq_len=(64, 1024),
        batch_size=(4, 16),
        steps=(4, 60),
        warmup=(2, 10),
        log_every=(2, 10),
        accum_steps=(4, 20),
        entry_steps=(4, 990),
        accum_warmup=(2, 5),
        accum_log_every=(2, 5),
        varlen_batch_size=(8, 32),
        varlen_max_length=(128, 512),
    )
    for k, (c, g_) in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, c if cpu else g_)
    if cpu:
        a.xl_steps, a.xl_warmup, a.xl_log_every = 4, 2, 2
    for w, s, le, what in (
        (a.warmup, a.steps, a.log_every, ""),
        (a.accum_warmup, a.accum_steps, a.accum_log_every, "accum-"),
        (a.xl_warmup, a.xl_steps, a.xl_log_every, "xl-"),
    ):
        if w % le or s % le:
            p.error(
                f"--{what}warmup and --{what}steps must be multiples of --{what}log-every "
                f"(whole log windows), got {w}, {s}, {le}"
            )
    if a.repeat < 1:
        p.error(f"--repeat must be 1 or more, got {a.repeat}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.source_sha:
        print(source_sha())
        return 0
    names = list(SUITES) if a.suite == "all" else [s.strip() for s in a.suite.split(",") if s.strip()]
    bad = [s for s in names if s not in SUITES]
    if bad:
        raise SystemExit(f"unknown suite(s) {', '.join(bad)}; choose from {', '.join(SUITES)} or all")
    names = [s for s in SUITES if s in names]
    if a.cpu_smoke:
        gpus = a.gpus or 2  # CPU processes for the multi-process suites
    elif a.gpus is not None:
        gpus = a.gpus
    elif a.dry_run:
        gpus = 4
    else:
        import torch

        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise SystemExit("no CUDA GPU visible; use --cpu-smoke on CPU, or --dry-run")
    out = Path(a.out or os.environ.get("OUT") or lib.BENCH / "results").resolve()
    work = (
        Path(a.work_dir).resolve()
        if a.work_dir
        else (Path(PLACEHOLDER_WORK) if a.dry_run else Path(tempfile.mkdtemp(prefix="distrain-bench-")))
    )
    ctx = Ctx(
        a,
        gpus,
        work,
        work / "data" / "lm_corpus.txt",
        work / "data" / "varlen.jsonl",
        work / "data" / "bert-base",
        a.cpu_smoke,
        a.peak_tflops * 1e12,
    )
    suites = build_suites(ctx, names)
    if a.only:  # keep the runs whose id matches, e.g. --only compile
        kept = {k: [r for r in rs if re.search(a.only, r.id)] for k, rs in suites.items()}
        if not any(kept.values()):  # before any data is written or machine time spent
            ids = ", ".join(r.id for rs in suites.values() for r in rs)
            print(f"bench: --only '{a.only}' matches no run id; the ids: {ids}", file=sys.stderr)
            return 2
        suites = {k: rs for k, rs in kept.items() if rs}  # a suite left empty has no table
    if a.repeat > 1:  # after --only, so that the runs it keeps are the ones repeated
        suites = {k: [c for r in rs for c in repeats(r, a.repeat)] for k, rs in suites.items()}
    all_runs: list[Run] = [r for rs in suites.values() for r in rs]
    unique: dict = {}
    for r in all_runs:
        first = unique.setdefault(r.key, r)
        if first is not r and not a.dry_run:  # the dry run marks it under the command
            print(
                f"bench: {r.id} is the same command as {first.id}: it runs once and both rows show that run "
                "(--repeat N runs a command N times)",
                flush=True,
            )

    # data sized so that one epoch of ours covers the longest run
    lm = [r for r in all_runs if r.task == "lm"]
    need_blocks = max(
        [-(-(r.warmup + r.steps) * r.batch_size * r.grad_accum * max(1, r.gpus) * r.seq_len // a.seq_len) for r in lm],
        default=0,
    )
    cls = [r for r in all_runs if r.task == "classification"]
    need_examples = max([(r.warmup + r.steps) * r.batch_size * r.grad_accum * max(1, r.gpus) for r in cls], default=0)
    n_varlen = math.ceil(need_examples * 1.15 / 0.9) + 64 if cls else 0

    if a.dry_run:
        env_show = " ".join(f"{k}={v}" for k, v in lib.REQUIRED_ENV.items())
        cache_show = f"TORCHINDUCTOR_CACHE_DIR={PLACEHOLDER_WORK}/compile-cache " if a.compile_cache == "shared" else ""
        print(
            f"# every command runs from the repository root with: {env_show} \\\n#   DISTRAIN_MODEL_DIR/OUTPUT_DIR/"
            f"CHECKPOINT_DIR=<fresh dirs under {PLACEHOLDER_WORK}> {cache_show}DISTRAIN_MAIN_PORT=<unique> "
            "HF_*_OFFLINE=1 WANDB_MODE=disabled CUDA_VISIBLE_DEVICES=<first GPUs of the run>\n"
            "#   CUDA_DEVICE_ORDER=PCI_BUS_ID PYTHONPATH=<symlink shim, only when distrain_cloud is not "
            "importable from this checkout>"
        )
        if lm and a.lm_data == "file":
            print(
                f"# data: {shown([str(ctx.lm_file)], ctx)} = training/assets/corpus.txt x "
                f"{lib.corpus_repeats(need_blocks, a.seq_len)} (covers {need_blocks} blocks of {a.seq_len})"
            )
        elif lm and a.lm_data == "stdlib":
            print(
                f"# data: {shown([str(ctx.lm_file)], ctx)} = the Python standard library's source, not repeated: "
                f"the first {lib.stdlib_chars_needed(need_blocks * a.seq_len):,} characters "
                f"(covers {need_blocks} blocks of {a.seq_len})"
            )
        if cls:
            print(
                f"# data: {shown([str(ctx.varlen_file)], ctx)} = {n_varlen} "
                "synthetic variable-length examples (text,label)"
            )
        seen = set()
        for name, runs in suites.items():
            print(f"\n## suite {name}")
            for r in runs:
                again = " (same run as above; reused)" if r.key in seen else ""
                seen.add(r.key)
                print(f"# {r.label}  [gpus={r.gpus} timeout={r.timeout}s]{again}")
                print(shown(r.cmd, ctx))
        print(f"\n# {len(unique)} unique runs, {len(all_runs)} table rows")
        return 0

    # ---- real run
    out.mkdir(parents=True, exist_ok=True)
    shim = package_shim(work)
    if shim is not None:
        sys.path.insert(0, str(shim))
    deadline = time.monotonic() + 60 * a.deadline_min if a.deadline_min else None
    t_start = time.monotonic()
    if lm and a.lm_data == "file":
        try:
            tok = lib.load_tokenizer()
            per_copy = sum(len(x) + 1 for x in tok(lib.read_lines(lib.CORPUS), add_special_tokens=False)["input_ids"])
        except Exception:  # noqa: BLE001 - an estimate is fine without transformers
            per_copy = lib.CORPUS_TOKENS_ESTIMATE
        lib.write_repeated_corpus(ctx.lm_file, lib.corpus_repeats(need_blocks, a.seq_len, per_copy))
    corpus = None
    if lm and a.lm_data == "stdlib":
        corpus = lib.write_stdlib_corpus(ctx.lm_file, lib.stdlib_chars_needed(need_blocks * a.seq_len))
        if corpus["tokens_estimate"] * 0.9 < need_blocks * a.seq_len:  # a second epoch would repeat it
            print(
                f"bench: the standard library's source holds about {corpus['tokens_estimate']:,} tokens, fewer than "
                f"the {need_blocks * a.seq_len:,} the longest run trains on: use fewer steps, or --lm-data file",
                file=sys.stderr,
            )
            return 2
    if cls:
        lib.write_jsonl(ctx.varlen_file, lib.varlen_examples(n_varlen))
        ctx.bert_dir.mkdir(parents=True, exist_ok=True)
        (ctx.bert_dir / "config.json").write_text(json.dumps({**lib.BERT_BASE, "architectures": ["BertForMaskedLM"]}))
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": git_commit(),
        "source_sha": source_sha(),
        "versions": versions(),
        "gpus": gpu_inventory(),
        "host_cpus": os.cpu_count(),
        "suites": names,
        "gpus_used": gpus,
        # folders as placeholders: results.json is committed, machine paths are not
        "args": {**vars(a), "out": "$OUT" if a.out else None, "work_dir": PLACEHOLDER_WORK if a.work_dir else None},
        "required_env": lib.REQUIRED_ENV,
        "package_shim": shown([str(shim)], ctx) if shim else None,
        "lm_data": shown([str(ctx.lm_file)], ctx) if a.lm_data != "builtin" else "builtin:corpus",
        "lm_corpus": corpus,
    }
    if not ctx.cpu:
        meta["modules"] = {m: have(m) for m in ("datasets", "deepspeed", "accelerate", "yaml")}
        try:
            import torch

            meta["cuda"] = torch.version.cuda
        except ImportError:
            pass
    runner = Runner(ctx, out, shim, deadline)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    order = list(unique.values())
    print(f"bench: {len(order)} runs, suites {','.join(names)}, gpus {gpus}, out {out}", flush=True)
    interrupted = False
    try:
        for i, r in enumerate(order, 1):
            print(f"[{i}/{len(order)}] {r.id} ...", end=" ", flush=True)
            res = finish(r, runner.execute(r), ctx.peak, ctx.cpu)
            for rr in all_runs:
                if rr.key == r.key:
                    rr.result = dict(res)
            print(
                f"{res['status']} tokens/s={fmt(res.get('tokens_per_sec'), 'int')} "
                f"step_ms={fmt(res.get('step_time_ms'), '.1f')} wall={fmt(res.get('wall_s'), '.0f')}s",
                flush=True,
            )
            write_outputs(out, meta, suites, ctx, t_start)
    except KeyboardInterrupt:
        interrupted = True
        runner.stop_current()
        print("\ninterrupted; writing what finished", flush=True)
    for r in all_runs:
        if not r.result:
            r.result = {"status": "NOT RUN", "cpu": ctx.cpu}
    md = write_outputs(out, meta, suites, ctx, t_start)
    print("\n" + md)
    print(f"results: {out / 'results.md'} and {out / 'results.json'}; logs in {out / 'logs'}")
    if not a.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in unique.values() if r.result.get("status", "").startswith(("FAILED", "TIMEOUT"))]
    return 130 if interrupted else (1 if failed else 0)


def write_outputs(out: Path, meta: dict, suites, ctx: Ctx, t_start: float) -> str:
    meta = dict(meta, elapsed_s=round(time.monotonic() - t_start, 1))
    md, data = render(meta, suites, ctx)
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(json.dumps(data, indent=2, default=str))
    return md


if __name__ == "__main__":
    sys.exit(main())
