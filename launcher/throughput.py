"""Training throughput per GPU, for `instances --fit`'s cost per token: measured where a run
measured the job's very configuration, else estimated from the card's published rates.

The estimate is a two-term roofline, one per token of a job whose model does F training FLOPs a
token (6N + 12 L d T, as the bench counts them) with hidden size d, on a card of dense 16-bit
matrix rate P and memory bandwidth W:

    seconds per token = F / (P x u(d))  +  kappa x F / (d x W)

- the matrix term: the matmuls run at a fraction u(d) = U_MAX x d / (d + D0) of the peak, growing
  with the width of the model's matmuls;
- the memory term: what moves through device memory besides the matmuls (elementwise ops, norms,
  the loss's logits) grows with the model's activations, L x d a token, where the matmuls grow
  with L x d^2: so bytes a token = kappa x F / d, kappa larger eager than compiled (Inductor fuses).

Its four constants are fitted (fit(), least squares on relative error, each configuration once) to
the runs in MEASURED: GPT-2 small on H100s and H200s (same matrix rate, bandwidth 3.35 against 4.8
TB/s: the pair that separates the two terms), llama-1b and llama-8b on H200s. fit_errors() says how
far the estimate is from each; `instances --fit` shows the largest as the estimate's error.
Not modelled: multi-GPU communication (the llama-8b point, sharded over 4 GPUs, carries its own),
the older cards' lower matrix efficiency (V100, T4: their fp16 rate is taken at face value), fp8
(its measured llama-1b rows price fp8 jobs of that shape on H200s, and a layer recipe measured at
one micro-batch is scaled to another from the recipe before it, memory.fp8_layers_scaled_tokens_per_sec;
elsewhere fp8 gets bf16's rate).

Data only at import; nothing here imports torch, nor launcher/memory.py (which reads this module's
tables); the model's shape comes from launcher/shape.py, below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .shape import ModelShape

H1 = "2026-11-26-h100x1"
S15_H100 = "2026-11-27-h100x1-session15"
S17_H100 = "2026-11-27-h100x1-session17"
S17_H200 = "2026-11-27-h200x2-session17"
S18 = "2026-11-28-h200x4-session18"
S19 = "2026-11-28-h200x4-session19"
S20 = "2026-11-28-h200x4-session20"
S21 = "2026-11-28-h200x1-session21"
S22 = "2026-11-29-h200x1-session22"
S23 = "2026-11-29-h200x1-session23"
S24 = "2026-11-29-h200x1-session24"
S25 = "2026-11-29-h200x1-session25"
S26 = "2026-11-29-h200x1-session26"
S27 = "2026-11-29-h200x1-session27"
S28 = "2026-11-29-h200x2-session28"
S29 = "2026-11-29-h200x2-session29"
S30 = "2026-11-29-h200x1-session30"
S31 = "2026-11-30-h200x1-session31"
S32 = "2026-11-30-h200x2-session32"
S33 = "2026-11-30-h200x2-session33"
S34 = "2026-11-30-h200x2-session34"
S36 = "2026-11-30-h200x2-session36"
S37 = "2026-11-30-h200x2-session37"
S38 = "2026-11-30-h200x2-session38"
OURS_1 = "ours-gpt2-small-ddp-g1-b16-k1"
OURS_C1 = "ours-gpt2-small-ddp-compile-g1-b16-k1"
LLAMA_C1 = "ours-llama-1b-ddp-compile-g1-b8-k1"
LLAMA_C16 = "ours-llama-1b-ddp-compile-g1-b16-k1"


@dataclass(frozen=True)
class Throughput:
    """Measured tokens/s per GPU of one configuration on one card, for `instances --fit`."""

    card: str  # the catalog's GPU model
    model: str  # a training preset
    compiled: bool
    tokens_per_sec: tuple[float, ...]  # per GPU, one per run
    runs: tuple[tuple[str, str], ...]  # (source, run id) of each
    note: str = ""
    batch_size: int = 16
    seq_len: int = 1024
    task: str = "causal-lm"
    strategy: str = "ddp"
    gpus: int = 1
    precision: str = "bf16"  # or "fp8": the tensorwise recipe (training/fp8.py)
    fp8_head: bool = False  # --fp8-head: the LM head in float8 too
    fp8_head_forward: str = "fp8"  # --fp8-head-forward: bf16 keeps the float8 head's logits in bf16
    fp8_head_backward: str = "fp8"  # --fp8-head-backward: bf16 keeps the float8 head's backward in bf16
    fp8_fast_accum: str = "none"  # --fp8-fast-accum: the backward's matmuls that accumulate fast too
    fp8_linear: str = "torchao"  # --fp8-linear: whose float8 linear layers
    fp8_grad_dtype: str = "e5m2"  # --fp8-grad-dtype as the run resolved it (auto's e4m3 since session 36)
    fp8_bf16_layers: str = "none"  # --fp8-bf16-layers as the run resolved it (auto's q_proj,k_proj since session 36)
    residual_bf16: bool = False  # the residual stream cast to bf16 (--residual-dtype; auto's pick since session 25)
    fused: bool = False  # --fuse-projections
    rope_tables: bool = False  # --rope-tables


def _llama1b_fp8_auto(
    compiled: bool, tokens_per_sec: tuple[float, ...], *, batch_size: int, runs: tuple[tuple[str, str], ...], note: str
) -> Throughput:
    """llama-1b on one H200 (sequence 2048, the bf16 stream) under --precision fp8's auto recipe since
    session 36 as its runs resolved it; compiled runs read the rope tables, eager ones the module."""
    return Throughput(
        "H200", "llama-1b", compiled, tokens_per_sec, runs, note, batch_size=batch_size, seq_len=2048,
        precision="fp8", fp8_head=True, fp8_head_backward="bf16", fp8_fast_accum="grad-input", fp8_linear="native",
        fp8_grad_dtype="e4m3", fp8_bf16_layers="q_proj,k_proj", residual_bf16=True, rope_tables=compiled,
    )  # fmt: skip


# Today's trainer (the head loss since session 17, the loss-only forwards since session 4): the
# H100 compiled rows of sessions 4 and 15 (422,664-424,811 tokens/s) and the eager one of session 2
# (157,377) predate them and are left out.
THROUGHPUT: tuple[Throughput, ...] = (
    Throughput("H100", "gpt2-small", True, (432764.8, 426549.9, 429376.0),
               ((f"{S17_H100}-headloss", OURS_C1), (f"{S17_H100}-headloss-again", OURS_C1),
                ("2026-11-28-h100x1-session18-house-after", "ours +compile"))),
    Throughput("H100", "gpt2-small", False, (161599.4, 188422.0),
               ((f"{S17_H100}-anatomy", OURS_1), ("2026-11-28-h100x1-session18-house-after", "ours (ddp, 1 process)"))),
    Throughput("H200", "gpt2-small", True, (452298.4, 465590.2),
               ((f"{S17_H200}-scaling", OURS_C1), (f"{S18}-scaling-zero", OURS_C1))),
    Throughput("H200", "llama-1b", True, (66821.3, 66978.1, 66964.2), batch_size=8, seq_len=2048,
               runs=((f"{S19}-fp8-a", LLAMA_C1), (f"{S19}-fp8-b", LLAMA_C1), (f"{S19}-fp8-b", LLAMA_C1)),
               note="side by side with other 1-GPU runs on the same host"),
    Throughput("H200", "llama-8b", True, (45913.5 / 4,), batch_size=4, seq_len=2048, strategy="fsdp", gpus=4,
               runs=((f"{S19}-llama8b", "ours-llama-8b-fsdp-compile-g4-b4-k1"),)),
    Throughput("H200", "llama-8b", True, (37695.1 / 4,), batch_size=4, seq_len=2048, strategy="zero3", gpus=4,
               runs=((f"{S19}-llama8b", "ours-llama-8b-zero3-compile-g4-b4-k1"),)),
    # llama-1b at the trainer's default micro-batch (16), and in fp8 (sessions 19-21): not fitted to
    # (the roofline's llama-1b point is the micro-batch-8 bf16 row above), each prices its own jobs
    Throughput("H200", "llama-1b", True,
               (69523.1, 69650.3, 69338.6, 68194.7, 70508.3, 68829.0, 69146.5, 68399.7, 68308.8), batch_size=16,
               seq_len=2048,
               runs=((f"{S21}-c1", f"{LLAMA_C16}-b16"), (f"{S22}-c2", f"{LLAMA_C16}-b16"),
                     (f"{S22}-c4", f"{LLAMA_C16}-b16"), (f"{S23}-c1", f"{LLAMA_C16}-b16"),
                     (f"{S23}-c3", f"{LLAMA_C16}-b16"), (f"{S24}-c2", f"{LLAMA_C16}-b16"),
                     (f"{S25}-c1", f"{LLAMA_C16}-b16"),
                     (f"{S20}-c1", f"{LLAMA_C16}-b16"), (f"{S20}-c4", f"{LLAMA_C16}-b16")),
               note="seven runs alone, two side by side with other 1-GPU runs on the same host"),
    # the residual stream in bf16 (--residual-dtype auto's pick for Llama-style models since session 25)
    Throughput("H200", "llama-1b", True, (70122.7, 70601.1, 70862.5, 68921.7), batch_size=16, seq_len=2048,
               residual_bf16=True, runs=((f"{S24}-c2", f"{LLAMA_C16}-r16"), (f"{S25}-c1", f"{LLAMA_C16}-r16"),
                                         (f"{S26}-c1", f"{LLAMA_C16}-b16"), (f"{S27}-c1", f"{LLAMA_C16}-b16"))),
    Throughput("H200", "llama-1b", True, (71081.3,), batch_size=32, seq_len=2048, residual_bf16=True,
               runs=((f"{S26}-c3", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),)),
    # fp8's default recipe with the bf16 stream: what --precision fp8 runs on a Llama since session 25
    Throughput("H200", "llama-1b", True, (88002.4, 85700.5), batch_size=16, seq_len=2048, precision="fp8",
               fp8_linear="native", residual_bf16=True,
               runs=((f"{S26}-c1", f"{LLAMA_C16}-nat16"), (f"{S27}-c1", f"{LLAMA_C16}-nat16"))),
    Throughput("H200", "llama-1b", True, (80730.8, 80926.3), batch_size=8, seq_len=2048, precision="fp8",
               fp8_linear="native", residual_bf16=True,
               runs=((f"{S26}-c2", f"{LLAMA_C1}-nat"), (f"{S26}-c2", f"{LLAMA_C1}-nat-r2"))),
    Throughput("H200", "llama-1b", True, (89846.9,), batch_size=32, seq_len=2048, precision="fp8",
               fp8_linear="native", residual_bf16=True,
               runs=((f"{S26}-c3", "ours-llama-1b-ddp-compile-g1-b32-k1-nat32"),)),
    # the rope tables (--rope-tables, the default on a compiled model since session 27), with the stream
    # (sessions 27-30: four machines)
    Throughput("H200", "llama-1b", True,
               (70041.7, 69893.0, 71716.0, 71084.6, 71194.3, 72194.3, 70146.7, 70978.8, 70132.0, 70871.2, 71239.2,
                71052.1, 70986.6, 71226.3, 70842.6, 70665.4, 70809.7, 70171.4, 70815.0),
               batch_size=16, seq_len=2048, residual_bf16=True, rope_tables=True,
               runs=((f"{S27}-c1", f"{LLAMA_C16}-rt16"), (f"{S27}-c2", f"{LLAMA_C16}-prt16"),
                     (f"{S28}-c2", f"{LLAMA_C16}-b16"), (f"{S29}-c1", f"{LLAMA_C16}-b16"),
                     (f"{S29}-c3", f"{LLAMA_C16}-b16"), (f"{S30}-c3", f"{LLAMA_C16}-b16"),
                     (f"{S33}-c1-gpu0", f"{LLAMA_C16}-b16"), (f"{S33}-c1-gpu1", f"{LLAMA_C16}-b16"),
                     (f"{S33}-c2-gpu0", LLAMA_C16), (f"{S33}-c2-gpu1-ours", LLAMA_C16),
                     (f"{S33}-c6-gpu1-ours", LLAMA_C16), (f"{S34}-c1a-gpu0", LLAMA_C16),
                     (f"{S34}-c1a-gpu1-ours", LLAMA_C16), (f"{S34}-c1-gpu0", LLAMA_C16),
                     (f"{S34}-c1-gpu1-ours", LLAMA_C16), (f"{S34}-c3-gpu0a", LLAMA_C16),
                     (f"{S34}-c3-gpu1b", LLAMA_C16), (f"{S36}-c4-gpu0", LLAMA_C16), (f"{S37}-c9-gpu0", LLAMA_C16)),
               note="six runs alone, thirteen (sessions 33-37) beside another 1-GPU run on the host's other GPU"),
    Throughput("H200", "llama-1b", True,
               (70311.1, 72425.1, 72656.7, 71244.4, 71041.5, 71893.2, 72626.3, 72018.2, 72869.9, 70386.7, 71521.6,
                71220.4, 72450.9, 71344.3, 71137.5),
               batch_size=32, seq_len=2048, residual_bf16=True, rope_tables=True,
               runs=((f"{S27}-c2", "ours-llama-1b-ddp-compile-g1-b32-k1-rt32"),
                     (f"{S30}-c1", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S30}-c2", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S31}-c1", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S31}-c3", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S32}-d2-gpu0", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S32}-d2-gpu1", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S32}-d4-gpu0", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S32}-d4-gpu1", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),
                     (f"{S33}-c4-gpu0", "ours-llama-1b-ddp-compile-g1-b32-k1"),
                     (f"{S34}-c2-gpu0", "ours-llama-1b-ddp-compile-g1-b32-k1"),
                     (f"{S34}-c2-gpu1-ours", "ours-llama-1b-ddp-compile-g1-b32-k1"),
                     (f"{S37}-c6-gpu0-k1", "ours-llama-1b-ddp-compile-g1-b32-k1"),
                     (f"{S38}-c2-gpu0-k1", "ours-llama-1b-ddp-compile-g1-b32-k1"),
                     (f"{S38}-c3-gpu0-k1", "ours-llama-1b-ddp-compile-g1-b32-k1")),
               note="five runs alone, ten (sessions 32-38) beside another 1-GPU run on the host's other GPU"),
    # the forward head with fast input-gradient accumulation (session 32: 1.302-1.309x bf16 on 2 H200s,
    # each run beside another on the host's other GPU; session 37's asked by --fp8-grad-dtype e5m2
    # --fp8-bf16-layers none, the recipe before auto's)
    Throughput("H200", "llama-1b", True, (93587.7, 95083.9, 93839.4, 95283.4, 95298.3), batch_size=32, seq_len=2048,
               precision="fp8", fp8_head=True, fp8_head_backward="bf16", fp8_fast_accum="grad-input",
               fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S32}-d2-gpu0", "ours-llama-1b-ddp-compile-g1-b32-k1-natfbg32"),
                     (f"{S32}-d2-gpu1", "ours-llama-1b-ddp-compile-g1-b32-k1-natfbg32"),
                     (f"{S32}-d4-gpu0", "ours-llama-1b-ddp-compile-g1-b32-k1-natfbg32"),
                     (f"{S32}-d4-gpu1", "ours-llama-1b-ddp-compile-g1-b32-k1-natfbg32"),
                     (f"{S37}-c6-gpu1-old32", "ours-llama-1b-ddp-compile-g1-b32-k1-old32")),
               note="beside another 1-GPU run on the host's other GPU"),
    Throughput("H200", "llama-1b", True, (90424.4, 90505.6, 91161.1, 91388.8, 91564.6, 90969.8, 90267.6),
               batch_size=16,
               seq_len=2048,
               precision="fp8", fp8_head=True, fp8_head_backward="bf16", fp8_fast_accum="grad-input",
               fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S33}-c1-gpu0", f"{LLAMA_C16}-natfbg16"), (f"{S33}-c3-gpu0", f"{LLAMA_C16}-natfbg16"),
                     (f"{S33}-c3-gpu1", f"{LLAMA_C16}-natfbg16"),
                     ("2026-11-30-h200x1-session33-c7", f"{LLAMA_C16}-fp8d16"),
                     (f"{S34}-c3-gpu0b", f"{LLAMA_C16}-fp8"), (f"{S34}-c3-gpu1a", f"{LLAMA_C16}-fp8"),
                     (f"{S36}-c2-gpu0b", f"{LLAMA_C16}-fp8")),
               note="six beside another 1-GPU run on the host's other GPU (three of them 200-step loss runs of "
               "--precision fp8 alone, sessions 34 and 36); one (--precision fp8 alone) alone"),
    # session 36's auto recipe (e4m3 output gradients, the query and key projections bf16), and each
    # half of it alone: 200-step loss runs, each beside another 1-GPU run on the host's other GPU
    _llama1b_fp8_auto(True, (87671.2, 87623.1, 88066.5, 88169.6, 89091.0, 87898.1), batch_size=16,
               runs=((f"{S36}-c2-gpu0a", f"{LLAMA_C16}-qke4"), (f"{S36}-c3-gpu0", f"{LLAMA_C16}-qke4"),
                     (f"{S36}-c3-gpu1", f"{LLAMA_C16}-qke4"), (f"{S36}-c4-gpu1", f"{LLAMA_C16}-qke4"),
                     (f"{S37}-c8-gpu0b", f"{LLAMA_C16}-auto"), (f"{S37}-c9-gpu1", f"{LLAMA_C16}-auto")),
               note="beside another 1-GPU run on the host's other GPU"),
    # the same recipe at 32 and 8 (session 37: 40 timed steps at 32; the 400-step loss runs at 8)
    _llama1b_fp8_auto(True, (91915.5, 92859.2, 90900.1), batch_size=32,
               runs=((f"{S37}-c6-gpu0-auto32", "ours-llama-1b-ddp-compile-g1-b32-k1-auto32"),
                     (f"{S37}-c6-gpu1-auto32", "ours-llama-1b-ddp-compile-g1-b32-k1-auto32"),
                     (f"{S38}-c2-gpu1-auto32", "ours-llama-1b-ddp-compile-g1-b32-k1-auto32")),
               note="beside another 1-GPU run on the host's other GPU"),
    # ... and at 48 (session 38), the micro-batch bf16 cannot fit on an H200 (about 150 GiB)
    _llama1b_fp8_auto(True, (92579.1, 93314.5, 93043.6), batch_size=48,
               runs=((f"{S38}-c2-gpu0-auto48", "ours-llama-1b-ddp-compile-g1-b48-k1-auto48"),
                     (f"{S38}-c2-gpu1-auto48", "ours-llama-1b-ddp-compile-g1-b48-k1-auto48"),
                     (f"{S38}-c3-gpu0-auto48", "ours-llama-1b-ddp-compile-g1-b48-k1-auto48")),
               note="beside another 1-GPU run on the host's other GPU"),
    _llama1b_fp8_auto(True, (83487.6, 83306.5, 83906.7, 83921.5), batch_size=8,
               runs=((f"{S37}-c7-gpu0", f"{LLAMA_C1}-auto8"), (f"{S37}-c7-gpu0", f"{LLAMA_C1}-auto8-r2"),
                     (f"{S37}-c7-gpu1", f"{LLAMA_C1}-auto8"), (f"{S37}-c7-gpu1", f"{LLAMA_C1}-auto8-r2")),
               note="two runs a GPU, beside the same on the host's other GPU"),
    # eager (a run under the compile threshold, or --no-compile; session 38): the bf16 stream, no
    # rope tables (eager keeps the module), and fp8's auto recipe 0.74x bf16's speed
    Throughput("H200", "llama-1b", False, (49087.5,), batch_size=8, seq_len=2048, residual_bf16=True,
               runs=((f"{S38}-c1-gpu0-ebf16", f"{LLAMA_C1}-ebf16"),),
               note="beside another 1-GPU run on the host's other GPU"),
    Throughput("H200", "llama-1b", False, (51489.9,), batch_size=16, seq_len=2048, residual_bf16=True,
               runs=((f"{S38}-c4-gpu0-ebf16b", f"{LLAMA_C16}-ebf16b"),),
               note="beside another 1-GPU run on the host's other GPU"),
    _llama1b_fp8_auto(False, (36354.3,), batch_size=8,
               runs=((f"{S38}-c1-gpu0-efp8", f"{LLAMA_C1}-efp8"),),
               note="beside another 1-GPU run on the host's other GPU"),
    _llama1b_fp8_auto(False, (38272.6,), batch_size=16,
               runs=((f"{S38}-c4-gpu0-efp8b", f"{LLAMA_C16}-efp8b"),),
               note="beside another 1-GPU run on the host's other GPU"),
    # the key projection alone in bf16 (session 37): a fifth of the qk recipe's cost, not its loss
    Throughput("H200", "llama-1b", True, (90028.6, 89818.8, 89681.7), batch_size=16, seq_len=2048,
               precision="fp8", fp8_head=True, fp8_head_backward="bf16", fp8_fast_accum="grad-input",
               fp8_linear="native", residual_bf16=True, rope_tables=True, fp8_grad_dtype="e4m3",
               fp8_bf16_layers="k_proj",
               runs=((f"{S37}-c8-gpu0a", f"{LLAMA_C16}-konly"), (f"{S37}-c8-gpu1a", f"{LLAMA_C16}-konly"),
                     (f"{S37}-c8-gpu1b", f"{LLAMA_C16}-konly")),
               note="beside another 1-GPU run on the host's other GPU"),
    Throughput("H200", "llama-1b", True, (88208.6, 88575.4), batch_size=16, seq_len=2048,
               precision="fp8", fp8_head=True, fp8_head_backward="bf16", fp8_fast_accum="grad-input",
               fp8_linear="native", residual_bf16=True, rope_tables=True, fp8_bf16_layers="q_proj,k_proj",
               runs=((f"{S36}-c1-gpu0a", f"{LLAMA_C16}-qk"), (f"{S36}-c2-gpu1a", f"{LLAMA_C16}-qk")),
               note="beside another run on the host's other GPU"),
    Throughput("H200", "llama-1b", True, (89534.2, 90062.7), batch_size=16, seq_len=2048,
               precision="fp8", fp8_head=True, fp8_head_backward="bf16", fp8_fast_accum="grad-input",
               fp8_linear="native", residual_bf16=True, rope_tables=True, fp8_grad_dtype="e4m3",
               runs=((f"{S36}-c1-gpu0b", f"{LLAMA_C16}-e4"), (f"{S36}-c2-gpu1b", f"{LLAMA_C16}-e4")),
               note="beside another run on the host's other GPU"),
    Throughput("H200", "llama-1b", True, (84992.7, 84914.9, 85900.3, 86068.0), batch_size=8, seq_len=2048,
               precision="fp8", fp8_head=True, fp8_head_backward="bf16", fp8_fast_accum="grad-input",
               fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S32}-d3-gpu0", f"{LLAMA_C1}-natfbg"), (f"{S32}-d3-gpu0", f"{LLAMA_C1}-natfbg-r2"),
                     (f"{S32}-d3-gpu1", f"{LLAMA_C1}-natfbg"), (f"{S32}-d3-gpu1", f"{LLAMA_C1}-natfbg-r2")),
               note="beside another 1-GPU run on the host's other GPU"),
    # the LM head's forward in float8, its backward bf16 (session 31)
    Throughput("H200", "llama-1b", True, (92459.2, 92133.8), batch_size=32, seq_len=2048, precision="fp8",
               fp8_head=True, fp8_head_backward="bf16", fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S31}-c1", "ours-llama-1b-ddp-compile-g1-b32-k1-natfb32"),
                     (f"{S31}-c3", "ours-llama-1b-ddp-compile-g1-b32-k1-natfb32"))),
    Throughput("H200", "llama-1b", True, (82796.1, 82782.5), batch_size=8, seq_len=2048, precision="fp8",
               fp8_head=True, fp8_head_backward="bf16", fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S31}-c2", f"{LLAMA_C1}-natfb"), (f"{S31}-c2", f"{LLAMA_C1}-natfb-r2"))),
    Throughput("H200", "llama-1b", True, (91849.6,), batch_size=32, seq_len=2048, precision="fp8",
               fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S30}-c1", "ours-llama-1b-ddp-compile-g1-b32-k1-nat32"),)),
    Throughput("H200", "llama-1b", True, (66887.0, 67704.3, 68779.6), batch_size=8, seq_len=2048, residual_bf16=True,
               rope_tables=True, runs=((f"{S27}-c3", f"{LLAMA_C1}-rt"), (f"{S29}-c2-loss", LLAMA_C1),
                                       (f"{S33}-c5-gpu1-ours", LLAMA_C1)),
               note="two runs alone, one (session 33) beside another 1-GPU run on the host's other GPU"),
    Throughput("H200", "llama-1b", True, (87236.0, 88821.4, 88396.7, 88377.6, 87103.9, 88374.9), batch_size=16,
               seq_len=2048, precision="fp8", fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S27}-c2", f"{LLAMA_C16}-natrt16"), (f"{S28}-c2", f"{LLAMA_C16}-nat16"),
                     (f"{S29}-c1", f"{LLAMA_C16}-nat16"), (f"{S29}-c3", f"{LLAMA_C16}-nat16"),
                     (f"{S33}-c3-gpu0", f"{LLAMA_C16}-nat16"), (f"{S33}-c3-gpu1", f"{LLAMA_C16}-nat16")),
               note="four runs alone, two (session 33) beside another 1-GPU run on the host's other GPU"),
    Throughput("H200", "llama-1b", True, (66899.6, 67450.8, 67018.4, 66998.3, 66131.6), batch_size=8,
               seq_len=2048, residual_bf16=True,
               runs=((f"{S24}-c3", f"{LLAMA_C1}-r"), (f"{S25}-c2", f"{LLAMA_C1}-r"), (f"{S25}-c2", f"{LLAMA_C1}-r-r2"),
                     (f"{S25}-c2", f"{LLAMA_C1}-r-r3"), (f"{S27}-c3", LLAMA_C1))),
    # the float8 head with its forward (logits, loss) in bf16, with the stream and the tables (session 28)
    Throughput("H200", "llama-1b", True, (92938.8,), batch_size=16, seq_len=2048, precision="fp8", fp8_head=True,
               fp8_head_forward="bf16", fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S28}-c2", f"{LLAMA_C16}-nathf16"),)),
    Throughput("H200", "llama-1b", True, (85303.0, 85357.6), batch_size=8, seq_len=2048, precision="fp8",
               fp8_head=True, fp8_head_forward="bf16", fp8_linear="native", residual_bf16=True, rope_tables=True,
               runs=((f"{S28}-c3", f"{LLAMA_C1}-nathf"), (f"{S28}-c3", f"{LLAMA_C1}-nathf-r2"))),
    Throughput("H200", "llama-1b", True, (93174.3,), batch_size=16, seq_len=2048, precision="fp8", fp8_head=True,
               fp8_linear="native", residual_bf16=True, runs=((f"{S24}-c2", f"{LLAMA_C16}-natrhb16"),)),
    Throughput("H200", "llama-1b", True, (86832.8, 86352.8), batch_size=8, seq_len=2048, precision="fp8",
               fp8_head=True, fp8_linear="native", residual_bf16=True,
               runs=((f"{S25}-c3", f"{LLAMA_C1}-natrh"), (f"{S25}-c3", f"{LLAMA_C1}-natrh-r2"))),
    Throughput("H200", "llama-1b", True, (68261.0,), batch_size=16, seq_len=2048, residual_bf16=True, fused=True,
               runs=((f"{S25}-c1", f"{LLAMA_C16}-rf16"),)),
    Throughput("H200", "llama-1b", True, (82156.6,), batch_size=16, seq_len=2048, precision="fp8",
               fp8_linear="native", residual_bf16=True, fused=True, runs=((f"{S25}-c1", f"{LLAMA_C16}-natrf16"),)),
    Throughput("H200", "llama-1b", True, (84890.1, 85045.5, 82643.7), batch_size=16, seq_len=2048, precision="fp8",
               runs=((f"{S21}-c1", f"{LLAMA_C16}-fp8b16"), (f"{S22}-c2", f"{LLAMA_C16}-fp8b16"),
                     (f"{S20}-c4", f"{LLAMA_C16}-fp8b16"))),
    Throughput("H200", "llama-1b", True, (85972.6, 84313.6, 87068.5), batch_size=16, seq_len=2048, precision="fp8",
               fp8_linear="native", runs=((f"{S22}-c2", f"{LLAMA_C16}-natb16"), (f"{S23}-c1", f"{LLAMA_C16}-natb16"),
                                          (f"{S23}-c3", f"{LLAMA_C16}-natb16"))),
    Throughput("H200", "llama-1b", True, (93711.7,), batch_size=16, seq_len=2048, precision="fp8", fp8_head=True,
               fp8_linear="native", runs=((f"{S23}-c3", f"{LLAMA_C16}-nathb16"),)),
    Throughput("H200", "llama-1b", True, (79964.5,), batch_size=8, seq_len=2048, precision="fp8",
               fp8_linear="native", runs=((f"{S23}-c2", f"{LLAMA_C1}-nat"),)),
    Throughput("H200", "llama-1b", True, (83782.6, 84435.9, 84331.4), batch_size=8, seq_len=2048, precision="fp8",
               fp8_head=True, fp8_linear="native",
               runs=((f"{S24}-c1", f"{LLAMA_C1}-nath"), (f"{S24}-c1", f"{LLAMA_C1}-nath-r2"),
                     (f"{S24}-c1", f"{LLAMA_C1}-nath-r3"))),
    Throughput("H200", "llama-1b", True, (69357.5,), batch_size=32, seq_len=2048,
               runs=((f"{S22}-c1", "ours-llama-1b-ddp-compile-g1-b32-k1-b32"),)),
    Throughput("H200", "llama-1b", True, (84892.3,), batch_size=32, seq_len=2048, precision="fp8",
               runs=((f"{S22}-c1", "ours-llama-1b-ddp-compile-g1-b32-k1-fp8b32"),)),
    Throughput("H200", "llama-1b", True, (91195.6,), batch_size=16, seq_len=2048, precision="fp8", fp8_head=True,
               runs=((f"{S21}-c1", f"{LLAMA_C16}-fp8h16"),)),
    Throughput("H200", "llama-1b", True, (77572.9, 77638.3, 77821.1), batch_size=8, seq_len=2048, precision="fp8",
               runs=((f"{S19}-fp8-a", f"{LLAMA_C1}-fp8"), (f"{S19}-fp8-b", f"{LLAMA_C1}-fp8"),
                     (f"{S19}-fp8-b", f"{LLAMA_C1}-fp8")),
               note="side by side with other 1-GPU runs on the same host"),
    Throughput("H200", "llama-1b", True, (83632.2, 83807.0, 83655.1, 82712.3, 83164.6), batch_size=8, seq_len=2048,
               precision="fp8", fp8_head=True,
               runs=((f"{S21}-c2", f"{LLAMA_C1}-fp8h"), (f"{S21}-c3", f"{LLAMA_C1}-fp8h2"),
                     (f"{S21}-c3", f"{LLAMA_C1}-fp8h3"), (f"{S22}-c3", f"{LLAMA_C1}-fp8h"),
                     (f"{S22}-c3", f"{LLAMA_C1}-fp8h-r2"))),
)  # fmt: skip
# The runs the estimate is fitted to: each shape's fastest engine (ZeRO-3's 8B row is the slower of two).
MEASURED: tuple[Throughput, ...] = THROUGHPUT[:5]


@dataclass(frozen=True)
class GpuSpec:
    """A card's published rates: dense (no sparsity) 16-bit tensor-core TFLOP/s, bf16 where the
    card has it (fp16 on V100 and T4, whose jobs run fp16), and memory bandwidth in TB/s."""

    tflops: float
    tb_per_s: float
    source: str


# NVIDIA's datasheets, SXM parts where the instance has them. A10G: AWS's variant of the A10 (same
# 600 GB/s GDDR6; its tensor rate is about 70 TFLOP/s against the A10's 125).
GPU_SPECS: dict[str, GpuSpec] = {
    "V100": GpuSpec(125.0, 0.90, "V100 SXM2 datasheet (fp16 tensor)"),
    "T4": GpuSpec(65.0, 0.32, "T4 datasheet (fp16 tensor)"),
    "A10G": GpuSpec(70.0, 0.60, "A10G (AWS G5)"),
    "L4": GpuSpec(121.0, 0.30, "L4 datasheet"),
    "L40S": GpuSpec(362.0, 0.864, "L40S datasheet"),
    "A100": GpuSpec(312.0, 1.555, "A100 40GB SXM4 datasheet"),
    "H100": GpuSpec(989.0, 3.35, "H100 SXM datasheet"),
    "H200": GpuSpec(989.0, 4.8, "H200 SXM datasheet"),
    "B200": GpuSpec(2250.0, 8.0, "B200 datasheet (HGX)"),
}
# Where one GPU model comes in memory sizes of different bandwidth: (model, GiB) -> TB/s.
BANDWIDTH_BY_MEMORY: dict[tuple[str, int], float] = {("A100", 80): 2.039, ("V100", 32): 0.90}


def spec(gpu_model: str, memory_gib: int | None = None) -> GpuSpec | None:
    base = GPU_SPECS.get(gpu_model)
    if base is None or memory_gib is None or (gpu_model, memory_gib) not in BANDWIDTH_BY_MEMORY:
        return base
    return GpuSpec(base.tflops, BANDWIDTH_BY_MEMORY[gpu_model, memory_gib], base.source)


# ---------------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class Roofline:
    u_max: float  # the matrix units' fraction of peak at infinite width
    d0: float  # the hidden size at which matmuls reach half of u_max
    kappa_compiled: float  # bytes a token, per FLOP a token, per unit of hidden size: compiled
    kappa_eager: float  # the same, eager


# fit()'s values, rounded; tests/launcher/test_throughput.py fails when MEASURED moves the fit.
ROOFLINE = Roofline(u_max=0.688, d0=310.0, kappa_compiled=1.65, kappa_eager=11.8)


def flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Training FLOPs a token, as bench/_benchlib.flops_per_token counts them for MFU."""
    return 6.0 * shape.params + 12.0 * shape.layers * shape.hidden * seq_len


def estimate_tokens_per_sec(
    shape: ModelShape, seq_len: int, compiled: bool, card: GpuSpec, roofline: Roofline = ROOFLINE
) -> float:
    """Estimated training tokens/s on one GPU of `card` (see the module's docstring)."""
    f, d = flops_per_token(shape, seq_len), shape.hidden
    kappa = roofline.kappa_compiled if compiled else roofline.kappa_eager
    matrix = f / (card.tflops * 1e12 * roofline.u_max * d / (d + roofline.d0))
    memory = kappa * f / (d * card.tb_per_s * 1e12)
    return 1.0 / (matrix + memory)


def _shape(t: Throughput) -> ModelShape:
    from distrain_cloud.training.modeling import PRESETS

    from .shape import shape_from_config

    shape = shape_from_config(t.model, PRESETS[t.model])
    assert shape is not None  # presets are complete configs
    return shape


def _measured(t: Throughput) -> float:
    return sum(t.tokens_per_sec) / len(t.tokens_per_sec)


def fit(measured: tuple[Throughput, ...] = MEASURED) -> Roofline:
    """The constants that minimise the squared relative error of the estimate over `measured`
    (each configuration once, its runs averaged). For a fixed D0 the seconds a token are linear in
    1/U_MAX and kappa: a small least-squares problem, solved over a grid of D0; then kappa_eager
    from the eager rows with the matrix term fixed."""
    compiled = [t for t in measured if t.compiled]
    best: tuple[float, Roofline] | None = None
    for d0 in range(0, 2001, 10):
        rows = []
        for t in compiled:
            shape, card = _shape(t), GPU_SPECS[t.card]
            f, d, seconds = flops_per_token(shape, t.seq_len), shape.hidden, 1.0 / _measured(t)
            rows.append((f * (d + d0) / (card.tflops * 1e12 * d) / seconds, f / (d * card.tb_per_s * 1e12) / seconds))
        # minimise sum((a x + k y - 1)^2) over a = 1/u_max and k = kappa
        sxx, sxy, syy = (sum(x * x for x, _ in rows), sum(x * y for x, y in rows), sum(y * y for _, y in rows))
        sx, sy = sum(x for x, _ in rows), sum(y for _, y in rows)
        det = sxx * syy - sxy * sxy
        a, k = (sx * syy - sy * sxy) / det, (sy * sxx - sx * sxy) / det
        if a <= 0 or k < 0:
            continue
        err = sum((a * x + k * y - 1) ** 2 for x, y in rows)
        if best is None or err < best[0]:
            best = (err, Roofline(u_max=1 / a, d0=float(d0), kappa_compiled=k, kappa_eager=k))
    assert best is not None
    roofline = best[1]
    eager = [t for t in measured if not t.compiled]
    if not eager:
        return roofline
    # kappa_eager: the memory term's share of each eager row's seconds, over its bytes per kappa
    num = den = 0.0
    for t in eager:
        shape, card = _shape(t), GPU_SPECS[t.card]
        f, d, seconds = flops_per_token(shape, t.seq_len), shape.hidden, 1.0 / _measured(t)
        matrix = f / (card.tflops * 1e12 * roofline.u_max * d / (d + roofline.d0)) / seconds
        y = f / (d * card.tb_per_s * 1e12) / seconds
        num, den = num + y * (1 - matrix), den + y * y
    return Roofline(roofline.u_max, roofline.d0, roofline.kappa_compiled, num / den)


def fit_errors(roofline: Roofline = ROOFLINE) -> list[tuple[Throughput, float, float]]:
    """(configuration, measured tokens/s per GPU, the estimate's relative error) for each of MEASURED."""
    out = []
    for t in MEASURED:
        estimated = estimate_tokens_per_sec(_shape(t), t.seq_len, t.compiled, GPU_SPECS[t.card], roofline)
        out.append((t, _measured(t), estimated / _measured(t) - 1))
    return out


def largest_error(roofline: Roofline = ROOFLINE) -> float:
    return max(abs(e) for _, _, e in fit_errors(roofline))


if __name__ == "__main__":  # python -m distrain_cloud.launcher.throughput: the fit and its errors
    print(fit())
    for t, measured, error in fit_errors():
        what = f"{t.model} {'compiled' if t.compiled else 'eager'} {t.strategy} x{t.gpus} b{t.batch_size}x{t.seq_len}"
        print(f"{t.card:5} {what:40} measured {measured:10,.0f}  estimate {error:+.1%}")
