"""Baseline: plain `transformers.Trainer` on the same model, data and shapes as our trainer.

    python bench/hf_trainer_baseline.py [--compile] [--batch-size 16] [--seq-len 1024] ...
    torchrun --standalone --nproc_per_node N bench/hf_trainer_baseline.py ...   # several GPUs
    python bench/hf_trainer_baseline.py --tiny --steps 3                        # CPU smoke test

Causal LM (default): GPT-2-small shape from config (random weights, vocab 50304, n_positions
1024), SDPA attention, bf16 autocast, fused AdamW, on blocks packed from the repo's
training/assets/corpus.txt with the shipped tokenizer, exactly as our trainer packs them
(`--data-file` to use another .txt, e.g. the repeated copy run.py writes).

Classification (`--mode classification`): GPT-2-small (or `--cls-model bert-base`) sequence
classification on a variable-length text set (`--data-file` jsonl with text,label; else the
same synthetic set run.py writes), padded to max_length as Trainer users commonly do.

Timing: a TrainerCallback synchronizes the device and reads perf_counter at on_step_begin /
on_step_end. `--warmup-steps` steps run first and are not timed; `--steps` are timed.
Prints one final line:

    bench=hf_trainer variant=defaults|compile[+liger] tokens_per_sec=... step_time_ms=... mfu=... peak_mem_gb=... ...

tokens_per_sec   global tokens / wall time from the end of the last warmup step to the end of
                 the last step (data loading, logging and everything between steps included;
                 what our trainer's per-window tokens_per_sec also measures)
tokens_per_sec_step  the same tokens over the summed on_step_begin..on_step_end time only
step_time_ms     median on_step_begin..on_step_end time of one optimizer step
mfu              tokens_per_sec * (6N + 12*L*d*T) / (peak_flops * gpus), N = ALL parameters
                 including embeddings (mfu_params=total_incl_embeddings); peak 989 TFLOP/s
                 (H100 SXM dense BF16) unless --peak-tflops
peak_mem_gb      torch.cuda.max_memory_allocated, GiB, max over ranks
Classification adds nonpad_tokens_per_sec (= tokens_per_sec), padded_tokens_per_sec, pad_frac;
its mfu is n/a (FLOPs per token depend on each sequence's length).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("lm", "classification"), default="lm")
    p.add_argument(
        "--cls-model", choices=("gpt2-small", "bert-base"), default="gpt2-small", help="classification model shape"
    )
    p.add_argument(
        "--model", choices=("gpt2-small", "gpt2-xl", "llama-1b"), default="gpt2-small", help="LM model shape"
    )
    p.add_argument("--compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    p.add_argument(
        "--liger",
        action="store_true",
        help="TrainingArguments(use_liger_kernel=True): Liger's Triton kernels patched into the model (RMSNorm, "
        "RoPE, SwiGLU and the fused linear cross-entropy that never holds the logits); needs liger-kernel and a GPU",
    )
    p.add_argument("--optim", default="adamw_torch_fused")
    p.add_argument("--steps", type=int, default=None, help="timed optimizer steps (default 60; 3 with --tiny)")
    p.add_argument(
        "--warmup-steps", type=int, default=None, help="untimed optimizer steps run first (default 10; 1 with --tiny)"
    )
    p.add_argument("--batch-size", type=int, default=None, help="per device micro-batch (default 16; 4 with --tiny)")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="LM block size / classification max_length (default 1024 lm, 512 classification, 64 tiny)",
    )
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument(
        "--precision", choices=("bf16", "fp16", "fp32"), default=None, help="default bf16 (fp32 with --tiny)"
    )
    p.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, ...)")
    p.add_argument(
        "--tf32",
        action="store_true",
        help="TrainingArguments(tf32=True); off = the Trainer default (our trainer turns TF32 on)",
    )
    p.add_argument("--data-file", help="lm: a .txt (one document per line); classification: a .jsonl (text,label)")
    p.add_argument(
        "--num-examples",
        type=int,
        default=None,
        help="classification without --data-file: size of the synthetic set (default: enough for the run)",
    )
    p.add_argument("--lr", type=float, default=lib.LR)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--peak-tflops", type=float, default=lib.H100_BF16_PEAK_FLOPS / 1e12)
    p.add_argument(
        "--no-sync", action="store_true", help="do not torch.cuda.synchronize() in the timing callback (on by default)"
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke test: 2 layers, 64 hidden, seq 64, fp32, 3 steps (tiny-gpt2 preset shape)",
    )
    a = p.parse_args(argv)
    tiny = a.tiny
    if a.steps is None:
        a.steps = 3 if tiny else 60
    if a.warmup_steps is None:
        a.warmup_steps = 1 if tiny else 10
    if a.batch_size is None:
        a.batch_size = 4 if tiny else 16
    if a.seq_len is None:
        a.seq_len = 64 if tiny else (1024 if a.mode == "lm" else 512)
    if a.precision is None:
        a.precision = "fp32" if tiny else "bf16"
    if a.liger and (a.mode != "lm" or a.model != "llama-1b" or tiny):
        # Liger has no kernels for GPT-2 or BERT: the Trainer would run without them, under Liger's name
        p.error("--liger applies to --model llama-1b (Liger's kernels are for Llama-style models)")
    if a.steps < 1 or a.warmup_steps < 0 or a.batch_size < 1 or a.grad_accum < 1 or a.seq_len < 2:
        p.error("--steps, --batch-size, --grad-accum must be >= 1, --warmup-steps >= 0, --seq-len >= 2")
    return a


# ---------------------------------------------------------------- model


def build_model(a, tokenizer, num_labels: int | None):
    import torch
    import transformers
    from transformers import BertConfig, GPT2Config

    torch.manual_seed(a.seed)
    if a.mode == "classification" and a.cls_model == "bert-base":
        cfg = dict(lib.BERT_BASE)
        cfg.pop("model_type")
        config = BertConfig(**cfg, num_labels=num_labels)
        if a.tiny:
            config = BertConfig(
                vocab_size=len(tokenizer),
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=128,
                max_position_embeddings=512,
                pad_token_id=tokenizer.pad_token_id,
                num_labels=num_labels,
            )
        auto = transformers.BertForSequenceClassification
        shape = {"n_layer": config.num_hidden_layers, "n_embd": config.hidden_size}
    elif a.mode == "lm" and a.model in lib.LLAMA_SHAPES and not a.tiny:
        # the llama-1b preset's config, as our trainer builds it (training/modeling.py)
        config = transformers.LlamaConfig(
            **lib.LLAMA_SHAPES[a.model],
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        auto = transformers.LlamaForCausalLM
        shape = {"n_layer": config.num_hidden_layers, "n_embd": config.hidden_size}
    else:
        shape = dict(lib.GPT2_SHAPES["tiny-gpt2" if a.tiny else (a.model if a.mode == "lm" else "gpt2-small")])
        if shape["vocab_size"] is None:
            shape["vocab_size"] = len(tokenizer)
        config = GPT2Config(
            **shape,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        if num_labels:
            config.num_labels = num_labels
        auto = transformers.GPT2ForSequenceClassification if num_labels else transformers.GPT2LMHeadModel
    model = (
        auto._from_config(config, attn_implementation=a.attn)
        if hasattr(auto, "_from_config")
        else auto.from_config(config, attn_implementation=a.attn)
    )
    if a.seq_len > getattr(config, "n_positions", getattr(config, "max_position_embeddings", a.seq_len)):
        raise SystemExit(f"error: --seq-len {a.seq_len} exceeds the model's positions")
    return model, shape


# ---------------------------------------------------------------- data


class Blocks:
    """Fixed-length token blocks, cycled to `length` items (the corpus repeated as needed)."""

    def __init__(self, tensors: dict, length: int):
        self.tensors, self.n = tensors, next(iter(tensors.values())).shape[0]
        self.length = max(length, self.n)

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % self.n
        return {k: v[j] for k, v in self.tensors.items()}


def build_lm_data(a, tokenizer, needed: int):
    import torch

    path = Path(a.data_file) if a.data_file else lib.CORPUS
    # Only as many blocks as the run consumes are tokenized (the file's first ones); fewer are cycled.
    blocks = lib.pack_blocks(lib.read_lines(path), tokenizer, a.seq_len, limit=needed)
    if not blocks:
        raise SystemExit(f"error: {path} holds no full block of {a.seq_len} tokens")
    ids = torch.tensor(blocks, dtype=torch.long)
    return Blocks({"input_ids": ids, "labels": ids}, needed), {"data": str(path), "blocks": len(blocks)}


def build_cls_data(a, tokenizer, needed: int):
    import torch

    if a.data_file:
        rows = lib.read_jsonl(Path(a.data_file))
        source = a.data_file
    else:
        rows = lib.varlen_examples(a.num_examples or max(needed, 256))
        source = "synthetic"
    label_of = {n: i for i, n in enumerate(sorted({str(r["label"]) for r in rows}))}
    enc = tokenizer(
        [r["text"] for r in rows], truncation=True, max_length=a.seq_len, padding="max_length", return_tensors="pt"
    )
    tensors = {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "labels": torch.tensor([label_of[str(r["label"])] for r in rows], dtype=torch.long),
    }
    lengths = enc["attention_mask"].sum(1).double()
    info = {
        "data": source,
        "examples": len(rows),
        "len_median": float(lengths.median()),
        "len_mean": float(lengths.mean()),
        "len_max": int(lengths.max()),
    }
    return Blocks(tensors, needed), info, len(label_of)


# ---------------------------------------------------------------- timing


def make_timer(a, counters):
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()

    def sync():
        if cuda and not a.no_sync:
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.step_times: list[float] = []
            self.t_begin = None
            self.wall_start = self.wall_end = None
            self.tokens_start = self.tokens_end = None

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step >= a.warmup_steps:
                sync()
                self.t_begin = time.perf_counter()
                if self.wall_start is None:  # --warmup-steps 0: start at the first step
                    self.wall_start, self.tokens_start = self.t_begin, counters.snapshot()

        def on_step_end(self, args, state, control, **kw):
            step = state.global_step  # optimizer steps completed
            if step < a.warmup_steps:
                return
            sync()
            now = time.perf_counter()
            if step == a.warmup_steps:
                self.wall_start, self.tokens_start = now, counters.snapshot()
                return
            if self.t_begin is not None:
                self.step_times.append(now - self.t_begin)
            if step == a.warmup_steps + a.steps:
                self.wall_end, self.tokens_end = now, counters.snapshot()

    return StepTimer()


class Counters:
    """Tokens fed to training_step, kept on the device (no sync per step)."""

    def __init__(self):
        self.real = 0
        self.total = 0

    def add(self, inputs):
        ids = inputs["input_ids"]
        self.total += ids.numel()
        mask = inputs.get("attention_mask")
        self.real = self.real + (mask.sum() if mask is not None else ids.numel())

    def snapshot(self):
        real = self.real.item() if hasattr(self.real, "item") else self.real
        return (float(real), float(self.total))


def training_arguments(a, out_dir: str, total_steps: int):
    import torch
    from transformers import TrainingArguments

    kwargs = dict(
        output_dir=out_dir,
        max_steps=total_steps,
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum,
        learning_rate=a.lr,
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        lr_scheduler_type="linear",
        warmup_steps=0,
        optim=a.optim,
        bf16=a.precision == "bf16",
        fp16=a.precision == "fp16",
        torch_compile=a.compile,
        use_liger_kernel=a.liger,
        tf32=True if a.tf32 and torch.cuda.is_available() else None,
        logging_strategy="steps",
        logging_steps=total_steps + 1,  # no mid-run logging syncs
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=a.num_workers,
        remove_unused_columns=False,
        seed=a.seed,
        use_cpu=not torch.cuda.is_available(),
    )
    accepted = set(inspect.signature(TrainingArguments.__init__).parameters)
    dropped = sorted(k for k in kwargs if k not in accepted)
    if a.liger and "use_liger_kernel" in dropped:  # asked for: a baseline without it would be mislabelled
        raise SystemExit("error: --liger: this transformers' TrainingArguments has no use_liger_kernel")
    if dropped:
        print(f"note: this transformers' TrainingArguments has no {', '.join(dropped)}; left out", file=sys.stderr)
    return TrainingArguments(**{k: v for k, v in kwargs.items() if k in accepted})


# ---------------------------------------------------------------- main


def model_name(a) -> str:
    if a.mode == "classification":
        return (
            ("tiny-" if a.tiny else "")
            + a.cls_model.split("-")[0]
            + ("" if a.tiny else "-" + a.cls_model.split("-")[1])
        )
    return "tiny-gpt2" if a.tiny else a.model


def main(argv=None) -> None:
    a = parse_args(argv)
    import torch
    import torch.distributed as dist
    import transformers
    from transformers import Trainer, default_data_collator

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    if a.precision != "fp32" and not cuda and not a.tiny:
        print(f"note: no CUDA device; running {a.precision} autocast on CPU", file=sys.stderr)
    tokenizer = lib.load_tokenizer()
    total_steps = a.warmup_steps + a.steps
    needed = total_steps * a.batch_size * a.grad_accum * world + a.batch_size * world  # + loader lookahead
    num_labels = None
    if a.mode == "lm":
        data, info = build_lm_data(a, tokenizer, needed)
    else:
        data, info, num_labels = build_cls_data(a, tokenizer, needed)
    model, shape = build_model(a, tokenizer, num_labels)
    n_params = sum(p.numel() for p in model.parameters())
    counters = Counters()

    class BenchTrainer(Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            counters.add(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

    timer = make_timer(a, counters)
    with tempfile.TemporaryDirectory(prefix="hf-baseline-") as out_dir:
        targs = training_arguments(a, out_dir, total_steps)
        trainer = BenchTrainer(
            model=model, args=targs, train_dataset=data, data_collator=default_data_collator, callbacks=[timer]
        )
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()

    if timer.wall_end is None or timer.wall_start is None:
        raise SystemExit(f"error: timing incomplete (steps run: {trainer.state.global_step}, expected {total_steps})")
    elapsed = timer.wall_end - timer.wall_start
    step_sum = sum(timer.step_times)
    real = timer.tokens_end[0] - timer.tokens_start[0]
    total = timer.tokens_end[1] - timer.tokens_start[1]
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    reserved = torch.cuda.max_memory_reserved() / 2**30 if cuda else None
    if dist.is_available() and dist.is_initialized() and world > 1:
        dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        sums = torch.tensor([real, total], dtype=torch.float64, device=dev)
        dist.all_reduce(sums)
        real, total = sums.tolist()
        if cuda:
            mem = torch.tensor([peak, reserved], dtype=torch.float64, device=dev)
            dist.all_reduce(mem, op=dist.ReduceOp.MAX)
            peak, reserved = mem.tolist()
    if rank != 0:
        return
    tps = real / elapsed
    line = {
        "bench": "hf_trainer",
        "variant": ("compile" if a.compile else "defaults") + ("+liger" if a.liger else ""),
        "mode": a.mode,
        "model": model_name(a),
        "tokens_per_sec": tps,
        "tokens_per_sec_step": real / step_sum if step_sum else None,
        "step_time_ms": 1000 * lib.median(timer.step_times) if timer.step_times else None,
        "mfu": None,
        "peak_mem_gb": peak,
        "peak_mem_reserved_gb": reserved,
        "gpus": world if cuda else 0,
    }
    if a.mode == "lm":
        fpt = lib.flops_per_token(n_params, shape["n_layer"], shape["n_embd"], a.seq_len)
        line["mfu"] = lib.mfu(tps, fpt, max(1, world), a.peak_tflops * 1e12)
    else:
        line.update(
            nonpad_tokens_per_sec=tps,
            padded_tokens_per_sec=total / elapsed,
            pad_frac=1.0 - real / total if total else None,
        )
    line.update(
        mfu_params="total_incl_embeddings",
        n_params=n_params,
        seq_len=a.seq_len,
        batch_size=a.batch_size,
        grad_accum=a.grad_accum,
        steps=a.steps,
        warmup_steps=a.warmup_steps,
        precision=a.precision,
        tf32=a.tf32,
        liger=a.liger,
        attn=model.config._attn_implementation,
        optim=a.optim,
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        torch=torch.__version__,
        transformers=transformers.__version__,
        peak_tflops=a.peak_tflops,
        **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in info.items() if k != "data"},
    )
    print(f"data={info['data']}", flush=True)
    print(lib.kv_line(line), flush=True)


if __name__ == "__main__":
    main()
