"""Training arguments: the hyperparameters every backend passes as CLI flags.

Torch-free, so the launcher can validate a job's hyperparameters while planning.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NoReturn

from .engines.facts import takes_fp8
from .stopping import DEFAULT_COLLECTIVE_TIMEOUT_S, DEFAULT_STOP_GRACE_S
from .strategies import AUTO, BLOCK_COMPILED, PRECISIONS, STRATEGY_CHOICES, provisional_strategy

# --fp8-recipe's choices: torchao's float8 recipes (training/fp8.py maps them to its names)
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise-gw-hp")
# --fp8-fast-accum's choices: which backward matmuls accumulate fast (training/fp8.py); auto:
# fp8_auto_recipe
FP8_FAST_ACCUM = ("auto", "none", "grad-input", "all")
# --fp8-linear's choices: whose float8 linear layers (training/fp8.py); auto: fp8_linear_of
FP8_LINEARS = ("auto", "native", "torchao")
# --fp8-scaling's choices: when the native layers' scales are computed (training/fp8_linear.py)
FP8_SCALINGS = ("dynamic", "delayed")
# --fp8-grad-dtype's choices: the native layers' output-gradient format (training/fp8_linear.py)
FP8_GRAD_DTYPES = ("e5m2", "e4m3")

TASKS = ("classification", "causal-lm", "masked-lm")
SCHEDULERS = ("linear", "cosine", "constant")
PRESETS = ("tiny-gpt2", "tiny-bert", "gpt2-small", "gpt2-xl", "llama-1b", "llama-8b")
_BRANCH = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]{0,199}")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")
COMPILE_UNITS = ("model", "block")


class ArgumentError(ValueError):
    """A bad training argument; the message is one line that names the flag."""


def _flag(help: str, **options: Any) -> dict[str, Any]:
    """A TrainArgs field's flag (its metadata): its help, and what argparse needs beyond the field's
    type and default (choices, metavar, an action other than a bool's pair, as --compile/--no-compile).
    build_parser makes the flags from the fields, so a flag and its field cannot drift apart."""
    return {"help": help, **options}


# The parser's groups (sections of --help), each with the first of its fields: a group holds that
# field and those that follow it in TrainArgs, up to the next group's.
_GROUPS = (
    ("model", "task"),
    ("data", "dataset"),
    ("optimisation", "strategy"),
    ("logging, evaluation, checkpoints", "log_every"),
)


@dataclass
class TrainArgs:
    """The training flags as the entry point parses them, one field each (build_parser makes the
    flags from these fields: their defaults, types and the help, choices and metavar of `_flag`)."""

    # what to train
    task: str = field(
        default="classification", metadata=_flag("what to train the model for (default: %(default)s)", choices=TASKS)
    )
    model: str | None = field(default=None, metadata=_flag("Hub id or local folder of a pretrained model"))
    model_config: str | None = field(
        default=None, metadata=_flag("config.json path or Hub id: build the model with random weights")
    )
    preset: str | None = field(
        default=None,
        metadata=_flag("a named config built offline (default: tiny-gpt2 when no model is given)", choices=PRESETS),
    )
    config_overrides: str | None = field(
        default=None,
        metadata=_flag(
            ("change the model config's values, e.g. 'attn_pdrop=0,resid_pdrop=0' (names as in its config.json)"),
            metavar="KEY=VALUE,...",
        ),
    )
    tokenizer: str | None = field(
        default=None, metadata=_flag("Hub id or folder (default: the model's, or the shipped offline tokenizer)")
    )
    # data
    dataset: str | None = field(
        default=None, metadata=_flag("Hub dataset id, local file or folder, or builtin:sentiment / builtin:corpus")
    )
    dataset_config: str | None = field(default=None, metadata=_flag("the Hub dataset's config name"))
    train_file: str | None = field(default=None, metadata=_flag("csv, json/jsonl, parquet or txt"))
    validation_file: str | None = field(
        default=None, metadata=_flag("evaluation data, in a format --train-file takes (default: carved out of it)")
    )
    text_column: str = field(default="text", metadata=_flag("the column holding the text (default: %(default)s)"))
    label_column: str = field(
        default="label", metadata=_flag("classification: the column holding the label (default: %(default)s)")
    )
    validation_fraction: float = field(
        default=0.1, metadata=_flag("carved out of the training data when it has no validation split")
    )
    max_length: int = field(default=128, metadata=_flag("classification: truncate to this many tokens"))
    block_size: int = field(default=128, metadata=_flag("language models: pack text into blocks of this many tokens"))
    max_train_samples: int | None = field(
        default=None, metadata=_flag("train on at most this many examples (for quick runs)")
    )
    max_eval_samples: int | None = field(default=None, metadata=_flag("evaluate on at most this many examples"))
    # how
    # resolved where the job runs: strategies.resolve_auto
    strategy: str = field(
        default=AUTO,
        metadata=_flag(
            ("auto (default): ddp, or fsdp sharded in the compiled graph for long compiled runs on GPUs of one node"),
            choices=STRATEGY_CHOICES,
        ),
    )
    # None: chosen where the job runs (precision.resolve_precision)
    precision: str | None = field(
        default=None,
        metadata=_flag(
            (
                "mixed precision (default: the launcher's pick: bf16 on compute capability >= 8.0, fp16 below, "
                "no (fp32) on CPU); fp8: bf16 with float8 matmuls (torchao, compute capability >= 8.9)"
            ),
            choices=PRECISIONS,
        ),
    )
    # torchao's float8 scaling (training/fp8.py)
    fp8_recipe: str = field(
        default="tensorwise",
        metadata=_flag(
            (
                "--precision fp8's scaling: tensorwise (default; one scale per tensor, fastest), rowwise (one "
                "per row), rowwise-gw-hp (rowwise, weight gradients in bf16: the most accurate)"
            ),
            choices=FP8_RECIPES,
        ),
    )
    # the first and last N transformer blocks stay bf16 under fp8
    fp8_bf16_edge_blocks: int = field(
        default=0,
        metadata=_flag(
            "--precision fp8: the first N and the last N transformer blocks stay bf16 (default: %(default)s)",
            metavar="N",
        ),
    )
    # linear layers kept bf16 by name under fp8 (training/fp8.py); auto: fp8_bf16_layer_names
    fp8_bf16_layers: str = field(
        default=AUTO,
        metadata=_flag(
            (
                "--precision fp8: the block linears that stay bf16, by their name in each block, "
                "comma-separated (q_proj,k_proj: attention's query and key projections everywhere), none "
                "(every block linear float8), or auto (default: q_proj,k_proj on the native float8 layers "
                "where the model has both, none otherwise)"
            ),
            metavar="NAMES",
        ),
    )
    # which of the backward's float8 matmuls accumulate fast too (training/fp8.py)
    fp8_fast_accum: str = field(
        default=AUTO,
        metadata=_flag(
            (
                "--precision fp8: the backward's float8 matmuls that also accumulate in the tensor cores' fast, "
                "less exact mode, as the forward's do: none, grad-input (the input gradients, whose sums run over "
                "a layer's width), all (the weight gradients too, summed over every token; the flag alone), or "
                "auto (default: grad-input on the native float8 layers, none on torchao's)"
            ),
            choices=FP8_FAST_ACCUM,
            nargs="?",
            const="all",
        ),
    )
    # whose float8 linear layers: fp8_linear.Float8Linear on torch._scaled_mm alone, or torchao's
    fp8_linear: str = field(
        default=AUTO,
        metadata=_flag(
            (
                "--precision fp8: whose float8 linear layers: native (torch._scaled_mm alone, tensorwise "
                "scaling, its backward reusing the forward's float8 copies), torchao (needs torchao), or auto "
                "(default: native, torchao for --fp8-recipe's rowwise recipes)"
            ),
            choices=FP8_LINEARS,
        ),
    )
    # the native layers' scales from each tensor (dynamic) or from the last forwards' (delayed)
    fp8_scaling: str = field(
        default="dynamic",
        metadata=_flag(
            (
                "--precision fp8, the native layers: dynamic (default; each input and weight scaled by its own "
                "largest magnitude) or delayed (by the largest of the last 16 forwards', Transformer Engine's "
                "recipe; a larger value saturates; no faster on an H200, bench/README.md session 23)"
            ),
            choices=FP8_SCALINGS,
        ),
    )
    # the float8 format of the native layers' output gradients (training/fp8_linear.py)
    fp8_grad_dtype: str = field(
        default=AUTO,
        metadata=_flag(
            (
                "--precision fp8, the native layers: the float8 format of the output gradients the backward "
                "multiplies: e5m2 (2 mantissa bits, the range one scale per tensor needs), e4m3 (3 mantissa "
                "bits, as torchao's rowwise recipe; a value 2^18 below the tensor's largest flushes to zero) "
                "or auto (default: e4m3). The LM head's backward keeps e5m2"
            ),
            choices=(*FP8_GRAD_DTYPES, AUTO),
        ),
    )
    # the LM head multiplies in float8 too (losses.head_loss); None: fp8_auto_recipe decides
    fp8_head: bool | None = field(
        default=None,
        metadata=_flag(
            (
                "--precision fp8: the LM head's matmuls in float8 too, inside the fast LM loss (default: on, its "
                "forward matmul alone (--fp8-head-backward), where the run computes the fast LM loss on the "
                "native float8 layers with no --fp8-bf16-edge-blocks; --no-fp8-head keeps the head bf16)"
            ),
        ),
    )
    # the head's input gradient (the one every block receives) in bf16: two of its three matmuls float8
    fp8_head_grad_input: str = field(
        default="fp8",
        metadata=_flag(
            (
                "--fp8-head: the dtype of the head's input gradient, the one that flows into every block: fp8 "
                "(default; e5m2 logit gradients) or bf16 (the forward and the weight gradient stay float8; "
                "llama-1b on an H200: slower than fp8 with the head in bf16)"
            ),
            choices=("fp8", "bf16"),
        ),
    )
    # the head's forward (the logits the loss and its gradient come from) in bf16: the backward's two
    # matmuls float8
    fp8_head_forward: str = field(
        default="fp8",
        metadata=_flag(
            (
                "--fp8-head: the dtype of the head's forward matmul, whose logits the loss and its gradient "
                "are computed from: fp8 (default; e4m3 hidden states and weight) or bf16 (the logits as without "
                "--fp8-head; the backward's two matmuls stay float8; llama-1b on an H200: 1.30x bf16, its loss "
                "2.4% above bf16's after 400 steps)"
            ),
            choices=("fp8", "bf16"),
        ),
    )
    # the head's backward (both its matmuls, from the logits' gradient) in bf16: the forward's matmul
    # alone float8, and no float8 copy of the vocabulary-wide logits' gradient
    fp8_head_backward: str = field(
        default=AUTO,
        metadata=_flag(
            (
                "--fp8-head: the dtype of the head's two backward matmuls, the input and weight gradients: fp8 "
                "(e5m2 logit gradients), bf16 (the bf16 head's backward; the forward's matmul alone float8), or "
                "auto (default: bf16, fp8 with --fp8-head-forward bf16 or --fp8-head-grad-input bf16)"
            ),
            choices=("fp8", "bf16", AUTO),
        ),
    )
    batch_size: int = field(default=16, metadata=_flag("per device, per micro-step"))
    eval_batch_size: int | None = field(
        default=None, metadata=_flag("per device, for evaluation (default: --batch-size)")
    )
    grad_accum: int = field(
        default=1, metadata=_flag("micro-steps whose gradients add up to one optimizer step (default: %(default)s)")
    )
    # 5e-5 fine-tuning a pretrained --model, 1e-3 training from a config
    lr: float | None = field(
        default=None, metadata=_flag("peak learning rate (default: 5e-5 for a pretrained --model, 1e-3 from a config)")
    )
    weight_decay: float = field(default=0.01, metadata=_flag("AdamW weight decay (default: %(default)g)"))
    max_grad_norm: float = field(default=1.0, metadata=_flag("0 turns clipping off"))
    warmup_steps: int = field(
        default=0, metadata=_flag("optimizer steps over which the learning rate rises from 0 (default: %(default)s)")
    )
    scheduler: str = field(
        default="linear",
        metadata=_flag(
            "learning rate after warmup: decays to 0 (linear, cosine) or stays (default: %(default)s)",
            choices=SCHEDULERS,
        ),
    )
    epochs: float = field(
        default=3.0,
        metadata=_flag(
            "passes over the training data, fractions allowed (default: %(default)g; --max-steps overrides it)"
        ),
    )
    max_steps: int | None = field(
        default=None, metadata=_flag("optimizer steps to train, at least 1; overrides --epochs")
    )
    seed: int = field(
        default=42,
        metadata=_flag(
            "seeds the weights, dropout and the data order; a resumed run keeps its place (default: %(default)s)"
        ),
    )
    # None: decided at run time (strategies.compile_decision)
    compile: bool | None = field(
        default=None,
        metadata=_flag(
            "torch.compile the model (default: on for CUDA GPUs under ddp, single, fsdp, zero2 and zero3 for "
            "runs of 1,000+ steps; a compile error falls back to eager with a warning)"
        ),
    )
    compile_mode: str = field(
        default="default",
        metadata=_flag(
            "torch.compile mode with --compile (max-autotune* tune GEMMs; compiles take minutes)", choices=COMPILE_MODES
        ),
    )
    compile_tuning: bool = field(
        default=False,
        metadata=_flag(
            "with --compile: Inductor also tunes the launch settings of the kernels it generates (coordinate "
            "descent); the first compile takes longer"
        ),
    )
    compile_optimizer: bool = field(
        default=False,
        metadata=_flag(
            "ddp and single: the gradient clip and AdamW's update as one compiled step, which reads each "
            "gradient scaled instead of scaling it in place first (training/optim.py; not with fp16). On an H200 "
            "llama-1b ran 0.4-0.5%% faster for about 25 s more compile: opt-in, for runs of hours"
        ),
    )
    # None: "model", or "block" under fsdp (trainer._compile)
    compile_unit: str | None = field(
        default=None,
        metadata=_flag(
            (
                "what one torch.compile covers: the whole model (default; one graph per step) or each "
                "transformer block plus the loss (regional: one block's compile serves every block, and DDP "
                "all-reduces each finished block's gradients during the backward); fsdp and zero3 compile blocks "
                "by default, and fsdp with model shards every weight inside the compiled graph instead of "
                "FSDP2's hooks between blocks"
            ),
            choices=COMPILE_UNITS,
        ),
    )
    compiled_autograd: bool = field(
        default=False,
        metadata=_flag(
            (
                "ddp, compiled: also compile the backward as one graph with DDP's gradient all-reduces inside it "
                "(PyTorch's compiled autograd), so the compiler can overlap them with the backward's kernels; "
                "one graph, not split at buckets. Measured on 4 H200s: it hides most of the all-reduce, yet its "
                "steps ran 0.3-3%% slower than the default's, so it stays opt-in"
            ),
            action="store_true",
        ),
    )
    # padded batches: 8 on GPUs, 1 on CPU
    pad_to_multiple_of: int | None = field(
        default=None,
        metadata=_flag(
            "classification: round each batch's padded length up to a multiple of this (default: 8 on GPUs, 1 on CPU)"
        ),
    )
    # 2 on GPUs (batches prepared ahead), 0 on CPU
    num_workers: int | None = field(default=None, metadata=_flag("data loader workers (default: 2 on GPUs, 0 on CPU)"))
    sdpa_backend: str = field(
        default="auto",
        metadata=_flag(
            "attention kernel for SDPA models (auto: PyTorch's choice, without cuDNN for padded batches)",
            choices=("auto", "flash", "cudnn", "efficient", "math"),
        ),
    )
    fused_ce: bool = field(
        default=False,
        metadata=_flag("causal-lm: chunked LM head + cross-entropy that never materialises the full logits"),
    )
    lm_loss: str = field(
        default="fast",
        metadata=_flag(
            (
                "causal-lm: fast computes the LM head's loss and its gradient in one pass where it applies (DDP, "
                "one process or fsdp in the compiled graph; bf16 or fp32; GPT-2/Llama/Mistral/Qwen heads); model "
                "keeps the model's own loss"
            ),
            choices=("fast", "model"),
        ),
    )
    ce_kernel: str = field(
        default="chunked",
        metadata=_flag(
            "--fused-ce implementation: our chunked one, or liger-kernel's (must be installed)",
            choices=("chunked", "liger"),
        ),
    )
    ddp_reduce_dtype: str = field(
        default="fp32",
        metadata=_flag(
            (
                "ddp: dtype of the gradient all-reduce (bf16/fp16 halve the bytes; gradients are averaged in "
                "that precision)"
            ),
            choices=("fp32", "bf16", "fp16"),
        ),
    )
    # ddp and single keep fp32 weights under bf16 autocast, so the stream between blocks is fp32
    # unless each block's input is cast (residual_stream_bf16: auto's rule)
    residual_dtype: str = field(
        default=AUTO,
        metadata=_flag(
            (
                "ddp and single under --precision bf16 or fp8: the dtype of the hidden states between the "
                "transformer blocks (the residual stream). auto (default): bf16 for Llama, Mistral and Qwen "
                "causal LMs (llama-1b: 2%% faster, 2-4 GiB less, the same eval loss over four 400-step runs), "
                "fp32 for the rest; fp32: autocast over fp32 weights; bf16: each block's input cast, half the "
                "bytes through the norms and adds (fsdp and ZeRO, whose weights are 16-bit, already run it)"
            ),
            choices=(AUTO, "fp32", "bf16"),
        ),
    )
    # training/fusion.py: Llama-style models' q/k/v and gate/up projections, each group one matmul
    fuse_projections: bool = field(
        default=False,
        metadata=_flag(
            "ddp and single, Llama/Mistral/Qwen2/Qwen3 models: each attention's q, k and v projections as "
            "one matmul, and each MLP's gate and up projections as another (the saved model keeps its layers)"
        ),
    )
    # training/rope.py: the rotary cos/sin tables as one op, not inlined into every layer's kernels.
    # None: on where the model is compiled (rope_tables_wanted, the trainer's rule and the pricing's)
    rope_tables: bool | None = field(
        default=None,
        metadata=_flag(
            "models with transformers' rotary embedding (Llama, Mistral, Qwen, ...) of a fixed-frequency rope "
            "type: compute its cos and sin once a forward, as an op the compiler reads from, where a "
            "compiled model otherwise recomputes them inside every layer's q/k rotation (the same values; "
            "default: on where the model is compiled, llama-1b 1.1-1.8%% faster on an H200 in bf16 and fp8)"
        ),
    )
    # 25 eager, 1000 with --compile (strategies.ddp_bucket_mb)
    ddp_bucket_mb: int | None = field(
        default=None,
        metadata=_flag(
            "ddp: gradient bucket size in MB; all-reduces start bucket by bucket during backward (default: "
            "25, or 1000 with --compile, where each bucket also splits the compiled graph; 25 still where "
            "GPUs meet over a link slower than NVLink: several nodes, PCIe-only cards, NCCL_P2P_DISABLE)"
        ),
    )
    zero3_block_fetch: bool = field(
        default=True,
        metadata=_flag(
            "zero3: gather each transformer block's parameters at once (the model's _no_split_modules), not "
            "layer by layer"
        ),
    )
    # None: the whole model one unit for a small compiled model (strategies.fsdp_one_unit), else
    # units of ~100M parameters (strategies.fsdp_blocks_per_unit)
    fsdp_blocks_per_unit: int | None = field(
        default=None,
        metadata=_flag(
            (
                "fsdp: consecutive transformer blocks sharded, gathered and reduced as one unit (default: 0 for "
                "a compiled model of at most 150M parameters, else units of about 100M parameters; 1 for the "
                "least memory; 0 for none: the whole model one unit, compiled whole)"
            ),
            metavar="N",
        ),
    )
    mlm_probability: float = field(
        default=0.15, metadata=_flag("masked-lm: the share of tokens masked (default: %(default)g)")
    )
    profile_steps: str | None = field(
        default=None,
        metadata=_flag(
            "profile these optimizer steps with torch.profiler; the table goes to the output folder",
            metavar="START:END",
        ),
    )
    # when
    log_every: int = field(
        default=10, metadata=_flag("optimizer steps between step lines and metrics records (default: %(default)s)")
    )
    eval_every: int | None = field(default=None, metadata=_flag("steps between evaluations (always one at the end)"))
    save_every: int | None = field(default=None, metadata=_flag("steps between checkpoints (also saved on SIGTERM)"))
    keep_checkpoints: int = field(
        default=2,
        metadata=_flag(
            "the newest checkpoints kept; older ones are deleted as new ones are saved (default: %(default)s)"
        ),
    )
    # seconds a stop waits for the step boundary and its save
    stop_grace: float = field(
        default=DEFAULT_STOP_GRACE_S,
        metadata=_flag(
            (
                "on SIGTERM/Ctrl-C, how long the step in progress may take to end and its checkpoint to be "
                "saved; after that every process exits (code 124) saying no checkpoint was saved (default: "
                "%(default)g)"
            ),
            metavar="SECONDS",
        ),
    )
    # seconds a collective waits for a peer
    collective_timeout: float = field(
        default=DEFAULT_COLLECTIVE_TIMEOUT_S,
        metadata=_flag(
            (
                "how long a collective (all-reduce, barrier) waits for a peer that never comes before the job "
                "fails; also bounds what the main process does while the others wait, such as preparing the data "
                "(default: %(default)g)"
            ),
            metavar="SECONDS",
        ),
    )
    # where results go
    report_to: str = field(
        default="wandb",
        metadata=_flag(
            ("where metrics go besides metrics.jsonl: W&B (offline without a key) or nowhere (default: %(default)s)"),
            choices=("wandb", "none"),
        ),
    )
    wandb_project: str = field(default="distrain-cloud", metadata=_flag("the W&B project (default: %(default)s)"))
    wandb_entity: str | None = field(default=None, metadata=_flag("the W&B team or user (default: the key's own)"))
    run_name: str | None = field(default=None, metadata=_flag("the W&B run's display name (default: the job's name)"))
    save_model: bool = field(
        default=True, metadata=_flag("write the final model to the model folder (--no-save-model for benchmarks)")
    )
    push_to_hub: str | None = field(
        default=None, metadata=_flag("push the final model to this Hub repo (token from HF_TOKEN)", metavar="REPO")
    )
    # a repo --push-to-hub creates is private
    hub_private: bool = field(
        default=False, metadata=_flag("create the --push-to-hub repo private (a repo that exists keeps its visibility)")
    )
    # the branch --push-to-hub commits to (None: main)
    hub_revision: str | None = field(
        default=None,
        metadata=_flag(
            "the --push-to-hub branch to commit to, created from main if missing (default: main)", metavar="BRANCH"
        ),
    )
    generate_prompt: str = field(
        default="The",
        metadata=_flag(
            "causal-lm: the text the sample generated from the saved model starts with (default: %(default)r)"
        ),
    )
    generate_tokens: int = field(
        default=24,
        metadata=_flag(
            "causal-lm: tokens of the sample generated from the saved model (default: %(default)s; 0: no sample)"
        ),
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        raise ArgumentError(message)


def rope_tables_wanted(a: TrainArgs, compiled: bool) -> bool:
    """Whether a run of `a` tables RoPE's cos and sin (training/rope.py): --rope-tables, or auto's
    pick where the model is compiled (eager, the module computes them once a forward already)."""
    return a.rope_tables if a.rope_tables is not None else compiled


# What --fp8-bf16-layers auto keeps bf16 on the native float8 layers: attention's query and key
# projections. llama-1b on an H200 after 200 steps at micro-batch 16 on non-repeated text
# (bench/README.md, session 36), with --fp8-grad-dtype e4m3: eval loss 0.3% above bf16's (four runs
# against three) where the recipe before it was 5.8% above (five runs), at 0.97x its speed.
FP8_AUTO_BF16_LAYERS = ("q_proj", "k_proj")


def fp8_bf16_layer_names(a: TrainArgs, linear_names: Collection[str] | None = None) -> tuple[str, ...]:
    """--fp8-bf16-layers as names (validated by the args' checks), in the order given; none: ().
    auto (as fp8_auto_recipe left it, on the native layers): FP8_AUTO_BF16_LAYERS where each names
    one of the model's linear layers, `linear_names` (None: the model not loaded, taken as named)."""
    if a.fp8_bf16_layers in ("", "none"):
        return ()
    if a.fp8_bf16_layers == AUTO:
        known = linear_names is None or all(n in linear_names for n in FP8_AUTO_BF16_LAYERS)
        return FP8_AUTO_BF16_LAYERS if known else ()
    return tuple(dict.fromkeys(a.fp8_bf16_layers.split(",")))


def fp8_linear_of(a: TrainArgs) -> str:
    """Whose float8 linear layers the run uses: --fp8-linear, or for auto native (the tensorwise
    recipe with no torchao, 1.1% faster than torchao's on llama-1b, bench/README.md session 22)
    unless --fp8-recipe names one of torchao's rowwise recipes."""
    if a.fp8_linear != AUTO:
        return a.fp8_linear
    return "native" if a.fp8_recipe == "tensorwise" else "torchao"


HEAD_FLAGS = ("fp8_head_grad_input", "fp8_head_forward", "fp8_head_backward")  # they shape the float8 head


def fp8_auto_recipe(a: TrainArgs, head_why_not: str | None) -> tuple[TrainArgs, str | None]:
    """`a` with --fp8-head, --fp8-head-backward, --fp8-fast-accum and --fp8-grad-dtype concrete under
    --precision fp8 (as given otherwise: they apply to fp8 alone), --fp8-bf16-layers auto left for the
    loaded model's names on the native layers (fp8_bf16_layer_names) and none on torchao's, and why
    auto left the LM head bf16, if it did.
    `head_why_not`: why the run cannot multiply its head in float8 (the flags' or the loaded model's
    reason), None where it can or the model is not loaded yet.

    auto's recipe, on the native float8 layers: the head's forward matmul in float8, its backward
    bf16, and the input gradients' matmuls in fast accumulation. llama-1b on an H200 (bench/README.md,
    sessions 31-33): 1.30-1.31x bf16 at micro-batch 32 and 1.28-1.29x at 16, 3.2-3.9% faster than
    the recipe it replaced (the head bf16, every backward matmul exact), and an eval loss after 400
    steps 1.3% under bf16's (four runs). Where the head cannot be float8, the layers' part stays.
    Since session 36 the layers' output gradients in e4m3 and attention's query and key projections
    bf16 (FP8_AUTO_BF16_LAYERS): at micro-batch 16 the recipe without them trained 5.8% above bf16's
    loss. torchao's layers (the rowwise recipes) keep their own configuration: measured without these."""
    if a.precision != "fp8":
        return a, None
    native = fp8_linear_of(a) == "native"
    head, why = a.fp8_head, None
    if head is None:
        if any(getattr(a, name) != getattr(TrainArgs, name) for name in HEAD_FLAGS):
            head = True  # the head's own flags ask for it
        else:
            if not native:
                why = "torchao's float8 layers: the recipe was measured on the native ones"
            elif a.fp8_bf16_edge_blocks:
                why = "--fp8-bf16-edge-blocks keeps the first and last blocks bf16, and the head with them"
            else:
                why = head_why_not
            head = why is None
    backward = a.fp8_head_backward
    if backward == AUTO:  # bf16 where the forward is float8 and no other part of the backward is asked bf16
        forward_only = head and a.fp8_head_forward == "fp8" and a.fp8_head_grad_input == "fp8"
        backward = "bf16" if forward_only else "fp8"
    accum = a.fp8_fast_accum
    if accum == AUTO:
        accum = "grad-input" if native else "none"
    # e4m3 gradients and bf16 query and key projections (FP8_AUTO_BF16_LAYERS) on the native layers;
    # the model's names decide the layers once it is loaded (fp8_bf16_layer_names)
    grads = "e4m3" if a.fp8_grad_dtype == AUTO and native else a.fp8_grad_dtype  # torchao's: their recipe's
    layers = a.fp8_bf16_layers if a.fp8_bf16_layers != AUTO or native else "none"
    return (
        replace(a, fp8_head=head, fp8_head_backward=backward, fp8_fast_accum=accum, fp8_grad_dtype=grads,
                fp8_bf16_layers=layers),
        why,
    )  # fmt: skip


# Decoders built as Llama is: pre-norm blocks with RMSNorm, grouped-query attention through q/k/v/o
# projections, a SwiGLU MLP of gate/up/down, no position table (transformers'
# modeling_{llama,mistral,qwen2,qwen3}.py). The trainer's fast paths (the bf16 residual stream,
# fused projections, the one-pass head loss) and the launcher's parameter formula take these.
LLAMA_SHAPED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Where --residual-dtype auto runs the stream in bf16: its loss after 400 steps was measured with it
# (llama-1b, bench/README.md session 25)
RESIDUAL_BF16_MODELS = LLAMA_SHAPED_MODEL_TYPES


def residual_stream_bf16(a: TrainArgs, strategy: str, model_type: str | None) -> bool:
    """Whether a run of `a` under `strategy` (as resolved) casts each block's input to bf16: asked
    for (--residual-dtype bf16), or auto's pick, a causal LM of RESIDUAL_BF16_MODELS under bf16
    autocast over fp32 weights (ddp, single; `a.precision` resolved). The sharded engines' 16-bit
    weights make the stream bf16 with no cast."""
    if strategy not in ("ddp", "single") or a.residual_dtype == "fp32":
        return False
    if a.residual_dtype == "bf16":
        return True
    return a.precision in ("bf16", "fp8") and a.task == "causal-lm" and model_type in RESIDUAL_BF16_MODELS


FP8_FIELDS = (  # the --fp8-* settings: they apply to --precision fp8 alone
    "fp8_recipe",
    "fp8_bf16_edge_blocks",
    "fp8_bf16_layers",
    "fp8_fast_accum",
    "fp8_linear",
    "fp8_scaling",
    "fp8_grad_dtype",
    "fp8_head",
    *HEAD_FLAGS,
)


def fp8_flags_given(a: TrainArgs) -> list[str]:
    """The --fp8-* flags `a` sets away from their defaults (they apply to --precision fp8 only)."""
    return [f"--{name.replace('_', '-')}" for name in FP8_FIELDS if getattr(a, name) != getattr(TrainArgs, name)]


def in_bf16(a: TrainArgs) -> TrainArgs:
    """`a` under --precision bf16, its --fp8-* settings (given, or as fp8_auto_recipe decided them)
    back to their defaults."""
    return replace(a, precision="bf16", **{name: getattr(TrainArgs, name) for name in FP8_FIELDS})


def build_parser() -> argparse.ArgumentParser:
    """The training flags, one for each TrainArgs field and in its order, named as the field with
    dashes: the field's default, int or float as annotated (a bool is a pair, --compile/--no-compile,
    unless its metadata gives another action), and the help, choices and metavar of its `_flag`."""
    # No abbreviations: a saved command's `--rope-table` would otherwise mean --rope-tables until a
    # later flag shares the prefix, then fail (or mean another flag)
    p = _Parser(
        allow_abbrev=False,
        prog="distrain-train",
        description="Fine-tune or train a Hugging Face transformer with Accelerate (the job entry point).",
    )
    titles = {first: title for title, first in _GROUPS}
    group: Any = p
    for f in fields(TrainArgs):
        if f.name in titles:
            group = p.add_argument_group(titles[f.name])
        options = dict(f.metadata)
        annotation = str(f.type)  # its text (`from __future__ import annotations`): "int | None", ...
        if annotation.startswith("bool"):
            options.setdefault("action", argparse.BooleanOptionalAction)
        elif annotation.startswith(("int", "float")):
            options["type"] = int if annotation.startswith("int") else float
        group.add_argument("--" + f.name.replace("_", "-"), default=f.default, **options)
    return p


def known_flags() -> set[str]:
    """The training flags, without their dashes (for the launcher's hyperparameter check)."""
    return {f.name.replace("_", "-") for f in fields(TrainArgs)}


def _numbers_attached(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """`argv` with each negative number given to a numeric flag attached to it: `--lr -1e-4`
    becomes `--lr=-1e-4`. argparse takes a value that starts with "-" for an option unless it
    looks like a plain negative number (`-1`, `-0.5`, not `-1e-4` nor `-inf`) and then says
    "expected one argument" instead of what is wrong with the number; attached, any value
    reaches the flag's type and validate() names the problem."""
    numeric = {
        option: action.type
        for action in parser._actions  # argparse has no public way to list its options
        if action.type in (int, float) and action.nargs is None
        for option in action.option_strings
    }
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        kind = numeric.get(item)
        if kind is not None and i + 1 < len(items) and items[i + 1].startswith("-") and _parses(kind, items[i + 1]):
            out.append(f"{item}={items[i + 1]}")
            i += 2
            continue
        if item == "--":  # what follows is not ours to read
            out += items[i:]
            break
        out.append(item)
        i += 1
    return out


def _parses(kind: Any, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    return parser.parse_args(_numbers_attached(parser, argv))


def parse_args(argv: Sequence[str] | None = None) -> TrainArgs:
    ns = _parse(list(sys.argv[1:] if argv is None else argv))
    args = TrainArgs(**vars(ns))
    validate(args)
    return args


def parse_flags(argv: Sequence[str]) -> tuple[TrainArgs, dict[str, str]]:
    """One parse of `argv` for a plan: parse_args's arguments and argv_to_hyperparameters's map
    (read before validate fills in a default --lr, which the map leaves to the job)."""
    ns = vars(_parse(list(argv)))
    hyperparameters = _non_defaults(ns)
    args = TrainArgs(**ns)
    validate(args)
    return args, hyperparameters


# The flags that name data files; a --dataset is a path where one exists, or where it looks like one.
DATA_FILE_FLAGS = ("--train-file", "--validation-file")
DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet", ".txt")


def exists_here(path: Path, test: Callable[[Path], bool] = Path.exists) -> bool:
    """`test(path)` (Path.exists, is_file or is_dir) for a path a user typed, False where this
    machine's file system cannot hold the name: pathlib raises for one too long (ENAMETOOLONG)
    where it answers False for one that is missing, before Python 3.14."""
    try:
        return test(path)
    except OSError:
        return False


def is_data_path(flag: str, value: str, cwd: Path) -> bool:
    """Whether `value` given to `flag` names a file or folder (not a Hub id nor a builtin:),
    read from `cwd`: what data.resolve_sources will take for a path."""
    if flag in DATA_FILE_FLAGS:
        return True
    if flag != "--dataset" or value.startswith("builtin:"):
        return False
    path = Path(value).expanduser()
    return value.startswith(("/", ".", "~")) or value.endswith(DATA_SUFFIXES) or exists_here(cwd / path)


def absolute_data_paths(argv: Sequence[str], cwd: Path) -> list[str]:
    """`argv` with each relative data path (--train-file, --validation-file, a --dataset that
    is_data_path) made absolute against `cwd`, where the user typed it: a local job runs in a
    folder of its own, where the relative path would name nothing."""
    out = list(argv)
    for i, item in enumerate(out):
        flag, eq, value = item.partition("=")
        if eq:
            index = i
        elif i + 1 < len(out):
            flag, value, index = item, out[i + 1], i + 1
        else:
            continue
        if flag not in (*DATA_FILE_FLAGS, "--dataset") or not is_data_path(flag, value, cwd):
            continue
        path = Path(value).expanduser()
        path = path if path.is_absolute() else (cwd / path).resolve()
        if str(path) != value:
            out[index] = f"{flag}={path}" if eq else str(path)
    return out


def config_overrides(a: TrainArgs) -> dict[str, str]:
    """--config-overrides as {name: value text}, in transformers' `update_from_string` form."""
    pairs: dict[str, str] = {}
    if a.config_overrides is None:
        return pairs
    for item in a.config_overrides.split(","):
        key, eq, value = item.partition("=")
        if not (eq and key.strip() and value.strip()):
            raise ArgumentError(
                f"--config-overrides expects KEY=VALUE pairs separated by commas, e.g. 'attn_pdrop=0', got {item!r}"
            )
        pairs[key.strip()] = value.strip()
    return pairs


def default_lr(a: TrainArgs) -> float:
    """The learning rate without --lr: 5e-5 fine-tuning a pretrained --model, 1e-3 training from a config."""
    return 5e-5 if a.model else 1e-3


def validate(a: TrainArgs) -> None:
    if a.lr is None:
        a.lr = default_lr(a)
    sources = [n for n, v in (("--model", a.model), ("--model-config", a.model_config), ("--preset", a.preset)) if v]
    if len(sources) > 1:
        raise ArgumentError(f"give one of --model, --model-config, --preset, not {' and '.join(sources)}")
    config_overrides(a)  # the form here; the names once the config exists (modeling.build_config)
    if a.dataset and a.train_file:
        raise ArgumentError("give --dataset or --train-file, not both")
    positive = ("batch_size", "grad_accum", "log_every", "keep_checkpoints", "max_length", "block_size")
    for name in positive:
        if getattr(a, name) < 1:
            raise ArgumentError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    for name in (
        "pad_to_multiple_of",
        "eval_every",
        "save_every",
        "max_steps",
        "eval_batch_size",
        "max_train_samples",
        "max_eval_samples",
    ):
        value = getattr(a, name)
        if value is not None and value < 1:
            if name == "max_steps":  # 0 would train nothing and report the job completed
                raise ArgumentError(
                    f"--max-steps {value} trains nothing: give at least 1 (e.g. --max-steps 100), "
                    "or leave it out to train --epochs"
                )
            raise ArgumentError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if a.fused_ce and (a.task != "causal-lm" or a.strategy.startswith("zero3")):
        raise ArgumentError("--fused-ce applies to --task causal-lm without ZeRO-3 (whose LM head is sharded)")
    if a.ce_kernel != "chunked" and not a.fused_ce:
        raise ArgumentError(f"--ce-kernel {a.ce_kernel} picks the --fused-ce implementation; add --fused-ce")
    if a.ddp_reduce_dtype != "fp32" and a.strategy not in ("ddp", AUTO):
        raise ArgumentError(
            f"--ddp-reduce-dtype applies to --strategy ddp, not {a.strategy} "
            "(DeepSpeed reduces in the training precision)"
        )
    if a.residual_dtype == "bf16":
        if a.precision not in ("bf16", "fp8"):
            raise ArgumentError(
                f"--residual-dtype bf16 applies to --precision bf16 or fp8 (bf16 autocast), not "
                f"{a.precision or 'the default precision'}: add --precision bf16"
            )
        if a.strategy not in ("ddp", "single", AUTO):
            raise ArgumentError(
                f"--residual-dtype bf16 applies to --strategy ddp or single: {a.strategy} already runs the "
                "residual stream in bf16 (its weights are 16-bit); drop --residual-dtype"
            )
    if a.fuse_projections:
        if a.strategy not in ("ddp", "single", AUTO):
            raise ArgumentError(
                f"--fuse-projections applies to --strategy ddp or single, not {a.strategy} (a sharded "
                "engine gathers each layer's weights for that layer's own call); drop --fuse-projections"
            )
        if a.precision == "fp8" and (fp8_linear_of(a) != "native" or a.fp8_scaling == "delayed"):
            raise ArgumentError(
                "--fuse-projections under --precision fp8 fuses the native float8 layers with dynamic scaling: "
                "drop --fp8-linear torchao, a rowwise --fp8-recipe and --fp8-scaling delayed, or --fuse-projections"
            )
    if a.fsdp_blocks_per_unit is not None and a.strategy != "fsdp":
        raise ArgumentError(f"--fsdp-blocks-per-unit applies to --strategy fsdp, not {a.strategy}")
    if a.fsdp_blocks_per_unit is not None and a.fsdp_blocks_per_unit < 0:
        raise ArgumentError(f"--fsdp-blocks-per-unit must be 0 or more, got {a.fsdp_blocks_per_unit}")
    if a.fsdp_blocks_per_unit == 0 and a.compile_unit == "block":
        raise ArgumentError(
            "--fsdp-blocks-per-unit 0 makes the whole model one FSDP2 unit, compiled whole: drop --compile-unit block"
        )
    if a.warmup_steps < 0:  # the schedule would start above the peak learning rate
        raise ArgumentError(f"--warmup-steps must be 0 (no warmup) or more, got {a.warmup_steps}")
    if a.generate_tokens < 0:
        raise ArgumentError(f"--generate-tokens must be 0 (no sample) or more, got {a.generate_tokens}")
    if a.ddp_bucket_mb is not None and a.ddp_bucket_mb < 1:
        raise ArgumentError(f"--ddp-bucket-mb must be at least 1, got {a.ddp_bucket_mb}")
    if a.compile_mode != "default" and a.compile is False:
        raise ArgumentError(f"--compile-mode {a.compile_mode} contradicts --no-compile")
    if a.compile_tuning and a.compile is False:
        raise ArgumentError("--compile-tuning contradicts --no-compile")
    if a.compile_optimizer:
        if a.compile is False:
            raise ArgumentError("--compile-optimizer contradicts --no-compile")
        if a.precision == "fp16":
            raise ArgumentError(
                "--compile-optimizer: not with --precision fp16, whose loss scaler unscales the gradients between "
                "the backward and the step; use bf16"
            )
        if provisional_strategy(a.strategy).shards_state:
            raise ArgumentError(
                f"--compile-optimizer applies to --strategy ddp or single (the sharded strategies clip their "
                f"shards), not {a.strategy}"
            )
    if a.compile_unit is not None:
        if a.compile is False:
            raise ArgumentError(f"--compile-unit {a.compile_unit} contradicts --no-compile")
        if a.compile_unit == "model" and a.strategy == "fsdp" and a.fsdp_blocks_per_unit is not None:
            raise ArgumentError(
                "--fsdp-blocks-per-unit applies to fsdp's FSDP2 units (--compile-unit block, its default); "
                "--compile-unit model shards every weight inside the compiled graph instead"
            )
        strategy = provisional_strategy(a.strategy)
        if a.compile_unit == "block" and strategy.uses_deepspeed and strategy not in BLOCK_COMPILED:
            raise ArgumentError(
                f"--compile-unit block applies to --strategy ddp, single, fsdp, zero3 or zero3-offload, "
                f"not {a.strategy} (ZeRO-1/2 compile the whole model inside DeepSpeed's engine)"
            )
    if a.precision == "fp8" and a.strategy != AUTO and not takes_fp8(provisional_strategy(a.strategy)):
        # the engines' facts (engines/facts.py). auto: fp8 pins it to ddp (strategies.resolve_auto),
        # unless a resumed checkpoint says otherwise (decisions.decide refuses it then)
        raise ArgumentError(
            f"--precision fp8 runs under --strategy ddp or single, not {a.strategy}: add --strategy ddp"
        )
    given = fp8_flags_given(a)
    if a.precision != "fp8" and given:
        flag = given[0]
        raise ArgumentError(f"{flag} applies to --precision fp8, not {a.precision or 'the default precision'}")
    for name in HEAD_FLAGS:  # "fp8" is what a head left bf16 resolves them to (fp8_auto_recipe)
        if getattr(a, name) == "bf16" and a.fp8_head is False:
            flag = "--" + name.replace("_", "-")
            raise ArgumentError(f"{flag} applies to the LM head in float8, which --no-fp8-head turns off: drop {flag}")
    if a.fp8_head_backward == "bf16" and a.fp8_head_forward == "bf16":
        raise ArgumentError(
            "--fp8-head-forward bf16 with --fp8-head-backward bf16 leaves none of the LM head's matmuls in float8: "
            "drop --fp8-head and both"
        )
    if a.fp8_head_backward == "bf16" and a.fp8_head_grad_input == "bf16":
        raise ArgumentError(
            "--fp8-head-backward bf16 already makes the head's input gradient bf16: drop --fp8-head-grad-input"
        )
    if a.fp8_bf16_edge_blocks < 0:
        raise ArgumentError(f"--fp8-bf16-edge-blocks must be 0 or more, got {a.fp8_bf16_edge_blocks}")
    names = a.fp8_bf16_layers.split(",")
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_]\w*", n)]
    if a.fp8_bf16_layers not in (AUTO, "none") and (bad or {AUTO, "none"} & set(names)):
        raise ArgumentError(
            f"--fp8-bf16-layers takes layer names, comma-separated with no spaces (q_proj,k_proj), none or auto, "
            f"not {a.fp8_bf16_layers!r}"
        )
    if a.fp8_linear == "native" and a.fp8_recipe != "tensorwise":
        raise ArgumentError(
            f"--fp8-linear native scales tensorwise only; --fp8-recipe {a.fp8_recipe} is torchao's: "
            "drop --fp8-linear native or --fp8-recipe"
        )
    if a.fp8_scaling == "delayed" and fp8_linear_of(a) != "native":
        torchaos = {"--fp8-linear torchao": a.fp8_linear == "torchao", "--fp8-recipe": a.fp8_recipe != "tensorwise"}
        why = " and ".join(flag for flag, given in torchaos.items() if given)
        raise ArgumentError(f"--fp8-scaling delayed runs on the native float8 layers, not torchao's: drop {why}")
    if a.fp8_grad_dtype != AUTO and fp8_linear_of(a) != "native":
        raise ArgumentError(
            f"--fp8-grad-dtype {a.fp8_grad_dtype} applies to the native float8 layers; torchao's recipes pick their "
            "own (rowwise: e4m3): drop --fp8-grad-dtype, or --fp8-linear torchao and a rowwise --fp8-recipe"
        )
    if a.compiled_autograd:
        if a.strategy not in ("ddp", "single", AUTO):
            raise ArgumentError(f"--compiled-autograd applies to --strategy ddp or single, not {a.strategy}")
        if a.compile is False:
            raise ArgumentError("--compiled-autograd contradicts --no-compile")
        if a.compile_unit == "block":
            raise ArgumentError("--compiled-autograd compiles the whole model's backward; drop --compile-unit block")
        if a.ddp_reduce_dtype != "fp32":
            raise ArgumentError(
                f"--compiled-autograd traces DDP's own all-reduce; drop --ddp-reduce-dtype {a.ddp_reduce_dtype}"
            )
    if a.push_to_hub and not a.save_model:
        raise ArgumentError("--push-to-hub needs the saved model; drop --no-save-model")
    if a.push_to_hub is not None:  # offline, before the run: a repo that cannot exist fails only at the push
        problem = repo_id_problem(a.push_to_hub)
        if problem:
            raise ArgumentError(f"--push-to-hub {a.push_to_hub!r} is not a Hub repo id: {problem}")
    if a.hub_private and not a.push_to_hub:
        raise ArgumentError("--hub-private applies to the repo --push-to-hub REPO creates; add --push-to-hub REPO")
    if a.hub_revision is not None:
        if not a.push_to_hub:
            raise ArgumentError("--hub-revision names a branch of the --push-to-hub REPO; add --push-to-hub REPO")
        problem = branch_problem(a.hub_revision)
        if problem:
            raise ArgumentError(f"--hub-revision {a.hub_revision!r}: {problem}")
    if a.profile_steps is not None:
        start, sep, end = a.profile_steps.partition(":")
        if not (sep and start.isdigit() and end.isdigit() and int(start) < int(end)):
            raise ArgumentError(f"--profile-steps expects START:END with START < END, got {a.profile_steps!r}")
    for name in ("stop_grace", "collective_timeout"):
        value = getattr(a, name)
        if not 0 < value < float("inf"):  # also refuses nan
            raise ArgumentError(f"--{name.replace('_', '-')} must be a positive number of seconds, got {value}")
    if not 0.0 < a.validation_fraction < 1.0:
        raise ArgumentError(f"--validation-fraction must be between 0 and 1, got {a.validation_fraction}")
    if a.epochs <= 0:
        raise ArgumentError(f"--epochs must be positive, got {a.epochs}")
    if a.task == "masked-lm" and not 0.0 < a.mlm_probability < 1.0:
        raise ArgumentError(f"--mlm-probability must be between 0 and 1, got {a.mlm_probability}")


_REPO_RULES = (
    "a repo id is NAME or NAMESPACE/NAME, each 1-96 letters, digits, '-', '_' or '.', not starting or "
    "ending with '-' or '.', with no '--' or '..' and not ending in .git, e.g. me/tiny-gpt2"
)
_REPO_PART = re.compile(r"(?!.*(--|\.\.))[\w.-]{1,96}", re.ASCII)


def repo_id_problem(repo_id: str) -> str | None:
    """Why `repo_id` cannot name a Hub repo, or None: huggingface_hub's own offline check
    (validate_repo_id), where it is installed (training always; a lean launcher may lack it), else
    the same documented rules. Our words either way, the rules rather than its message."""
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        parts = repo_id.split("/")
        ok = len(parts) <= 2 and all(
            _REPO_PART.fullmatch(p) and not p.startswith(("-", ".")) and not p.endswith(("-", ".")) for p in parts
        )
        return None if ok and not repo_id.endswith(".git") else _REPO_RULES
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return _REPO_RULES
    return None


def branch_problem(name: str) -> str | None:
    """Why `name` cannot be a branch to push to (git's ref rules, and the Hub's: no pull-request
    refs), or None."""
    if not _BRANCH.fullmatch(name) or ".." in name or "//" in name or name.endswith((".lock", "/", ".")):
        return "a branch is letters, digits and . _ - / (no '..', not starting with - or /), e.g. v2 or exp/lr-3e-4"
    if name.startswith("refs/"):
        return "give the branch name itself (v2), not a refs/ path; pull-request refs cannot be pushed to"
    return None


def hyperparameters_to_argv(hyperparameters: dict[str, Any]) -> list[str]:
    """{"batch_size": 8, "compile": True} -> ["--batch-size", "8", "--compile"].

    SageMaker hands hyperparameters back as strings, so "true"/"false" count as booleans
    for the boolean flags.
    """
    booleans = {f.name for f in fields(TrainArgs) if f.type in ("bool", "bool | None")}
    argv: list[str] = []
    for key, value in hyperparameters.items():
        flag = "--" + key.replace("_", "-")
        if key.replace("-", "_") in booleans and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        elif value is None:
            continue
        else:
            argv += [flag, str(value)]
    return argv


def argv_to_hyperparameters(argv: Sequence[str]) -> dict[str, str]:
    """Training flags -> the string map a SageMaker request carries (only non-defaults).

    Round-trips with hyperparameters_to_argv: the job turns the map back into the same flags.
    """
    return _non_defaults(vars(_parse(list(argv))))


def _non_defaults(ns: dict[str, Any]) -> dict[str, str]:
    defaults = TrainArgs().to_dict()
    out = {}
    for key, value in ns.items():
        if value != defaults[key] and value is not None:
            out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out
