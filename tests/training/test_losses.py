"""training/losses.py: the default head loss and the chunked one give torch's cross-entropy and its gradients (CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distrain_cloud.training.losses import IGNORE, fp8_head_why_not, fused_causal_lm_loss, head_loss

BATCH, SEQ, DIM, VOCAB = 3, 7, 16, 50


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(BATCH, SEQ, DIM, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(VOCAB, DIM, generator=g)).requires_grad_()
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return hidden, weight, input_ids


def reference(hidden: torch.Tensor, weight: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """What a causal LM computes: full logits, shifted by one, mean over the labels that count."""
    logits = hidden @ weight.t()
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1), ignore_index=IGNORE, reduction="mean"
    )


def loss_and_grads(loss_fn, hidden, weight, input_ids, scale: float = 1.0):
    loss = loss_fn(hidden, weight, input_ids)
    grad_hidden, grad_weight = torch.autograd.grad(scale * loss, (hidden, weight))
    return loss, grad_hidden, grad_weight


# 4 rows per chunk: the 18 label rows split into 4 + 4 + 4 + 4 + 2, so a partial last chunk is covered.
@pytest.mark.parametrize("chunk_rows", [4, 4096], ids=["chunked", "one-chunk"])
def test_loss_and_gradients_equal_cross_entropy(chunk_rows):
    hidden, weight, input_ids = inputs()
    input_ids[0, 3] = input_ids[2, 6] = IGNORE  # labels that must not count, in the mean or the gradients

    def fused(h, w, ids):
        return fused_causal_lm_loss(h, w, ids, dtype=torch.float32, chunk_rows=chunk_rows)

    # A scaled loss (as under gradient accumulation) checks that backward applies grad_output.
    got = loss_and_grads(fused, hidden, weight, input_ids, scale=0.25)
    want = loss_and_grads(reference, hidden, weight, input_ids, scale=0.25)
    for g, w, what in zip(got, want, ("loss", "d loss / d hidden", "d loss / d weight"), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=what)
    assert got[1][0, 2].abs().sum() == 0  # hidden state 2 predicts label 3, which is ignored


def test_bf16_compute_stays_close_and_gradients_keep_the_inputs_dtypes():
    hidden, weight, input_ids = inputs(seed=1)
    loss, grad_hidden, grad_weight = loss_and_grads(
        lambda h, w, ids: fused_causal_lm_loss(h, w, ids, dtype=torch.bfloat16, chunk_rows=5), hidden, weight, input_ids
    )
    assert loss.dtype == torch.float32  # accumulated in fp32 whatever the compute dtype
    assert grad_hidden.dtype == hidden.dtype and grad_weight.dtype == weight.dtype
    want_loss, want_hidden, want_weight = loss_and_grads(reference, hidden, weight, input_ids)
    torch.testing.assert_close(loss, want_loss, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(grad_hidden, want_hidden, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(grad_weight, want_weight, rtol=5e-2, atol=5e-3)


def test_a_batch_with_no_label_that_counts_gives_zero_not_nan():
    hidden, weight, input_ids = inputs(seed=2)
    input_ids[:, 1:] = IGNORE
    loss, grad_hidden, grad_weight = loss_and_grads(
        lambda h, w, ids: fused_causal_lm_loss(h, w, ids, dtype=torch.float32), hidden, weight, input_ids
    )
    assert loss.item() == 0.0  # torch's mean over no labels is nan
    assert grad_hidden.abs().sum() == 0 and grad_weight.abs().sum() == 0


# ---------------------------------------------------------------- head_loss (the default)


def head(h, w, ids):
    return head_loss(h, w, ids)


def test_head_loss_and_its_gradients_equal_cross_entropy():
    hidden, weight, input_ids = inputs()
    input_ids[0, 3] = input_ids[2, 6] = IGNORE
    got = loss_and_grads(head, hidden, weight, input_ids, scale=0.25)  # grad_output reaches both GEMMs
    want = loss_and_grads(reference, hidden, weight, input_ids, scale=0.25)
    for g, w, what in zip(got, want, ("loss", "d loss / d hidden", "d loss / d weight"), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=what)
    assert got[1][0, 2].abs().sum() == 0 and got[1][:, -1].abs().sum() == 0  # ignored, and no next label


def test_head_loss_under_bf16_autocast_computes_in_bf16_and_keeps_the_inputs_dtypes():
    hidden, weight, input_ids = inputs(seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grad_hidden, grad_weight = loss_and_grads(head, hidden, weight, input_ids)
    assert loss.dtype == torch.float32 and grad_hidden.dtype == grad_weight.dtype == torch.float32
    want = loss_and_grads(reference, hidden, weight, input_ids)
    exact = loss_and_grads(head, hidden, weight, input_ids)
    torch.testing.assert_close(loss, want[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(grad_weight, want[2], rtol=5e-2, atol=5e-3)
    assert not torch.equal(grad_weight, exact[2])  # bf16 rounding shows: autocast's dtype was used


@pytest.mark.slow  # Inductor compiles a forward and a backward (about 4 s)
def test_head_loss_compiled_gives_the_eager_values():
    hidden, weight, input_ids = inputs(seed=3)
    input_ids[1, 2] = IGNORE
    torch._dynamo.reset()
    compiled = torch.compile(head, fullgraph=True)  # one graph: the custom op does not break it
    got = loss_and_grads(compiled, hidden, weight, input_ids, scale=3.0)
    want = loss_and_grads(head, hidden, weight, input_ids, scale=3.0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_head_loss_with_no_label_that_counts_gives_zero_not_nan():
    hidden, weight, input_ids = inputs(seed=2)
    input_ids[:, 1:] = IGNORE
    loss, grad_hidden, grad_weight = loss_and_grads(head, hidden, weight, input_ids)
    assert loss.item() == 0.0
    assert grad_hidden.abs().sum() == 0 and grad_weight.abs().sum() == 0


# ---------------------------------------------------------------- --fp8-head (torch._scaled_mm, on CPU too)

FP8_VOCAB = 64  # _scaled_mm's sizes: multiples of 16 (the 3 x 7 rows are padded to 32 inside)


def fp8_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(BATCH, SEQ, DIM, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(FP8_VOCAB, DIM, generator=g)).requires_grad_()
    return hidden, weight, torch.randint(0, FP8_VOCAB, (BATCH, SEQ), generator=g)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


@pytest.mark.parametrize("accum", ["exact", "fast"])
def test_the_fp8_head_stays_close_to_cross_entropy_and_keeps_the_inputs_dtypes(accum):
    hidden, weight, input_ids = fp8_inputs(seed=4)
    input_ids[0, 3] = IGNORE

    def fp8_head(h, w, ids):
        return head_loss(h, w, ids, fp8=accum)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss_and_grads(fp8_head, hidden, weight, input_ids, scale=0.25)
        bf16 = loss_and_grads(head, hidden, weight, input_ids, scale=0.25)
    want = loss_and_grads(lambda h, w, ids: reference_of(h, w, ids, FP8_VOCAB), hidden, weight, input_ids, scale=0.25)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.float32
    assert got[1].shape == hidden.shape  # the padding rows leave with the backward
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    assert cosine(got[1], want[1]) > 0.99 and cosine(got[2], want[2]) > 0.99  # e4m3/e5m2: 3 and 2 mantissa bits
    assert got[1][0, 2].abs().sum() == 0 and got[1][:, -1].abs().sum() == 0  # ignored, and no next label
    assert not torch.equal(got[2], bf16[2])  # float8's rounding shows: the float8 path ran


def test_the_fp8_heads_input_gradient_in_bf16_leaves_the_loss_and_weight_gradient_as_they_were():
    """--fp8-head-grad-input bf16: the forward and the weight's gradient are the float8 head's, to
    the bit; the input's gradient, the one every block receives, is the logits' gradient times the
    bf16 weight, nearer the exact one than e5m2's."""
    hidden, weight, input_ids = fp8_inputs(seed=7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp8 = loss_and_grads(lambda h, w, ids: head_loss(h, w, ids, fp8="exact"), hidden, weight, input_ids)
        gi = loss_and_grads(
            lambda h, w, ids: head_loss(h, w, ids, fp8="exact+bf16-grad-input"), hidden, weight, input_ids
        )
    want = loss_and_grads(lambda h, w, ids: reference_of(h, w, ids, FP8_VOCAB), hidden, weight, input_ids)
    assert torch.equal(gi[0], fp8[0]) and torch.equal(gi[2], fp8[2])
    assert gi[1].dtype == torch.float32 and gi[1].shape == hidden.shape
    assert not torch.equal(gi[1], fp8[1])
    assert 1 - cosine(gi[1], want[1]) < (1 - cosine(fp8[1], want[1])) / 2


def test_the_fp8_heads_forward_in_bf16_gives_the_bf16_heads_loss_and_float8_gradients():
    """--fp8-head-forward bf16: the logits, and with them the loss and the logits' gradient, are the
    bf16 head's to the bit; the backward's two matmuls run in float8. With the input gradient in
    bf16 too, only the weight's gradient is float8's."""
    hidden, weight, input_ids = fp8_inputs(seed=8)

    def fp8_head(options: str):
        return lambda h, w, ids: head_loss(h, w, ids, fp8=f"exact{options}")

    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = loss_and_grads(head, hidden, weight, input_ids)
        fp8 = loss_and_grads(fp8_head(""), hidden, weight, input_ids)
        fw = loss_and_grads(fp8_head("+bf16-forward"), hidden, weight, input_ids)
        both = loss_and_grads(fp8_head("+bf16-forward+bf16-grad-input"), hidden, weight, input_ids)
    want = loss_and_grads(lambda h, w, ids: reference_of(h, w, ids, FP8_VOCAB), hidden, weight, input_ids)
    assert torch.equal(fw[0], bf16[0]) and not torch.equal(fp8[0], bf16[0])
    assert not torch.equal(fw[1], bf16[1]) and not torch.equal(fw[2], bf16[2])  # the float8 backward ran
    assert fw[1].dtype == fw[2].dtype == torch.float32 and fw[1].shape == hidden.shape
    assert cosine(fw[1], want[1]) > 0.99 and cosine(fw[2], want[2]) > 0.99
    assert torch.equal(both[0], bf16[0]) and torch.equal(both[1], bf16[1])  # the bf16 head's input gradient
    assert torch.equal(both[2], fw[2])  # the weight's gradient: float8's, from the same bf16 logits


def test_the_fp8_heads_backward_in_bf16_keeps_the_float8_loss_and_the_bf16_heads_matmuls():
    """--fp8-head-backward bf16: the loss is the float8 head's to the bit (the same forward); the two
    gradients are the bf16 head's matmuls on the logits' gradient that forward leaves, so they are
    nearer the exact ones than the float8 backward's."""
    hidden, weight, input_ids = fp8_inputs(seed=9)

    def fp8_head(options: str):
        return lambda h, w, ids: head_loss(h, w, ids, fp8=f"exact{options}")

    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp8 = loss_and_grads(fp8_head(""), hidden, weight, input_ids)
        bw = loss_and_grads(fp8_head("+bf16-backward"), hidden, weight, input_ids)
    want = loss_and_grads(lambda h, w, ids: reference_of(h, w, ids, FP8_VOCAB), hidden, weight, input_ids)
    assert torch.equal(bw[0], fp8[0])
    assert bw[1].dtype == bw[2].dtype == torch.float32 and bw[1].shape == hidden.shape
    for got, float8, exact in zip(bw[1:], fp8[1:], want[1:], strict=True):
        assert not torch.equal(got, float8)
        assert 1 - cosine(got, exact) < (1 - cosine(float8, exact)) / 2


def reference_of(hidden, weight, input_ids, vocab):
    logits = hidden @ weight.t()
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), input_ids[:, 1:].reshape(-1), ignore_index=IGNORE, reduction="mean"
    )


def test_the_fp8_head_with_no_label_that_counts_gives_zero_not_nan():
    hidden, weight, input_ids = fp8_inputs(seed=5)
    input_ids[:, 1:] = IGNORE  # every gradient zero: the scale of an all-zero tensor must stay finite
    loss, grad_hidden, grad_weight = loss_and_grads(
        lambda h, w, ids: head_loss(h, w, ids, fp8="exact"), hidden, weight, input_ids
    )
    assert loss.item() == 0.0
    assert grad_hidden.abs().sum() == 0 and grad_weight.abs().sum() == 0


@pytest.mark.slow  # Inductor compiles a forward and a backward
@pytest.mark.parametrize("fp8", ["exact", "exact+bf16-forward", "exact+bf16-backward"])
def test_the_fp8_head_compiled_gives_the_eager_values(fp8):
    hidden, weight, input_ids = fp8_inputs(seed=6)
    torch._dynamo.reset()

    def fp8_head(h, w, ids):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return head_loss(h, w, ids, fp8=fp8)

    got = loss_and_grads(torch.compile(fp8_head, fullgraph=True), hidden, weight, input_ids, scale=3.0)
    want = loss_and_grads(fp8_head, hidden, weight, input_ids, scale=3.0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)
    torch._dynamo.reset()


def test_fp8_head_sizes_must_be_multiples_of_16():
    assert fp8_head_why_not(2048, 128256) is None
    assert fp8_head_why_not(2048, 50257) == (
        "its hidden size (2048) and vocabulary (50257) must both be multiples of 16"
    )


INTERPRETED_KERNEL_CHECK = """
import torch
from distrain_cloud.training import ce_kernel
from distrain_cloud.training.losses import IGNORE, cross_entropy_grad_

g = torch.Generator().manual_seed(4)
for dtype, atol in ((torch.float32, 1e-6), (torch.bfloat16, 2e-3)):
    logits = (3 * torch.randn(6, 300, generator=g)).to(dtype)
    targets = torch.randint(0, 300, (6,), generator=g)
    targets[1] = IGNORE
    mine, ref = logits.clone(), logits.clone()
    # A block smaller than a row, and a row that is not a multiple of it: the loops and the mask.
    loss = ce_kernel.cross_entropy_grad_(mine, targets, block=128, warps=4)
    want = cross_entropy_grad_(ref, targets)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mine, ref, rtol=0, atol=atol)
    assert mine[1].abs().sum() == 0
print("kernel ok")
"""


@pytest.mark.slow  # a fresh interpreter: Triton reads TRITON_INTERPRET when it is imported
def test_the_cuda_kernel_agrees_with_the_reference_in_tritons_interpreter():
    """The Triton kernel run by Triton's CPU interpreter, where Triton is installed (CUDA machines
    check it at GPT-2's shapes with bench/loss_kernel.py)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", INTERPRETED_KERNEL_CHECK], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "kernel ok" in done.stdout, done.stderr[-3000:]
