"""What each task trains on and how it is scored: causal-lm, masked-lm and classification's
training loss, evaluation values and metrics. The trainer's loop is the same for all three."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .args import TrainArgs
from .losses import fused_causal_lm_loss, liger_causal_lm_loss
from .strategies import Precision

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def training_loss(model: Any, unwrapped: Any, batch: Any, args: TrainArgs, tokenizer: Any, seed: tuple, compiled: bool):
    """The micro-batch's loss through `model` (the wrapped one: DDP needs its forward); `seed`
    keys masked-lm's masking, `unwrapped` holds the LM head --fused-ce reads."""
    if args.task == "masked-lm":
        batch = mask_tokens(batch, tokenizer, args.mlm_probability, seed)
    elif args.task == "causal-lm":
        if args.fused_ce:
            return _fused_lm_loss(model, unwrapped, batch["input_ids"], args, compiled)
        batch = {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
    return model(**batch).loss


def _fused_lm_loss(model: Any, unwrapped: Any, input_ids: Any, args: TrainArgs, compiled: bool):
    # Through the wrapped model (DDP needs its forward), with logits for one position
    # only; the LM head and loss run chunked in losses.py.
    out = model(input_ids=input_ids, output_hidden_states=True, logits_to_keep=1)
    head = unwrapped.get_output_embeddings().weight
    # the autocast's dtype: bf16 under fp8 (fp8.py converts only the blocks' linear layers)
    dtype = DTYPES.get(Precision(args.precision).autocast if args.precision else "", torch.float32)
    if args.ce_kernel == "liger":
        return liger_causal_lm_loss(out.hidden_states[-1], head, input_ids, dtype=dtype)
    return fused_causal_lm_loss(out.hidden_states[-1], head, input_ids, dtype=dtype, compile_=compiled)


def mask_tokens(batch: Any, tokenizer: Any, probability: float, seed: tuple) -> dict[str, Any]:
    """MLM masking from a generator keyed on (seed, step, ...): deterministic, so resume
    is exact, and independent of the data loader's prefetching."""
    ids = batch["input_ids"]
    g = torch.Generator(device="cpu").manual_seed(hash(seed) & 0x7FFF_FFFF)
    probs = torch.rand(ids.shape, generator=g).to(ids.device)
    special = torch.zeros_like(ids, dtype=torch.bool)
    for tid in tokenizer.all_special_ids:
        special |= ids == tid
    masked = (probs < probability) & ~special
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    # BERT's 80/10/10: mask, random token, unchanged.
    choice = torch.rand(ids.shape, generator=g).to(ids.device)
    inputs = torch.where(masked & (choice < 0.8), torch.full_like(ids, tokenizer.mask_token_id), ids)
    random_ids = torch.randint(len(tokenizer), ids.shape, generator=g).to(ids.device)
    inputs = torch.where(masked & (choice >= 0.8) & (choice < 0.9), random_ids, inputs)
    return {"input_ids": inputs, "labels": labels}


def eval_batch(batch: Any, args: TrainArgs, tokenizer: Any, seed: tuple) -> Any:
    """An evaluation batch with its labels (masked-lm: masked by `seed`, as in training)."""
    if args.task == "masked-lm":
        return mask_tokens(batch, tokenizer, args.mlm_probability, seed)
    if args.task == "causal-lm":
        return {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
    return batch


def eval_values(task: str, logits: Any, labels: Any) -> dict[str, Any]:
    """Per sample, what the metrics are summed from: each sample's loss, prediction and label
    (classification), or its summed token loss and token count (language models)."""
    if task == "classification":
        loss = F.cross_entropy(logits, labels, reduction="none")
        return {"loss": loss, "pred": logits.argmax(-1), "label": labels}
    if task == "causal-lm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    tok = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100)
    return {"sum": tok.sum(1), "count": (labels != -100).sum(1)}


def eval_metrics(task: str, cat: dict[str, Any], num_labels: int) -> dict[str, float]:
    """The evaluation's metrics from every process's eval_values, concatenated."""
    if task == "classification":
        return {
            "eval_loss": cat["loss"].double().mean().item(),
            "eval_accuracy": (cat["pred"] == cat["label"]).double().mean().item(),
            "eval_f1_macro": macro_f1(cat["pred"], cat["label"], num_labels),
            "eval_samples": float(len(cat["label"])),
        }
    mean = (cat["sum"].double().sum() / cat["count"].sum().clamp(min=1)).item()
    return {
        "eval_loss": mean,
        "eval_perplexity": math.exp(min(mean, 50.0)),
        "eval_samples": float(len(cat["sum"])),
    }


def macro_f1(pred, label, num_classes: int) -> float:
    scores = []
    for c in range(num_classes):
        tp = ((pred == c) & (label == c)).sum().item()
        fp = ((pred == c) & (label != c)).sum().item()
        fn = ((pred != c) & (label == c)).sum().item()
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores) if scores else 0.0
