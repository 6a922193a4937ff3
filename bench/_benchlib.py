"""Shared, torch-free helpers for the benchmark harness (run.py and hf_trainer_baseline.py).

Kept free of heavy imports so `run.py --dry-run` works anywhere and the baseline can be
started with `python bench/hf_trainer_baseline.py` or under torchrun (this folder is then
on sys.path).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
ASSETS = REPO / "training" / "assets"
CORPUS = ASSETS / "corpus.txt"

# Dense BF16 peak of one H100 SXM (no sparsity). Override with --peak-tflops.
H100_BF16_PEAK_FLOPS = 989e12
LR = 5e-4  # both implementations: the peak learning rate (linear decay)

# Required on the GPU machines (NVLink multicast / NVLS must stay off). Never remove.
REQUIRED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# The same model shapes as training/modeling.py's presets, restated so that --dry-run needs
# no installed package; tests/bench/test_run_dry.py keeps the two equal.
GPT2_SHAPES = {
    "tiny-gpt2": {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 512, "vocab_size": None},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50304},
    "gpt2-xl": {"n_layer": 48, "n_head": 25, "n_embd": 1600, "n_positions": 1024, "vocab_size": 50304},
}
# The llama-1b preset (Llama 3.2 1B's shapes), restated as above.
LLAMA_SHAPES = {
    "llama-1b": {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "max_position_embeddings": 2048,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "attention_bias": False,
        "mlp_bias": False,
    },
    # llama-8b (Llama 3.1 8B's shapes), restated likewise
    "llama-8b": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "attention_bias": False,
        "mlp_bias": False,
    },
}
SHIPPED_VOCAB = 746  # len() of the shipped tokenizer; tiny-gpt2 uses it as its vocabulary size

BERT_BASE = {
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "pad_token_id": 1,
}

LABELS = ("negative", "neutral", "positive")


# ---------------------------------------------------------------- FLOPs and MFU


def cuda_median_ms(fn, reps: int = 30, warmup: int = 5) -> float:
    """The median of `reps` timings of `fn()` on the current CUDA stream, in milliseconds, after
    `warmup` calls (CUDA events: the GPU's time, not the host's). Imports torch when called, so
    that this module stays importable without it."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return median(times) or 0.0


def gpt2_num_params(n_layer: int, n_embd: int, vocab_size: int, n_positions: int) -> int:
    """All parameters of GPT2LMHeadModel, embeddings included (lm_head is tied to wte)."""
    d = n_embd
    per_layer = 12 * d * d + 13 * d  # c_attn, attn c_proj, c_fc, mlp c_proj (+ biases), ln_1, ln_2
    return vocab_size * d + n_positions * d + n_layer * per_layer + 2 * d  # + ln_f


def llama_num_params(shape: dict) -> int:
    """All parameters of LlamaForCausalLM: q and o (d x d), k and v (d x kv), SwiGLU's three
    (d x I), two RMSNorms a layer, the final RMSNorm, the embeddings and, untied, the LM head."""
    d, inner = shape["hidden_size"], shape["intermediate_size"]
    kv = d * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * inner + 2 * d
    heads = 1 if shape.get("tie_word_embeddings", True) else 2
    return heads * shape["vocab_size"] * d + shape["num_hidden_layers"] * per_layer + d


def flops_per_token(n_params: int, n_layer: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N (forward + backward matmuls) + 12*L*d*T (attention scores).

    N is the TOTAL parameter count, embeddings included (a slight over-count of matmul work
    for the input embedding; the tied output projection is real work).
    """
    return 6.0 * n_params + 12.0 * n_layer * hidden * seq_len


def mfu(tokens_per_sec: float | None, fpt: float, num_gpus: int, peak_flops: float = H100_BF16_PEAK_FLOPS):
    if tokens_per_sec is None or num_gpus < 1:
        return None
    return tokens_per_sec * fpt / (peak_flops * num_gpus)


# ---------------------------------------------------------------- tokenizer and LM data


def load_tokenizer():
    """The shipped offline tokenizer, exactly as our trainer loads it."""
    from distrain_cloud.training.modeling import shipped_tokenizer

    return shipped_tokenizer()


def read_lines(path: Path) -> list[str]:
    """One document per line, as the `datasets` text builder reads a .txt file."""
    return Path(path).read_text(encoding="utf-8").splitlines()


def pack_blocks(lines: list[str], tokenizer, block: int, limit: int | None = None) -> list[list[int]]:
    """Our trainer's packing (training/data.py::_pack): doc + eos, concatenated, cut into blocks.

    With `limit`, stops once that many blocks are packed (the file's first blocks).
    """
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    blocks: list[list[int]] = []
    for s in range(0, len(lines), 2000):  # same map batches, same dropped tails
        if limit is not None and len(blocks) >= limit:
            break
        ids = tokenizer(lines[s : s + 2000], add_special_tokens=False)["input_ids"]
        stream = [t for doc in ids for t in (doc + [eos] if eos is not None else doc)]
        usable = len(stream) // block * block
        blocks += [stream[i : i + block] for i in range(0, usable, block)]
    return blocks


CORPUS_TOKENS_ESTIMATE = 44471  # tokens (with eos) in one copy of corpus.txt, shipped tokenizer


def corpus_repeats(
    needed_blocks: int, block: int, tokens_per_copy: int = CORPUS_TOKENS_ESTIMATE, train_fraction: float = 0.9
) -> int:
    """Copies of corpus.txt so that ONE epoch of our trainer's train split covers the run.

    One epoch matters: at an epoch end accelerate forces a gradient sync, which would cut
    accumulation short, and the loader restarts. 15% margin for the split and dropped tails.
    """
    per_copy = max(1e-9, train_fraction * tokens_per_copy / block)
    return max(1, math.ceil(needed_blocks * 1.15 / per_copy) + 1)


def write_repeated_corpus(path: Path, repeats: int) -> Path:
    text = CORPUS.read_text(encoding="utf-8")
    if not text.endswith("\n"):
        text += "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(repeats):
            f.write(text)
    return path


# The non-repeated corpus for loss comparisons: the Python standard library's own source, as the
# interpreter running the bench has it. The repeated corpus.txt is memorised within a few hundred
# steps (losses near 0.5), which magnifies numeric differences such as fp8's; this text is about
# 31 MB in 1,800 files (Python 3.11-3.12), about 24M tokens with the shipped tokenizer (code
# tokenizes at about 1.3 characters a token with its prose-trained 746-entry vocabulary).
STDLIB_CHARS_PER_TOKEN = 1.3


def stdlib_sources() -> list[Path]:
    """Every .py file of this interpreter's standard library (tests included), in sorted order;
    installed packages (site-packages) are not part of it."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts)


def write_stdlib_corpus(path: Path, max_chars: int | None = None) -> dict:
    """Write the standard library's source as one document per non-blank line (as the trainer's
    text loader reads a .txt file), file after file in sorted order, stopping after `max_chars`.
    Nothing repeats. Returns what was written (files, characters, Python version, sha256), so a
    result names the exact text."""
    import hashlib
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    digest, chars, files = hashlib.sha256(), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        for src in stdlib_sources():
            if max_chars is not None and chars >= max_chars:
                break
            text = src.read_text(encoding="utf-8", errors="replace")
            body = "".join(line.rstrip() + "\n" for line in text.splitlines() if line.strip())
            f.write(body)
            digest.update(body.encode("utf-8"))
            chars, files = chars + len(body), files + 1
    return {
        "corpus": "python-stdlib",
        "python": sys.version.split()[0],
        "files": files,
        "chars": chars,
        "tokens_estimate": int(chars / STDLIB_CHARS_PER_TOKEN),
        "sha256": digest.hexdigest(),
    }


def stdlib_chars_needed(tokens: int, train_fraction: float = 0.9) -> int:
    """Characters of stdlib text whose train split covers `tokens` once, with a 25% margin."""
    return int(tokens * STDLIB_CHARS_PER_TOKEN * 1.25 / train_fraction)


# ---------------------------------------------------------------- variable-length classification set

CHARS_PER_TOKEN = 4.39  # corpus.txt: 195283 chars / 44471 tokens with the shipped tokenizer
OPENERS = {
    "negative": ["It was a terrible day.", "Everything felt dull and broken.", "I regretted the whole trip."],
    "neutral": ["It was an ordinary day.", "Everything felt plain and usual.", "The trip was about average."],
    "positive": ["It was a wonderful day.", "Everything felt lovely and bright.", "I adored the whole trip."],
}


def varlen_examples(
    n: int,
    seed: int = 1234,
    median_tokens: float = 120.0,
    sigma: float = 0.7,
    max_tokens: int = 512,
    min_tokens: int = 8,
) -> list[dict]:
    """A realistic variable-length text-classification set: lengths ~ log-normal.

    Median ~120 tokens, mean ~150, p90 ~300; ~2% reach the 512-token cap (truncated at
    tokenization, as real long documents are). Text is sentences of the shipped corpus
    (in-distribution for the shipped tokenizer) after a label cue sentence; labels are 3
    classes. Deterministic in (n, seed).
    """
    rng = random.Random(seed)
    sentences = [s.strip() + "." for line in read_lines(CORPUS) for s in line.split(".") if s.strip()]
    out = []
    for _ in range(n):
        target = min(max_tokens * 1.1, max(min_tokens, rng.lognormvariate(math.log(median_tokens), sigma)))
        label = rng.choice(LABELS)
        parts = [rng.choice(OPENERS[label])]
        chars = len(parts[0])
        while chars < target * CHARS_PER_TOKEN:
            s = rng.choice(sentences)
            parts.append(s)
            chars += len(s) + 1
        text = " ".join(parts)
        text = text[: int(target * CHARS_PER_TOKEN)].rsplit(" ", 1)[0] if len(text) > 40 else text
        out.append({"text": text, "label": label})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def median(values: list[float]) -> float | None:
    return percentile(values, 0.5) if values else None


def kv_line(pairs: dict) -> str:
    def fmt(v):
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v).replace(" ", "_")

    return " ".join(f"{k}={fmt(v)}" for k, v in pairs.items())


def parse_kv(line: str) -> dict[str, str]:
    out = {}
    for tok in line.strip().split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            out[k] = v
    return out


# ---------------------------------------------------------------- our trainer's timing windows


def profiled_steps(text: str) -> tuple[int, int] | None:
    """The steps a --profile-steps run recorded, from its `profile_steps=A-B` line."""
    m = re.search(r"^profile_steps=(\d+)-(\d+)", text, re.MULTILINE)
    return (int(m.group(1)), int(m.group(2))) if m else None


def windows_of(rows: list[dict]) -> list[tuple[int, int, dict]]:
    """(first step, last step, row) of each logged window: the steps after the previous row's."""
    out, prev = [], 0
    for r in rows:
        out.append((prev, int(r["step"]), r))
        prev = int(r["step"])
    return out


def without_profiled(windows: list, profiled: tuple[int, int] | None) -> tuple[list, list]:
    """(kept, left out): --profile-steps slows the steps it records, so the windows holding them
    are left out of a median when others remain."""
    if not profiled:
        return windows, []
    clean = [w for w in windows if w[1] < profiled[0] or w[0] >= profiled[1]]
    if not clean or len(clean) == len(windows):
        return windows, []
    return clean, [w for w in windows if w not in clean]


def stop_process_tree(p: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the run `p` started with start_new_session=True (its process group: ours saves and
    exits), then SIGKILL whatever of its process tree still runs `grace_s` later. The tree, not the
    group: torchrun's workers lead sessions of their own, and a timed-out run's rank outlived the
    group's kill for 14 minutes, holding 8.8 GiB of a GPU."""
    if p.poll() is not None:
        return
    from distrain_cloud.training.stopping import ProcessTree  # lazily: this module stays torch-free

    tree = ProcessTree(p.pid)
    tree.refresh()  # while every process still hangs below the run
    try:  # the child leads its own session: signal exactly that group
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if not tree.wait_gone(grace_s):
        tree.kill()
    p.wait(timeout=20)
