"""Peak GPU memory per device of a training job, estimated before anything is paid for.

Torch-free and quick: every GPU plan calls it. The estimate is a sum of terms, each a count of
bytes with its reason, and a few constants fitted to measured peaks. The runs they were fitted
to are in bench/memory_runs.py and the fit in bench/memory_fit.py (which says how far off the
estimate is for each); the test checks every one against +-15% of its measured peak.

Names: P parameters, W processes (one per GPU) in all, B micro-batch, T sequence length,
L layers, d hidden size, V vocabulary. Bytes are per device.

Not modelled (the estimate says so where it matters): shapes other than GPT-2 and BERT-like
transformers (other --model ids are "not checked"); attention without a fused kernel (every
model here uses SDPA, which never keeps the T x T scores); CUDA graphs (--compile-mode
reduce-overhead, 25% more in the one run measured). The trainer has no gradient-checkpointing flag,
so there is no term for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .shape import ModelShape, shape_from_config

if TYPE_CHECKING:
    from distrain_cloud.training.args import TrainArgs
    from distrain_cloud.training.decisions import Decisions

    from .catalog import InstanceType
    from .plan import Check
    from .spec import JobSpec
    from .throughput import Throughput

GIB = 2**30
CHECK_NAME = "fits in GPU memory"

# ---------------------------------------------------------------------------------- models


# Hub models people fine-tune, from their config.json; any other --model is "not checked".
HUB_MODELS: dict[str, dict[str, Any]] = {
    "gpt2": {"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257},
    "distilgpt2": {"model_type": "gpt2", "n_layer": 6, "n_head": 12, "n_embd": 768, "vocab_size": 50257},
    "gpt2-medium": {"model_type": "gpt2", "n_layer": 24, "n_head": 16, "n_embd": 1024, "vocab_size": 50257},
    "gpt2-large": {"model_type": "gpt2", "n_layer": 36, "n_head": 20, "n_embd": 1280, "vocab_size": 50257},
    "gpt2-xl": {"model_type": "gpt2", "n_layer": 48, "n_head": 25, "n_embd": 1600, "vocab_size": 50257},
    "bert-base-uncased": {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
                          "intermediate_size": 3072, "vocab_size": 30522},
    "bert-base-cased": {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
                        "intermediate_size": 3072, "vocab_size": 28996},
    "bert-large-uncased": {"num_hidden_layers": 24, "num_attention_heads": 16, "hidden_size": 1024,
                           "intermediate_size": 4096, "vocab_size": 30522},
    "distilbert-base-uncased": {"n_layers": 6, "n_heads": 12, "dim": 768, "hidden_dim": 3072, "vocab_size": 30522},
    "roberta-base": {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
                     "intermediate_size": 3072, "vocab_size": 50265, "max_position_embeddings": 514},
    "roberta-large": {"num_hidden_layers": 24, "num_attention_heads": 16, "hidden_size": 1024,
                      "intermediate_size": 4096, "vocab_size": 50265, "max_position_embeddings": 514},
}  # fmt: skip
_HUB_ORGS = ("openai-community/", "google-bert/", "distilbert/", "FacebookAI/")


def model_shape(args: TrainArgs) -> ModelShape | None:
    """The shape of the model a job trains, --config-overrides applied as the trainer applies them,
    or None when the launcher cannot know it (a Hub id outside HUB_MODELS, a --model-config that is
    neither a local file nor in HUB_MODELS)."""
    from distrain_cloud.training.args import config_overrides, exists_here
    from distrain_cloud.training.modeling import PRESETS

    if args.model or args.model_config:
        source = str(args.model or args.model_config)
        name = next((source.removeprefix(org) for org in _HUB_ORGS if source.startswith(org)), source)
        path = Path(source) / "config.json" if args.model else Path(source)
        config = HUB_MODELS.get(name) or (_read_json(path) if exists_here(path, Path.is_file) else None)
    else:
        source = args.preset or "tiny-gpt2"
        config = PRESETS[source]
    if not config:
        return None
    # None too where an override makes a size no positive whole number: the plan's offline check
    # of the overrides says which, in transformers' words
    shape = shape_from_config(source, overridden(config, config_overrides(args)))
    if shape is None or shape == shape_from_config(source, config):
        return shape
    # resized by --config-overrides: not the model its name measured, and the plan says so
    return replace(shape, name=f"{source} (--config-overrides)")


def overrides_unsized(args: TrainArgs) -> str | None:
    """Where model_shape(args) is None because --config-overrides made a size no positive whole
    number (0, -3, 2.5, inf, text: the job could not build its model), what to tell the user."""
    if args.config_overrides and model_shape(replace(args, config_overrides=None)) is not None:
        return f"--config-overrides {args.config_overrides}: a model's sizes are positive whole numbers"
    return None


# GPT-2's config answers to the common names too (transformers' attribute_map): an override under
# either name sets the key its config.json holds
_CONFIG_ALIASES = {
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "max_position_embeddings": "n_positions",
}


def overridden(config: Mapping[str, Any], pairs: dict[str, str]) -> dict[str, Any]:
    """`config` with --config-overrides' values, typed as transformers' update_from_string types
    them (true/false, an integer, a number, else text); the trainer checks each name and type."""
    out = dict(config)
    for key, text in pairs.items():
        key = _CONFIG_ALIASES[key] if key in _CONFIG_ALIASES and _CONFIG_ALIASES[key] in out else key
        value: Any = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    continue
        out[key] = value
    return out


def planned_decisions(
    args: TrainArgs,
    *,
    world_size: int,
    nodes: int,
    gpu_model: str | None,
    cuda: bool | None = None,
    saved: dict[str, Any] | None = None,
) -> Decisions:
    """The job's decisions on this hardware (training/decisions.planned, with the model's size from
    model_shape): --strategy auto as the job will resolve it, the compile, the engine. A plan makes
    them once, here, and every part of it (configs, the memory check, the summary) reads them."""
    from distrain_cloud.infra.errors import value_errors_as_user_errors
    from distrain_cloud.training.decisions import planned

    shape = model_shape(args)
    # decide() refuses in one line what only it weighs: fp8 on a checkpoint trained sharded,
    # --fp8-head with --lm-loss model
    with value_errors_as_user_errors():
        return planned(
            args,
            world_size=world_size,
            nodes=nodes,
            gpu_model=gpu_model,
            cuda=cuda,
            saved=saved,
            params=shape.params if shape else None,
        )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------------------------- constants


@dataclass(frozen=True)
class Constants:
    """The fitted part of the estimate, per mode (see mode()).

    activation: bytes saved for the backward per token, per layer, per unit of hidden size.
      Theory for a 16-bit transformer with fused attention says 34 (Korthikanti et al. 2022,
      "Reducing Activation Recomputation in Large Transformer Models", less their score term).
    logits: bytes per token per vocabulary entry at the peak, language-model tasks only.
    zero3_fixed_gib: ZeRO-3's working set besides its gathered parameters.
    """

    activation: Mapping[str, float]
    logits: Mapping[str, float]
    zero3_fixed_gib: float


# Fitted by bench/memory_fit.py to the measured runs (least squares on relative error,
# one point per configuration) and rounded; the test fails when a new run moves the fit.
# - autocast (ddp/single, bf16/fp16): activation 91.9. Eager GPT-2 keeps far more than 34: its
#   gelu_new is seven elementwise ops, each saving a 4 d tensor, and under autocast the
#   residual stream and LayerNorm outputs are fp32. logits 11.4: the peak is where the backward
#   starts, with the loss's saved fp32 log-softmax (4), its gradient (4) and the gradient it
#   hands back (4): 12 by count.
# - compiled (torch.compile, and fsdp sharded inside the graph, which runs under autocast as DDP
#   does): activation 42.4 (session 28's runs on 2 H200s moved it from 42.3); Inductor fuses
#   those chains. Its logits term is
#   not fitted: with two model shapes the fit cannot tell it from the activations (it gave 0.2),
#   so it is set to 2, the bf16 gradient of the logits that must exist when the backward starts.
# - native (DeepSpeed, and eager fsdp: the model itself is bf16/fp16, no autocast): activation
#   48.9, logits 11.6, ZeRO-3 working set 2.1 GiB.
# - native-compiled (compiled fsdp, each block its own graph; compiled ZeRO-2 and ZeRO-3):
#   activation 33.5, near theory's 34: Inductor's fusion as for compiled, with the residual stream
#   and norms in 16 bits instead of autocast's fp32. Logits as compiled, plus the loss graph's
#   input under fsdp (see estimate()). The compiled fsdp runs (two shapes, eager and compiled
#   loss, units of 1 to 12 blocks) agree within 3%; compiled ZeRO-2 (GPT-2 small and XL) and
#   ZeRO-3 (GPT-2 small whole and by blocks, XL by blocks) on 4 GPUs, sessions 10 to 12, within
#   -4.8% to +9.2%. Session 19 added llama-8b on 4 H200s (seq 2048, micro-batch 4), which moved it
#   from 32.9: compiled FSDP2 measured 62.08 GiB (estimate +0.5%), compiled ZeRO-3 82.56 (-10.6%).
#   Session 28's compiled FSDP2 runs on 2 H200s (GPT-2 small, one unit and two) moved it from 33.3,
#   session 38's MLP-width term (MLP_BYTES: llama-8b's MLP is 3.5 d wide) from 33.5.
# - fp32 (--precision no): not measured. Every saved tensor at 4 bytes, twice native's
#   activations; the loss's tensors are fp32 already, as under autocast.
CONSTANTS = Constants(
    activation={"autocast": 91.9, "compiled": 42.4, "native": 48.9, "native-compiled": 33.9, "fp32": 97.0},
    logits={"autocast": 11.4, "compiled": 2.0, "native": 11.6, "native-compiled": 2.0, "fp32": 11.4},
    zero3_fixed_gib=2.1,
)
# Bytes a SwiGLU MLP saves per token, layer and element of its width (I), beside the constants'
# 4 d: what a width other than 4 d adds or takes away. bench/fp8_saved_bytes.py counts what autograd
# saves: compiled bf16 keeps 6 (the gate's and up's outputs, the activation's product), eager 8 (the
# SiLU's output too), exactly at I = 2 d, 4 d and 6 d; the native modes save the same tensors (the
# MLP's are 16-bit under autocast already), fp32 twice eager's. llama-1b with its MLP 6 d wide on an
# H200 (session 38) measured 6.75 compiled: the compiled peak within 5.3% with it, 17.3% under
# without. GPT-2's MLP (no gate) is 4 d wide unless a config says otherwise: its width is sized
# with the same bytes, not measured.
MLP_BYTES = {"autocast": 8.0, "compiled": 6.0, "native": 8.0, "native-compiled": 6.0, "fp32": 16.0}
# Eager (autocast) Llama-shaped blocks: llama-1b at micro-batch 8 on an H200 (session 38) measured
# 68.5 bytes per token, layer and unit of d with the bf16 residual stream, 72.5 before its 4 d cut;
# GPT-2's fitted 91.9 put the peak 18.7% over. One run, not fitted; the fp8 run beside it agrees
# with its derived term within 0.3 d.
LLAMA_EAGER_ACTIVATION = 72.5

# Trainer versions before training_forward (calibration rows only): under bf16, the compiled
# graph output the logits in fp32 (accelerate's conversion), and the backward zero-filled a
# gradient for them. Measured: 11.81 -> 8.74 GiB when dropped = 4.0 bytes x B T V.
LOGITS_OUTPUT_BYTES = 4.0
# Evaluation (no grad) returns the logits: their fp32 copy (4) and the loss's log-softmax (4)
# of one eval batch are alive at once. Derived: no measurement logs the evaluation's peak.
EVAL_LOGITS_BYTES = 8.0

# DeepSpeed's gradient buckets (deepspeed 0.19.8, the version measured): ZeRO-1/2 allocate two
# of reduce_bucket_size elements (double-buffered for overlap_comm), ZeRO-3 one; fp32 for
# ZeRO-1 (it stages the fp32 accumulator), the training dtype otherwise. strategies.py sets
# reduce_bucket_size to 5e8 elements, so ZeRO-2 holds 1.9 GiB of buckets whatever the model.
DS_BUCKET_ELEMENTS = 500_000_000
# ZeRO-3 keeps gathered 16-bit parameters live up to stage3_max_live_parameters (default 1e9):
# a model under that stays gathered whole after the first step.
ZERO3_MAX_LIVE = 1_000_000_000

# What the device needs beyond the tensors torch counts: the CUDA context, cuBLAS/cuDNN
# workspaces and NCCL's buffers (about 1 GiB) and the caching allocator's fragmentation (5%).
# nvidia-smi shows more for compiled and DeepSpeed runs (up to 2x torch's peak), but that is
# cache the allocator gives back and retries with before it reports out of memory.
DEVICE_OVERHEAD_GIB = 1.0
FRAGMENTATION = 0.05
# A card's usable memory is below its nominal size: GDDR cards with ECC on (T4, A10G, L4, L40S)
# reserve 1/16 of it (a T4 shows 15,360 MiB); HBM cards show nearly all (an H100 80GB reports
# 81,559 MiB, the H200s of bench/measurements 143,771).
USABLE_FRACTION = {"V100": 0.98, "A100": 0.98, "H100": 0.98, "H200": 0.98, "B200": 0.98}
USABLE_FRACTION_GDDR = 15 / 16


def usable_gib(instance: InstanceType) -> float:
    return instance.gpu_memory_gib * USABLE_FRACTION.get(instance.gpu_model or "", USABLE_FRACTION_GDDR)


def mode(engine: str, precision: str, compiled: bool) -> str:
    """Which constants apply: how the engine (a name of training/engines/facts.py) keeps the
    model's tensors decides what stays on the GPU."""
    from distrain_cloud.training.engines.facts import FACTS
    from distrain_cloud.training.strategies import Precision

    sixteen = Precision(precision).sixteen_bit
    # An engine that keeps a 16-bit model itself (DeepSpeed, FSDP2) wraps no autocast around it.
    native = sixteen and not FACTS[engine].autocast
    if compiled:
        return "native-compiled" if native else "compiled"
    if not sixteen:
        return "fp32"
    return "native" if native else "autocast"


# ---------------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Estimate:
    """GiB per device. `terms` add up to `train_gib`, the peak of a training step (what torch's
    max_memory_allocated shows); `device_gib` is what the GPU must hold."""

    terms: dict[str, float]
    eval_gib: float
    notes: tuple[str, ...] = field(default=())

    @property
    def train_gib(self) -> float:
        return sum(self.terms.values())

    @property
    def device_gib(self) -> float:
        return max(self.train_gib, self.eval_gib) * (1 + FRAGMENTATION) + DEVICE_OVERHEAD_GIB


def estimate(
    shape: ModelShape,
    *,
    strategy: str,
    precision: str,
    batch_size: int,
    seq_len: int,
    world_size: int,
    task: str = "causal-lm",
    compiled: bool = False,
    grad_accum: int = 1,
    eval_batch_size: int | None = None,
    fused_ce: bool = False,
    kv_cache: bool = False,
    logits_output: bool = False,
    eager_loss: bool = False,
    fsdp_blocks_per_unit: int | None = None,
    compile_unit: str | None = None,
    compiled_autograd: bool = False,
    head_loss: bool = False,
    fp8_head: bool = False,
    residual_bf16: bool = False,
    fp8_bf16_attention_input: bool = False,
    constants: Constants = CONSTANTS,
) -> Estimate:
    """Peak memory per device of a training step, and of the evaluation.

    `kv_cache` and `logits_output` describe the trainer before training_forward, `eager_loss`
    compiled fsdp before b51d550 (the blocks compiled, the loss not), for the calibration rows
    measured then; the trainer today does none of them.
    """
    P, W, tokens = shape.params, world_size, batch_size * seq_len
    L, d, V = shape.layers, shape.hidden, shape.vocab
    from distrain_cloud.training.engines.facts import engine_of
    from distrain_cloud.training.strategies import Precision, provisional_strategy

    mixed = Precision(precision).sixteen_bit
    stage = provisional_strategy(strategy).zero_stage
    offload = strategy.endswith("-offload")
    low = 2 if mixed else 4  # bytes of the model's own (or gathered) copy of a weight
    # strategies.fsdp_in_graph; FSDP2 with no units of blocks compiles the whole model too
    in_graph = strategy == "fsdp" and compile_unit == "model" and fsdp_blocks_per_unit != 0
    engine = engine_of(provisional_strategy(strategy), in_graph)
    how = mode(engine, precision, compiled)
    notes: list[str] = []

    terms: dict[str, float] = {}
    if in_graph:
        # training/graph_fsdp.py: fp32 weight shards, their AdamW moments and (with accumulation) their
        # gradients, over W. Inductor buckets every all-gather into one at the step's start, and the
        # gathered 16-bit weights stay for the backward: the whole model in 16 bits at the peak.
        terms.update(weights=4 * P / W, optimizer=8 * P / W, grads=4 * P / W if grad_accum > 1 else 0)
        terms["buffers"] = low * P
    elif strategy == "fsdp":
        # FSDP2 (strategies.fsdp_plugin_settings): fp32 weights and AdamW moments sharded over W,
        # and fp32 gradient shards, set to None after each step as DDP's are.
        terms.update(weights=4 * P / W, optimizer=8 * P / W, grads=4 * P / W if grad_accum > 1 else 0)
        # Gathered in the compute dtype: each unit of blocks for its forward and again for its
        # backward, freed after (reshard_after_forward), one prefetched beside the one computing;
        # the embeddings, final norm and tied LM head for the whole step (Accelerate leaves them
        # gathered after the forward, whose end and the backward's start both use them).
        # With no units of blocks (--fsdp-blocks-per-unit 0) the root unit gathers every weight for the
        # whole step.
        from distrain_cloud.training.strategies import fsdp_blocks_per_unit as blocks_per_unit

        per_unit = blocks_per_unit(fsdp_blocks_per_unit, L, shape.per_layer) or L
        unit = per_unit * shape.per_layer
        terms["buffers"] = low * (P - L * shape.per_layer + min(2 * unit, L * shape.per_layer))
    elif stage is None:
        # fp32 weights (autocast casts them op by op) and AdamW's two fp32 moments.
        terms.update(weights=4 * P, optimizer=8 * P)
        # Gradients are set to None after each step, so with one micro-step the peak (where the
        # backward starts) comes before any exists; accumulation keeps them between micro-steps.
        terms["grads"] = 4 * P if grad_accum > 1 else 0
        # DDP's reducer keeps its flat fp32 buckets for the whole job (the gradients are views
        # into them, trainer._ddp_kwargs), so they are there at the peak, where the gradients
        # themselves are not; with one process accelerate does not wrap the model in DDP.
        terms["buffers"] = 4 * P if W > 1 else 0
        if compiled and compiled_autograd and W > 1:
            # Measured, not derived: the traced reducer (DDP's Python one) peaked 1.43 GiB over the
            # whole model's C++ reducer at GPT-2 small, 3.1 copies of its fp32 gradients, on 2 and 4
            # GPUs and with 25, 100 and 250 MB buckets alike (bench/README.md, session 12).
            terms["buffers"] += 3 * 4 * P
            notes.append("--compiled-autograd: calibrated at GPT-2 small only")
    else:
        # The 16-bit model (ZeRO-3: its shard); the fp32 master weights, AdamW moments and fp32
        # gradients are partitioned over W, and live on the CPU with -offload.
        terms["weights"] = 0 if (stage == 3 and offload) else (low * P / W if stage == 3 else low * P)
        terms["optimizer"] = 0 if offload else ((4 if mixed else 0) + 8) * P / W
        terms["grads"] = 0 if offload else 4 * P / W
        bucket_bytes = 4 if stage == 1 else low
        # ZeRO-1/2 allocate their buckets when the first gradient reaches their hooks. Eager, that
        # is early in the backward, beside every saved activation. Compiled, the model is one
        # graph whose gradients all come out at its end, after the activations are freed: the
        # buckets miss the peak (session 10's compiled ZeRO-2 run measured 1.7 GiB under the
        # estimate that counted them). ZeRO-3's graph breaks at every block's hooks.
        buckets_at_peak = stage == 3 or not compiled
        terms["buffers"] = (1 if stage == 3 else 2) * DS_BUCKET_ELEMENTS * bucket_bytes if buckets_at_peak else 0
        if stage == 3:
            terms["buffers"] += low * min(P, ZERO3_MAX_LIVE) + constants.zero3_fixed_gib * GIB

    per_token_layer = constants.activation[how] * d
    if how == "autocast" and shape.family == "llama":
        # Eager, GPT-2's fitted constant (its gelu_new saves seven 4 d tensors, its dropout masks)
        # does not carry over to a SwiGLU block: llama-1b measured its own (see the constant).
        per_token_layer = LLAMA_EAGER_ACTIVATION * d
    # The constants hold at the MLP width they were measured at, 4 d (GPT-2's, llama-1b's); a wider
    # or narrower MLP saves its per-element tensors for more or fewer elements (see MLP_BYTES).
    per_token_layer += MLP_BYTES[how] * (shape.intermediate - 4 * d)
    if precision == "fp8":
        if how == "compiled":
            # Compiled, the partitioner keeps no float8 tensor for the backward: it recasts there
            # from what the block saves anyway (the residual stream, the MLP's gate and up outputs,
            # attention's output), so fp8 drops the bf16 copies that bf16 keeps of both norms'
            # outputs and of the MLP's activation, 2 (2 d + I) bytes a token and layer. Derived
            # from the saved tensors themselves (bench/fp8_saved_bytes.py, Inductor on CPU: exactly
            # 4 d + 2 I at I = 2 d, 4 d and 6 d); llama-1b's peaks on an H200 (session 37) within
            # 1.5% at micro-batch 8, 16 and 32, where one float8 byte for each bf16 input's two
            # (3 d + I) had run 6-14% over.
            per_token_layer -= 2 * (2 * d + shape.intermediate)
        else:
            # Eager, each float8 linear saves its input in float8 where autocast's bf16 linears save
            # their own bf16 casts of it: fp8_saved_bytes.py counts 4 d + I bytes a token and layer
            # fewer, exactly at I = 2 d, 4 d and 6 d (autograd's graph, the same on any device);
            # llama-1b on an H200 (session 38) kept 7.7 d fewer than eager bf16 at micro-batch 8.
            per_token_layer -= 4 * d + shape.intermediate
        if fp8_bf16_attention_input:
            # --fp8-bf16-layers with q_proj or k_proj (auto's since session 36): the attention's
            # input stays saved in bf16 for them, 2 d bytes more, compiled or not. Derived: llama-1b
            # on an H200 measured 2.16 GiB more than fp8 without them at micro-batch 16 (this 2.0)
            # and 4.15 at 32 (this 4.0).
            per_token_layer += 2 * d
    if residual_bf16 and how in ("autocast", "compiled"):
        # --residual-dtype bf16: each pre-norm block keeps its input and its mid-block sum (the two
        # norms' inputs) for the backward in bf16 where autocast's stream keeps them in fp32, 2
        # bytes less on each of 2 d values. Derived; llama-1b on an H200 (session 24) measured 4.0
        # GiB less at micro-batch 16 (bf16, and fp8 with --fp8-head) and 2.0 at 8: 4 d exactly.
        per_token_layer -= 4 * d
    terms["activations"] = per_token_layer * tokens * L
    if kv_cache:  # each layer's keys and values, in the compute dtype
        terms["kv_cache"] = 2 * L * tokens * d * (2 if mixed else 4)
    lm = task in ("causal-lm", "masked-lm")  # classification logits are a few numbers per sample
    if lm and fused_ce:
        # The chunked loss never holds the full logits; one liger run measured 16% more than this.
        notes.append("--fused-ce: the logits term is left out")
    elif lm and head_loss:
        # One logits-sized buffer in the compute dtype, which the forward overwrites with the
        # logits' gradient and the backward reads: eager or compiled alike. Measured on an H100
        # (GPT-2 small, micro-batch 8, eager): 12.40 -> 8.88 GiB under bf16 (9.2 bytes x B T V
        # less than the model's own loss) and 14.14 -> 11.38 GiB in fp32 (7.2 less).
        terms["logits"] = low * tokens * V
    elif lm:
        output = LOGITS_OUTPUT_BYTES if logits_output and how == "compiled" else 0
        loss = how
        if strategy == "fsdp" and compiled and eager_loss:
            loss = mode(engine, precision, compiled=False)
        elif compiled and (
            (strategy == "fsdp" and not in_graph and compile_unit != "model")  # FSDP2's blocks
            or (compile_unit == "block" and stage != 3)
        ):
            # The loss is its own graph after the eager LM head, so the logits are its input, saved
            # for its backward; a backward may reuse the memory of saved intermediates but not of
            # inputs (AOTAutograd's donated buffers). At the backward's start they sit beside their
            # gradient: one copy more than in a whole-model graph. Derived, not fitted; the compiled
            # fsdp runs and session 10's block-compiled DDP runs (GPT-2 small on 1, 2 and 4 GPUs,
            # GPT-2 XL on 4) agree with it within 5%. Not under ZeRO-3, whose peak falls elsewhere:
            # GPT-2 small's compiled ZeRO-3 peaked at 9.62 GiB with blocks and with the whole
            # model alike (4 H200s, sessions 10 and 11).
            output = low
        terms["logits"] = (constants.logits[loss] + output) * tokens * V
    if lm and fp8_head and "logits" in terms:
        # --fp8-head (losses._Fp8HeadLoss): the backward starts by casting the logits' gradient to
        # float8 twice, row-major and transposed (each matmul reads it in its own layout), one byte
        # per value each, beside the 16-bit gradient and every saved activation. Derived, not fitted.
        terms["logits"] += 2 * tokens * V

    # Evaluation keeps the weights, optimizer state and buffers, but no gradients or activations.
    resident = terms["weights"] + terms["optimizer"] + terms["buffers"]
    eval_logits = EVAL_LOGITS_BYTES * (eval_batch_size or batch_size) * seq_len * V if lm else 0
    return Estimate(
        terms={k: v / GIB for k, v in terms.items()},
        eval_gib=(resident + eval_logits) / GIB,
        notes=tuple(notes),
    )


def seq_len(args: TrainArgs) -> int:
    """Tokens per sample at most: language models pack --block-size, classification pads to the
    batch's longest, at most --max-length."""
    return args.max_length if args.task == "classification" else args.block_size


def processes(strategy: str, instance: InstanceType, nodes: int) -> int:
    return 1 if strategy == "single" else nodes * max(instance.gpus, 1)


def with_planned_steps(args: TrainArgs, *, world_size: int, channels: Mapping[str, Any]) -> TrainArgs:
    """`args` with --max-steps set to the optimizer steps the job will run, where a plan can
    count them: --epochs over the shipped builtin:sentiment data, the classification default,
    whose rows are its examples, split and batched as the trainer does (data.load_raw,
    data.make_loaders). Elsewhere (a Hub dataset, a file, a channel `channels` names, packed
    language-model blocks) the job counts them once its data is loaded, and `args` come back
    as they are. The compile decision and auto's pick then follow the trainer's own rule."""
    import math

    from distrain_cloud.training.data import BUILTIN

    default = args.dataset is None and args.train_file is None and "train" not in channels
    if args.max_steps is not None or args.task != "classification":
        return args
    if args.dataset != "builtin:sentiment" and not default:
        return args
    with open(BUILTIN["sentiment"], "rb") as f:
        rows = sum(1 for line in f if line.strip())
    # datasets' train_test_split with a fractional test_size takes ceil(size * rows) for the test split.
    train = rows - math.ceil(args.validation_fraction * rows)
    if args.max_train_samples:
        train = min(train, args.max_train_samples)
    per_epoch = max(1, train // (args.batch_size * world_size) // args.grad_accum)
    return replace(args, max_steps=math.ceil(args.epochs * per_epoch))


def estimate_job(job: Decisions, shape: ModelShape, world_size: int) -> Estimate:
    """estimate() for a job as decided (training/decisions.py), on GPUs: its strategy, whether and
    what it compiles, and whether it computes losses.head_loss (its flags allow it, the trainer's own
    decision, and the model is GPT-2 or Llama shaped, the causal LMs the shapes know)."""
    args = job.args
    return estimate(
        shape,
        strategy=job.strategy.value,
        precision=args.precision or "bf16",  # not given: 16 bits on any GPU (precision.pick_precision)
        batch_size=args.batch_size,
        seq_len=seq_len(args),
        world_size=world_size,
        task=args.task,
        compiled=job.compiled,
        grad_accum=args.grad_accum,
        eval_batch_size=args.eval_batch_size,
        fused_ce=args.fused_ce,
        fsdp_blocks_per_unit=args.fsdp_blocks_per_unit,
        compile_unit=job.compile_unit,
        compiled_autograd=args.compiled_autograd,
        # the trainer's head loss takes GPT-2 and the Llama-shaped decoders (modeling.HEAD_LOSS_MODEL_TYPES)
        head_loss=shape.family in ("gpt2", "llama") and job.head_loss_why_not is None,
        # --fp8-head-backward bf16 makes no float8 copy of the logits' gradient
        fp8_head=bool(args.fp8_head) and args.fp8_head_backward == "fp8",
        residual_bf16=_residual_bf16(job, shape),
        fp8_bf16_attention_input=_fp8_bf16_attention_input(args, shape),
    )


def _fp8_bf16_attention_input(args: TrainArgs, shape: ModelShape) -> bool:
    """Whether an fp8 job keeps attention's query or key projection bf16 (--fp8-bf16-layers, auto's
    pick on the native layers): the shape knows Llama's names only."""
    from distrain_cloud.training.args import fp8_bf16_layer_names

    kept = set(fp8_bf16_layer_names(args)) if args.precision == "fp8" else set()
    return shape.family == "llama" and bool(kept & {"q_proj", "k_proj"})


def _residual_bf16(job: Decisions, shape: ModelShape) -> bool:
    """Whether the job casts its residual stream to bf16 (--residual-dtype, auto's pick on GPUs,
    whose precision is bf16 when none is given). Llama-shaped decoders (Mistral, Qwen) cast theirs as
    Llama's does."""
    from distrain_cloud.training.args import residual_stream_bf16

    args = replace(job.args, precision=job.args.precision or "bf16")
    return residual_stream_bf16(args, job.strategy.value, "llama" if shape.family == "llama" else None)


# ---------------------------------------------------------------------------------- the check


def fit_check(job: Decisions, instance: InstanceType, *, nodes: int = 1) -> Check:
    """Whether the estimated peak of the job as decided fits each GPU of `instance`; when not, the
    detail names fixes that fit: another strategy, a smaller --batch-size, a bigger instance. Pure."""
    from .plan import Check

    args = job.args
    if not instance.is_gpu:
        return Check(CHECK_NAME, None, f"{instance.name} has no GPU: not checked")
    shape = model_shape(args)
    if shape is None and (wrong := overrides_unsized(args)):
        return Check(CHECK_NAME, False, wrong)  # the job would fail building its model
    if shape is None:
        return Check(CHECK_NAME, None, f"model {args.model or args.model_config} is not in the size table: not checked")
    need = estimate_job(job, shape, processes(job.strategy.value, instance, nodes)).device_gib
    have = usable_gib(instance)
    what = (
        f"{job.strategy_words}{job.compile_words}, micro-batch {args.batch_size} x "
        f"{seq_len(args)} tokens, {shape.params / 1e6:,.0f}M params"
    )
    if _residual_bf16(job, shape):  # auto's pick, with no flag on the command line to say it
        what += f", a bf16 residual stream (--residual-dtype {args.residual_dtype})"
    if need <= have:
        return Check(CHECK_NAME, True, f"about {need:.1f} of {have:.1f} GiB per {instance.gpu_model} ({what})")
    fixes = suggest_fixes(job, shape, instance, nodes)
    detail = f"needs about {need:.1f} GiB per GPU, more than the {have:.1f} GiB of one {instance.gpu_model} ({what})"
    return Check(CHECK_NAME, False, detail + "; " + ("fits with " + ", or ".join(fixes) if fixes else _NO_FIX))


_NO_FIX = "no strategy, micro-batch or instance type in the catalog fits: use a smaller model or --block-size"
# Fastest first (bench/README.md): ZeRO-2 ran at 1.2x eager DDP, and compiled (its default) at 0.77x
# compiled DDP against compiled fsdp's 0.65-0.73x (GPT-2 small on 4 H200s); compiled fsdp beat ZeRO-3 at both
# sizes measured (GPT-2 small on 4 H100s: 613,525 vs 597,395 tokens/s; GPT-2 XL on 2 H100s: 31,246
# vs 23,694) at less memory; the offloads are slowest.
_STRATEGY_ORDER = ("ddp", "zero1", "zero2", "fsdp", "zero3", "zero2-offload", "zero3-offload")


def suggest_fixes(job: Decisions, shape: ModelShape, instance: InstanceType, nodes: int) -> list[str]:
    """Fixes the estimate says fit, each with its estimate: the fastest other strategy (with a
    smaller micro-batch only if none fits as it is), a smaller micro-batch, the cheapest
    instance type of the same platform. A smaller micro-batch keeps the global batch through
    --grad-accum."""
    from distrain_cloud.training.args import ArgumentError, in_bf16, validate
    from distrain_cloud.training.decisions import decide
    from distrain_cloud.training.strategies import STRATEGIES, ClusterShape, accelerate_config, choose_precision

    from .catalog import all_instances

    args = job.args

    def decided(a: TrainArgs) -> Decisions | None:
        """The decisions for the job with a fix applied, as the trainer takes them on GPUs; None
        where the flag check that the job's entry point runs (args.validate, then decide's own:
        fp8 under ddp or single) would refuse them. No rule is copied here: a fix that check
        refuses is never named (once: --strategy zero1 for an fp8 job)."""
        try:
            validate(replace(a))  # on a copy: validate fills in defaults
            return decide(a, world=processes(a.strategy, instance, nodes), cuda=True)
        except ArgumentError:
            return None

    def runs_on(i: InstanceType) -> bool:
        """The job runs on `nodes` of `i` as it is, as a plan there would check: its precision on
        those GPUs (choose_precision) and its strategy on that many processes (accelerate_config:
        --strategy single runs one)."""
        cluster = ClusterShape(num_nodes=nodes, processes_per_node=max(i.gpus, 1))
        try:
            precision = choose_precision(args.precision, i.gpus, i.compute_capability, i.name)
            accelerate_config(job.strategy, cluster, precision=precision)
        except ValueError:
            return False
        return True

    def need(d: Decisions, on: InstanceType = instance) -> float:
        return estimate_job(d, shape, processes(d.strategy.value, on, nodes)).device_gib

    def largest_batch(a: TrainArgs) -> tuple[Decisions, float] | None:
        batch = a.batch_size
        while batch >= 1:
            smaller = decided(replace(a, batch_size=batch, grad_accum=a.grad_accum * a.batch_size // batch))
            if smaller is None:
                return None
            if need(smaller) <= usable_gib(instance):
                return smaller, need(smaller)
            batch //= 2
        return None

    def flags(a: TrainArgs) -> str:
        out = [f"--precision {a.precision}"] if a.precision != args.precision else []
        out += [f"--strategy {a.strategy}"] if a.strategy != args.strategy else []
        out += [f"--batch-size {a.batch_size} --grad-accum {a.grad_accum}"] if a.batch_size != args.batch_size else []
        return " ".join(out)

    # fsdp is offered under fp16 (V100, T4) too: both its engines trained with the loss scaler on
    # GPUs (bench/README.md, session 15). What the flags rule out (--fused-ce with ZeRO-3, fp8 off
    # ddp) decided() drops.
    options = [s for s in _STRATEGY_ORDER if s in STRATEGIES]
    # Every other strategy, not only the slower ones: memory does not fall in speed order (fsdp is
    # faster than ZeRO-3 and needs less).
    others = [s for s in options if s != args.strategy]
    found = [f for f in (largest_batch(replace(args, strategy=s)) for s in others) if f]
    # The fastest that keeps the micro-batch, else the one that keeps the largest.
    best = next((f for f in found if f[0].args.batch_size == args.batch_size), None)
    best = best or max(found, key=lambda f: f[0].args.batch_size, default=None)
    smaller = largest_batch(args)
    if best and smaller and best[0].args.batch_size <= smaller[0].args.batch_size:
        best = None  # another strategy helps only if it keeps a larger micro-batch than this one can
    if args.precision == "fp8" and not (best or smaller):
        # fp8 runs under ddp or single only (decide()), so no other strategy was open to it: the
        # sharded ones are, in bf16. Named only when nothing keeps fp8; the same ordering as above.
        bf16 = [f for f in (largest_batch(replace(in_bf16(args), strategy=s)) for s in options) if f]
        best = next((f for f in bf16 if f[0].args.batch_size == args.batch_size), None)
        best = best or max(bf16, key=lambda f: f[0].args.batch_size, default=None)
    fixes = [f"{flags(d.args)} (about {gib:.1f} GiB)" for d, gib in filter(None, (best, smaller))]
    if job.strategy.value == "fsdp" and job.in_graph:
        # Sharded inside the graph, fsdp holds the whole 16-bit model at its peak; FSDP2 one unit of it.
        blocks = decided(replace(args, compile_unit="block"))
        fsdp2 = need(blocks) if blocks else None
        if fsdp2 is not None and fsdp2 <= usable_gib(instance):
            fixes.insert(0, f"--compile-unit block (fsdp's FSDP2 engine, about {fsdp2:.1f} GiB)")
    bigger = [
        i
        for i in all_instances()
        if i.is_gpu and i.sagemaker == instance.sagemaker and runs_on(i) and need(job, i) <= usable_gib(i)
    ]
    if bigger:
        cheapest = min(bigger, key=lambda i: min(i.hourly_usd.values()))
        gib = need(job, cheapest)
        fixes.append(
            f"--instance {cheapest.name} ({cheapest.gpu_model}, about {gib:.1f} of {usable_gib(cheapest):.1f} GiB)"
        )
    return fixes


# ---------------------------------------------------------------------------------- instances --fit


@dataclass(frozen=True)
class Fit:
    """One instance type for one job: `instances --fit`."""

    instance: str
    gpus: str  # "8 x H100"
    need_gib: float | None  # None: the job's precision cannot run on this GPU
    have_gib: float
    hourly_usd: float | None  # every node, on demand
    usd_per_million_tokens: float | None  # measured throughput, else launcher/throughput.py's estimate
    note: str  # why need or cost is missing, where the throughput was measured, or how it was estimated
    strategy: str = ""  # what the job runs there (--strategy auto picks per instance)

    @property
    def fits(self) -> bool:
        return self.need_gib is not None and self.need_gib <= self.have_gib


def fit_table(spec: JobSpec, region: str | None = None) -> tuple[str, list[Fit]]:
    """For a JobSpec: a line describing the job, and every GPU instance type of its platform
    (SageMaker, EC2; both for local jobs) with the memory it needs there and its cost."""
    from distrain_cloud.infra.errors import UserError, value_errors_as_user_errors
    from distrain_cloud.training.decisions import decide, planned
    from distrain_cloud.training.strategies import AUTO, choose_precision

    from .catalog import PRICE_REGIONS, all_instances
    from .spec import INSTANCE_KINDS

    region = region or (spec.region if spec.region in PRICE_REGIONS else PRICE_REGIONS[0])
    args = spec.training_args(spec.precision or "bf16", "fit").args
    shape = model_shape(args)
    if shape is None and (wrong := overrides_unsized(args)):
        raise UserError(f"{wrong}, so which instances fit cannot be told")
    if shape is None:
        raise UserError(
            f"model {args.model or args.model_config}: its size is not known here (launcher/memory.py HUB_MODELS, "
            "or a local config.json), so which instances fit cannot be told"
        )
    with value_errors_as_user_errors():  # as planned_decisions: decide() refuses what only it weighs
        asked = decide(args, world=1, cuda=True)  # the job as asked, on one GPU: what the line says of it
    rows = []
    for instance in all_instances():
        if not instance.is_gpu or (spec.backend != "local" and not INSTANCE_KINDS[spec.backend][0](instance.name)):
            continue
        price = instance.hourly_usd.get(region)
        hourly = price * spec.nodes if price is not None else None
        gpus, have = f"{instance.gpus} x {instance.gpu_model}", usable_gib(instance)
        try:
            where = f"{instance.name} has {instance.gpu_model}"
            precision = choose_precision(spec.precision, instance.gpus, instance.compute_capability, where)
        except ValueError as e:
            rows.append(Fit(instance.name, gpus, None, have, hourly, None, str(e)))
            continue
        job = planned(  # --strategy auto as the job would resolve it there
            replace(args, precision=precision),
            world_size=spec.nodes * instance.gpus,
            nodes=spec.nodes,
            gpu_model=instance.gpu_model,
            params=shape.params,
        )
        world = processes(job.strategy.value, instance, spec.nodes)
        need = estimate_job(job, shape, world).device_gib
        runs = "fsdp in-graph" if job.in_graph else job.args.strategy
        cost, note = None, "no measurement, and no published rates for this GPU"
        card = instance.gpu_model or ""
        rate = (
            measured_tokens_per_sec(job, shape, card)
            or fp8_layers_scaled_tokens_per_sec(job, shape, card)
            or estimated_tokens_per_sec(job, shape, instance)
        )
        if rate and hourly is not None:
            tokens_per_hour = rate[0] * world * 3600
            scaled = f"; x {world} GPUs, multi-GPU scaling not modelled" if world > 1 else ""
            cost, note = hourly / tokens_per_hour * 1e6, rate[1] + scaled
        rows.append(Fit(instance.name, gpus, need, have, hourly, cost, note, runs))
    # How the line names the job's strategy (auto as asked) and its compile.
    what = (
        f"{shape.name} ({shape.params / 1e6:,.0f}M params), {args.task}, "
        f"{args.strategy if args.strategy == AUTO else asked.strategy_words}"
        f"{asked.compile_words}, micro-batch {args.batch_size} x {seq_len(args)} tokens, "
        f"{spec.nodes} node(s), prices in {region}"
    )
    return what, sorted(rows, key=_cheapest_first)


def _cheapest_first(r: Fit) -> tuple[bool, bool, float, float]:
    """The rows that fit, cheapest to train the job's tokens first ($/M tokens orders instances as
    the cost of any fixed number of tokens does), then those with no cost, by hourly price."""
    return (not r.fits, r.usd_per_million_tokens is None, r.usd_per_million_tokens or 0.0, r.hourly_usd or 0.0)


def measured_tokens_per_sec(job: Decisions, shape: ModelShape, gpu_model: str) -> tuple[float, str] | None:
    """Tokens/s per GPU measured for this very configuration on this GPU, and where; else None.
    Nothing is scaled from another model, card or micro-batch."""
    from distrain_cloud.training.args import fp8_linear_of, rope_tables_wanted
    from distrain_cloud.training.modeling import PRESETS

    from .throughput import THROUGHPUT

    args = job.args
    replicated = ("ddp", "single")  # one process of DDP runs as one GPU alone
    layers = fp8_linear_of(args) if args.precision == "fp8" else None
    residual = _residual_bf16(job, shape)
    # the trainer's rule; a model without a rotary module tables nothing (the shape knows Llama's
    # family only, as above)
    tables = rope_tables_wanted(args, job.compiled) and shape.family == "llama"

    def same(t: Throughput) -> bool:
        return (
            t.card == gpu_model
            and shape_from_config(shape.name, PRESETS[t.model]) == shape
            and (t.task, t.seq_len, t.batch_size, t.compiled)
            == (args.task, seq_len(args), args.batch_size, job.compiled)
            and (args.strategy == t.strategy or (args.strategy in replicated and t.strategy in replicated))
            and _same_precision(args, t)
            and (t.residual_bf16, t.fused, t.rope_tables) == (residual, args.fuse_projections, tables)
            and not job.in_graph
        )

    # an fp8 run with the same layers first; else one whose layers ran the same recipe
    for t in sorted(filter(same, THROUGHPUT), key=lambda t: layers is not None and t.fp8_linear != layers):
        per_gpu = sum(t.tokens_per_sec) / len(t.tokens_per_sec)
        sources = ", ".join(dict.fromkeys(source for source, _ in t.runs))
        where = f"1 {t.card}" if t.gpus == 1 else f"{t.gpus} {t.card}s ({t.strategy})"
        other = f" ({t.fp8_linear}'s float8 layers, the same recipe)" if layers and t.fp8_linear != layers else ""
        return per_gpu, f"{per_gpu:,.0f} tokens/s/GPU measured on {where}: {sources}{other}"
    return None


def fp8_layers_scaled_tokens_per_sec(job: Decisions, shape: ModelShape, gpu_model: str) -> tuple[float, str] | None:
    """An fp8 job on the native layers whose layer recipe (--fp8-grad-dtype, --fp8-bf16-layers;
    auto's since session 36) has no run at its micro-batch on this GPU, where the recipe before it
    (e5m2, none) has one: that rate times the two recipes' ratio at a micro-batch where both
    ran on this GPU (the nearest), marked an estimate; else None. Without it such a job would be priced at
    bf16's rate, about a quarter slower than either recipe."""
    from distrain_cloud.training.args import fp8_linear_of

    from .throughput import THROUGHPUT

    args = job.args
    if args.precision != "fp8" or fp8_linear_of(args) != "native":
        return None
    # the recipe before session 36's auto, which most fp8 rows measured
    before = replace(job, args=replace(args, fp8_grad_dtype="e5m2", fp8_bf16_layers="none"))
    if _fp8_layers(before.args) == _fp8_layers(args):
        return None
    base = measured_tokens_per_sec(before, shape, gpu_model)
    if base is None or measured_tokens_per_sec(job, shape, gpu_model) is not None:  # its own run wins
        return None
    batches = {t.batch_size for t in THROUGHPUT if t.card == gpu_model} - {args.batch_size}
    for batch in sorted(batches, key=lambda b: (abs(math.log(b / args.batch_size)), b)):  # the nearest first
        mine = measured_tokens_per_sec(replace(job, args=replace(args, batch_size=batch)), shape, gpu_model)
        theirs = measured_tokens_per_sec(replace(before, args=replace(before.args, batch_size=batch)), shape, gpu_model)
        if mine and theirs:
            ratio = mine[0] / theirs[0]
            return base[0] * ratio, (
                f"est. {base[0] * ratio:,.0f} tokens/s/GPU: x {ratio:.3f}, this recipe's rate over that of "
                f"--fp8-grad-dtype e5m2 --fp8-bf16-layers none at micro-batch {batch}, on the latter's {base[1]}"
            )
    return None


def _fp8_layers(args: TrainArgs) -> tuple[str, str]:
    """The fp8 layers' recipe as a row records it: the gradients' format, the block linears kept bf16."""
    from distrain_cloud.training.args import fp8_bf16_layer_names

    grads = args.fp8_grad_dtype if args.fp8_grad_dtype != "auto" else "e5m2"
    return grads, ",".join(fp8_bf16_layer_names(args)) or "none"


def _same_precision(args: TrainArgs, t: Throughput) -> bool:
    """Whether a job of `args` multiplies as measured run `t` did: bf16 (or any 16 bits) both, or
    fp8 both, with the default recipe and the LM head as `t` ran it (its forward and backward too),
    the backward's fast accumulation, the output gradients' format and the block linears kept bf16
    as `t`'s (whose float8 layers ran it, torchao's or the native ones, changes no number:
    measured_tokens_per_sec prefers the same)."""
    from distrain_cloud.training.args import fp8_flags_given

    if (args.precision == "fp8") != (t.precision == "fp8"):
        return False
    return args.precision != "fp8" or (
        args.fp8_head == t.fp8_head
        and args.fp8_head_forward == t.fp8_head_forward
        and args.fp8_head_backward == t.fp8_head_backward
        and args.fp8_fast_accum == t.fp8_fast_accum
        and _fp8_layers(args) == (t.fp8_grad_dtype, t.fp8_bf16_layers)
        and set(fp8_flags_given(args))
        <= {
            "--fp8-head",
            "--fp8-head-forward",
            "--fp8-head-backward",
            "--fp8-fast-accum",
            "--fp8-linear",
            "--fp8-grad-dtype",
            "--fp8-bf16-layers",
        }
    )


def estimated_tokens_per_sec(job: Decisions, shape: ModelShape, instance: InstanceType) -> tuple[float, str] | None:
    """Tokens/s per GPU estimated from the card's published rates (launcher/throughput.py's roofline,
    fitted to the measured H100/H200 runs), and how; None for a GPU with no published rates."""
    from .throughput import estimate_tokens_per_sec, largest_error, spec

    card = spec(instance.gpu_model or "", instance.gpu_memory_gib)
    if card is None:
        return None
    per_gpu = estimate_tokens_per_sec(shape, seq_len(job.args), job.compiled, card)
    fp8 = "; fp8 not modelled: bf16's rate" if job.args.precision == "fp8" else ""
    return per_gpu, (
        f"est. {per_gpu:,.0f} tokens/s/GPU ({card.tflops:g} TFLOP/s, {card.tb_per_s:g} TB/s; roofline fitted to "
        f"H100/H200 runs, within {largest_error():.0%} of them){fp8}"
    )


def render_fit_table(what: str, rows: list[Fit]) -> str:
    lines = [
        f"job: {what}",
        f"{'fits':4}  {'instance':18} {'GPUs':10} {'strategy':13} {'need/GPU':>9} {'has/GPU':>8} {'$/h':>8}"
        "  $/M tokens",
    ]
    for r in rows:
        need = f"{r.need_gib:.1f} GiB" if r.need_gib is not None else "-"
        price = f"{r.hourly_usd:.2f}" if r.hourly_usd is not None else "?"
        cost = f"{r.usd_per_million_tokens:.4f} ({r.note})" if r.usd_per_million_tokens is not None else r.note
        fits = "yes" if r.fits else "no"
        line = (
            f"{fits:4}  {r.instance:18} {r.gpus:10} {r.strategy or '-':13} {need:>9} {r.have_gib:5.1f} GiB {price:>8}"
        )
        lines.append(f"{line}  {cost}")
    lines.append(
        "need/GPU: estimated peak per GPU (launcher/memory.py, within 15% of measured H100/H200 peaks); "
        "$/M tokens: list price over measured throughput where this exact configuration was measured, else over "
        "an estimate (est.): an fp8 layer recipe's ratio to the one before it applied to that one's measured rate, "
        "or the card's published rates, unchecked on cards never measured (older ones are likely slower than it "
        "says); rows ranked by it, cheapest first"
    )
    return "\n".join(lines)
