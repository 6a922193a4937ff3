"""The LM head and its loss alone, on one GPU: the model's own loss (transformers' ForCausalLMLoss
after the head, compiled, as `--lm-loss model` runs it) against losses.head_loss (`--lm-loss
fast`, the default), at GPT-2 small's training shapes under bf16 autocast. Prints milliseconds per
forward+backward, peak memory, and how far the two agree; also the Triton kernel alone at a few
block sizes. Run on a CUDA machine with distrain_cloud importable (pip install -e .):

    python bench/loss_kernel.py [--batch 16 --seq 1024 --dim 768 --vocab 50304]
"""

from __future__ import annotations

import argparse

import torch
from _benchlib import cuda_median_ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    a = p.parse_args()
    from transformers.loss.loss_utils import ForCausalLMLoss

    from distrain_cloud.training.ce_kernel import cross_entropy_grad_
    from distrain_cloud.training.losses import IGNORE, head_loss

    torch.manual_seed(0)
    dev = "cuda"
    hidden = torch.randn(a.batch, a.seq, a.dim, device=dev, requires_grad=True)
    weight = (0.02 * torch.randn(a.vocab, a.dim, device=dev)).requires_grad_()
    labels = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    labels[0, :7] = IGNORE

    def own(h, w, y):
        return ForCausalLMLoss(h @ w.t(), y, a.vocab)

    results = {}
    for name, fn in (("model", own), ("fast", head_loss)):
        compiled = torch.compile(fn)

        def step(compiled=compiled):
            hidden.grad = weight.grad = None
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = compiled(hidden, weight, labels)
            loss.backward()
            return loss

        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        results[name] = (loss.detach().clone(), hidden.grad.clone(), weight.grad.clone())
        ms = cuda_median_ms(step)
        print(f"{name}: {ms:.3f} ms forward+backward (head GEMMs included), peak above inputs {peak:.2f} GiB")
    (l0, h0, w0), (l1, h1, w1) = results["model"], results["fast"]
    rel = lambda x, y: ((x - y).norm() / y.norm()).item()  # noqa: E731
    print(f"agreement: loss {l1.item():.6f} vs {l0.item():.6f}; relative difference", end=" ")
    print(f"d/dhidden {rel(h1, h0):.2e}, d/dweight {rel(w1, w0):.2e}")

    logits = torch.randn(a.batch * a.seq, a.vocab, device=dev, dtype=torch.bfloat16) * 2
    targets = labels.reshape(-1)
    ref = torch.compile(lambda x, t: torch.nn.functional.cross_entropy(x.float(), t, ignore_index=IGNORE))
    x = logits.clone().requires_grad_()
    ms = cuda_median_ms(lambda: ref(x, targets).backward())
    print(f"compiled cross_entropy over bf16 logits, forward+backward: {ms:.3f} ms")
    for block, warps in ((2048, 8), (4096, 8), (4096, 16), (8192, 16), (8192, 32)):
        buf = logits.clone()
        ms = cuda_median_ms(
            lambda buf=buf, b=block, w=warps: cross_entropy_grad_(buf.copy_(logits), targets, block=b, warps=w)
        )
        copy = cuda_median_ms(lambda buf=buf: buf.copy_(logits))
        print(f"kernel block={block} warps={warps}: {ms - copy:.3f} ms (less the logits' copy first: {copy:.3f} ms)")


if __name__ == "__main__":
    main()
