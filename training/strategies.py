"""The one place where a strategy name becomes Accelerate and DeepSpeed settings.

Torch-free on purpose: the launcher imports this to render plans, and the training
entry point imports it to build the very same configuration at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any


class Strategy(str, Enum):
    single = "single"
    ddp = "ddp"
    zero1 = "zero1"
    zero2 = "zero2"
    zero3 = "zero3"
    zero2_offload = "zero2-offload"
    zero3_offload = "zero3-offload"
    fsdp = "fsdp"

    @property
    def zero_stage(self) -> int | None:
        return {
            Strategy.zero1: 1,
            Strategy.zero2: 2,
            Strategy.zero3: 3,
            Strategy.zero2_offload: 2,
            Strategy.zero3_offload: 3,
        }.get(self)

    @property
    def uses_deepspeed(self) -> bool:
        return self.zero_stage is not None

    @property
    def offload(self) -> bool:
        return self.value.endswith("-offload")

    @property
    def shards_state(self) -> bool:
        """Whether each process saves its own part of the model and optimizer state."""
        return self.uses_deepspeed or self is Strategy.fsdp

    @property
    def needs_process_group(self) -> bool:
        """DeepSpeed and FSDP run under a process group even with one process (torchrun's)."""
        return self.shards_state


class Precision(str, Enum):
    """The precisions a job trains in (--precision): fp32 (no), fp16 and bf16 under autocast, and
    fp8, which is bf16 autocast with the transformer blocks' linear layers multiplying in float8
    (training/fp8.py): to Accelerate, the loss and the memory estimate, fp8 is bf16."""

    no = "no"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"

    @property
    def autocast(self) -> str:
        """The precision Accelerate's autocast runs in (its mixed_precision; "no": none)."""
        return Precision.bf16.value if self is Precision.fp8 else self.value

    @property
    def sixteen_bit(self) -> bool:
        """Activations and the 16-bit copies of weights take two bytes an element."""
        return self.autocast != Precision.no.value


PRECISIONS = tuple(p.value for p in Precision)
STRATEGIES = tuple(s.value for s in Strategy)
# The default: a concrete strategy picked where the job runs (resolve_auto), ddp or fsdp.
AUTO = "auto"
STRATEGY_CHOICES = (AUTO, *STRATEGIES)


def choose_precision(requested: str | None, gpus: int, capability: tuple[int, int] | None, where: str) -> str:
    """The precision a job runs in: the requested one if the hardware has it, else the best it has.

    bf16 needs compute capability 8.0 (Ampere) or later; fp16 and bf16 need a GPU. `where`
    names the hardware in the error ("ml.p3.8xlarge has V100 (7.0)", "this machine").
    """
    if gpus == 0:
        if requested not in (None, "no"):
            raise ValueError(f"--precision {requested} needs a GPU; {where} has none: use --precision no")
        return "no"
    if requested == "fp8" and capability is not None and capability < (8, 9):  # training/fp8.py
        raise ValueError(f"--precision fp8 needs compute capability >= 8.9 (H100, L4); {where}: use --precision bf16")
    bf16 = capability is None or capability >= (8, 0)  # unknown: let the job find out
    if requested == "bf16" and not bf16:
        raise ValueError(f"--precision bf16 needs compute capability >= 8.0; {where}: use --precision fp16")
    return requested or ("bf16" if capability and bf16 else "fp16")


def provisional_strategy(name: str) -> Strategy:
    """The strategy `name` launches, validates and compiles as: auto as ddp until resolve_auto
    makes it concrete (its other pick, fsdp sharded in the graph, launches and compiles alike)."""
    return parse_strategy(Strategy.ddp.value if name == AUTO else name)


def parse_strategy(name: str) -> Strategy:
    try:
        return Strategy(name)
    except ValueError:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}") from None


@dataclass(frozen=True)
class ClusterShape:
    """How many processes run where; the same fields as the container contract's cluster."""

    num_nodes: int = 1
    node_rank: int = 0
    processes_per_node: int = 1
    main_addr: str = "127.0.0.1"
    main_port: int = 29500
    use_cpu: bool = False

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.processes_per_node


def deepspeed_config(
    strategy: Strategy,
    *,
    micro_batch_size: int,
    grad_accum: int,
    world_size: int,
    precision: str,
    max_grad_norm: float | None,
) -> dict[str, Any]:
    """A complete DeepSpeed config with real numbers, never "auto".

    Batch sizes are written from the real world size: letting Accelerate fill them in
    counted one process while DeepSpeed saw two under CPU multi-process runs.
    """
    stage = strategy.zero_stage
    if stage is None:
        raise ValueError(f"strategy {strategy.value} does not use DeepSpeed")
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
    }
    if stage >= 2:
        zero["allgather_bucket_size"] = 5e8
    if stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": 5e8,
                "stage3_param_persistence_threshold": 1e6,
                # The final save gathers the full 16-bit weights on rank 0.
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    if strategy.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch_size * grad_accum * world_size,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "steps_per_print": 10**9,  # our own key=value lines do the logging
        "wall_clock_breakdown": False,
    }
    if max_grad_norm:
        config["gradient_clipping"] = max_grad_norm
    return config


def fsdp_plugin_settings() -> dict[str, Any]:
    """Accelerate's FullyShardedDataParallelPlugin arguments for `fsdp`: PyTorch FSDP2. The trainer
    shards the transformer blocks itself (the classes the model names in _no_split_modules), in
    units of consecutive blocks (fsdp_blocks_per_unit), so Accelerate wraps nothing more than its
    embeddings-and-head unit and the root. A unit's weights are gathered for its forward and freed
    after it, so memory per process is like ZeRO-3's. Checkpoints are sharded,
    one file per process (torch.distributed.checkpoint). Mixed precision comes from
    --precision: weights are gathered and gradients reduced in the 16-bit type, as with
    DeepSpeed; the fp32 weights and AdamW state stay sharded."""
    return {
        "fsdp_version": 2,
        "auto_wrap_policy": "no_wrap",
        "reshard_after_forward": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_ram_efficient_loading": False,
    }


# FSDP2 runs Python hooks around every shard unit: gather its weights before its forward and again
# before its backward, free them after each, reduce-scatter its gradients. For GPT-2 small's
# 7M-parameter blocks one block per unit left a compiled step bound by that host time (on 2 H100s
# the GPU idled 22 of 72 ms, bench/README.md, session 7). Units of consecutive blocks with about
# this many parameters each amortise the hooks; the cost is memory for the gathered 16-bit copy of
# one or two units (about 200-400 MB at this size), small beside activations. Big models keep one
# block per unit, where a block's compute already hides its hooks.
FSDP_UNIT_PARAMS = 100_000_000


# A compiled FSDP2 model this small is one unit, the whole model (--fsdp-blocks-per-unit 0), though
# the flag was not given: its blocks would make one unit of about FSDP_UNIT_PARAMS anyway, and with
# the embeddings and head in it too, the hooks sit on the root alone, around the forward, which
# compiles as one graph each way. GPT-2 small on 2 H200s: 1.02-1.03x compiled DDP against 0.85-0.94x
# for the twelve blocks one unit compiled block by block, at 7.64 GiB against 8.95 (DDP's 9.67),
# its first step 23-25 s against 10-11 (bench/README.md, session 32). Larger models keep units of
# blocks: the one unit gathers every 16-bit weight at once, for the whole step.
FSDP_ONE_UNIT_MAX_PARAMS = 150_000_000


def fsdp_one_unit(args, *, compiled: bool, params: int | None) -> tuple[bool, str | None]:
    """Whether FSDP2 shards the whole model as one unit where --fsdp-blocks-per-unit was not given,
    and why, where the model's size decided it: a compiled run (the one graph is what it buys) of a
    model of at most FSDP_ONE_UNIT_MAX_PARAMS parameters, with no --compile-unit (block asks for
    FSDP2's graphs a block). (False, None) where the size did not decide: a flag did, the run is
    eager, or the size is not known yet (the trainer's first decision, a plan without it)."""
    if args.fsdp_blocks_per_unit is not None or args.compile_unit is not None or not compiled or params is None:
        return False, None
    most = count_words(FSDP_ONE_UNIT_MAX_PARAMS)
    if params > FSDP_ONE_UNIT_MAX_PARAMS:
        return False, (
            f"auto: units of about {FSDP_UNIT_PARAMS // 10**6}M parameters, for a model above {most} "
            f"parameters (this one: {count_words(params)})"
        )
    return True, (
        f"auto: the whole model one unit, compiled whole, for a compiled model of at most {most} parameters "
        f"(this one: {count_words(params)})"
    )


def fsdp_blocks_per_unit(requested: int | None, n_blocks: int, block_params: int) -> int:
    """How many consecutive transformer blocks make one FSDP2 shard unit: `requested`
    (--fsdp-blocks-per-unit) when given, else units of about FSDP_UNIT_PARAMS parameters,
    the blocks spread evenly over them. 0 (asked only): no units of blocks, the model is one unit."""
    if requested == 0:
        return 0
    if n_blocks < 1:
        return 1
    if requested:
        return min(requested, n_blocks)
    units = max(1, min(n_blocks, round(n_blocks * block_params / FSDP_UNIT_PARAMS)))
    return -(-n_blocks // units)  # ceil: the last unit may hold fewer


# fsdp has two engines. FSDP2 (the plugin above) compiles each block and runs its sharding hooks
# between them: a short first compile, but host-bound steps. Sharding inside the compiled graph
# (--compile-unit model, training/graph_fsdp.py) ran 1.00-1.07x compiled DDP at GPT-2 small on 4
# H200s against FSDP2's 0.83x (37.4 vs 48.1 ms a step), and 1.72x FSDP2 at GPT-2 XL (136.5 vs 234.9
# ms), but compiles the whole model: a first step of 89.7 s against 14.5 s at small, 362.8 s against
# 16.8 s at XL (bench/README.md, session 14). That is repaid after about 7,000 steps at small and
# 3,500 at XL; the compile cache kept with the checkpoints makes a resume's compile short either way.
FSDP_IN_GRAPH_MIN_STEPS = 5000


def fsdp_in_graph(args, *, cuda: bool) -> tuple[bool, str]:
    """Whether `fsdp` shards inside the compiled graph rather than with FSDP2, and why. Decided
    from the arguments alone (before Accelerate starts, which needs to know), so the plan and the
    job agree: --compile-unit decides; else the long compiled runs on GPUs whose length --max-steps
    gives (a run counted in --epochs keeps FSDP2: its length is known only once the data is)."""
    if args.compile_unit is not None:
        if args.compile_unit == "model":
            return True, "--compile-unit model"
        return False, "--compile-unit block"
    if args.fsdp_blocks_per_unit is not None:
        return False, "--fsdp-blocks-per-unit sizes FSDP2's units"
    if not cuda or args.compile is False:
        return False, "default: FSDP2 when not compiled on GPUs"
    if args.max_steps is None or args.max_steps < FSDP_IN_GRAPH_MIN_STEPS:
        return False, (
            f"default: FSDP2, whose first compile is shorter, below {FSDP_IN_GRAPH_MIN_STEPS:,} --max-steps "
            "(--compile-unit model shards inside the compiled graph)"
        )
    return True, f"default for {FSDP_IN_GRAPH_MIN_STEPS:,}+ steps compiled (--compile-unit block for FSDP2)"


# What --strategy auto (the default) picks. On one node over NVLink, fsdp sharded inside the compiled
# graph weak-scaled 96.8-97.2% at 2 GPUs and 97.5-98.0% at 4 against compiled DDP's 93.2-93.5% and
# 92.1-92.2% (4 H200s, two invocations; 2 H200s in session 15: 96.0-96.7% against 92.5-92.6%), with
# a quarter less memory: 1.5 ms a step faster at 2 GPUs, 2.3 ms at 4. Its first compile is 47-60 s
# longer (78.6 s against 31.6 s at 2 GPUs, 89.7 s at 4), which those savings repay after about 31,000
# steps at 2 GPUs and 26,000 at 4 (bench/README.md, session 16). Below this many steps, auto
# stays with compiled DDP, as it does where the in-graph engine is unmeasured: over slower links
# (several nodes, PCIe cards: DDP's small buckets overlap the backward there), with gradient
# accumulation (each micro-batch would gather the weights again, where DDP syncs once a step), eager,
# with --fused-ce, and for tasks other than causal-lm (measured on GPT-2 only). And for bigger
# models: at GPT-2 XL (1.56B) on 4 H200s, micro-batch 4, compiled DDP ran 122,233 tokens/s (session
# 16) and the in-graph engine 120,065 (session 14, another host), with a first compile of about 6
# minutes: no faster, so nothing repays it there. Sizes between are not measured; auto takes the
# engine up to AUTO_IN_GRAPH_MAX_PARAMS, near the size measured.
AUTO_IN_GRAPH_MIN_STEPS = 30_000
AUTO_IN_GRAPH_MAX_PARAMS = 200_000_000
# Flags that only ddp reads: they pin auto to ddp.
_DDP_FLAGS = {
    "ddp_bucket_mb": "--ddp-bucket-mb",
    "ddp_reduce_dtype": "--ddp-reduce-dtype",
    "compiled_autograd": "--compiled-autograd",
}


def resolve_auto(
    args,
    *,
    world: int,
    cuda: bool,
    slow_link: str | None,
    saved: Mapping[str, Any] | None = None,
    params: int | None = None,
    steps: int | None = None,
) -> tuple[Any, str | None]:
    """A TrainArgs `args` with --strategy auto made concrete for `world` processes, and why (the
    job's log line and the plan say it); other strategies come back as they are, with None.

    A resumed run (`saved`: the newest checkpoint's trainer state) keeps the strategy its
    checkpoint was trained with, so another --max-steps or process count never meets a checkpoint
    of the other engine. Otherwise ddp, or fsdp sharded inside the compiled graph for compiled runs
    of AUTO_IN_GRAPH_MIN_STEPS+ optimizer steps (--max-steps, else `steps`: --epochs counted once
    the data is loaded) on GPUs of one node over NVLink (`slow_link`: slow_gpu_link) of models of up
    to AUTO_IN_GRAPH_MAX_PARAMS `params`. While only the model's size or the run's length is left
    to decide and is not known (None), `args` come back still auto, with None."""
    if args.strategy != AUTO:
        return args, None
    ddp = replace(args, strategy=Strategy.ddp.value)
    in_graph = replace(args, strategy=Strategy.fsdp.value, compile_unit="model")
    if saved and saved.get("strategy") == Strategy.ddp.value:
        return ddp, "auto: as the checkpoint it resumes was trained"
    if saved and saved.get("strategy") == Strategy.fsdp.value and saved.get("sharding") == "in-graph":
        return in_graph, "auto: sharded in the compiled graph, as the checkpoint it resumes was trained"
    pinned = [flag for name, flag in _DDP_FLAGS.items() if getattr(args, name) not in (None, False, "fp32")]
    if args.precision == "fp8":  # float8 linears run on the replicated model only (fp8.py)
        pinned.append("--precision fp8")
    if pinned:
        return ddp, f"auto: {pinned[0]} applies to ddp"
    if world < 2 or not cuda:
        return ddp, "auto: " + ("one process" if world < 2 else "no CUDA GPUs")
    why = None
    if args.compile is False or args.compile_unit == "block":
        why = "--no-compile" if args.compile is False else "--compile-unit block"
    elif slow_link:
        why = f"{slow_link}, where its small buckets overlap the backward"
    elif args.grad_accum > 1:
        why = f"--grad-accum {args.grad_accum}: DDP syncs once a step"
    elif args.fused_ce or args.task != "causal-lm":
        why = f"{'--fused-ce' if args.fused_ce else '--task ' + args.task}: not measured sharded in the graph"
    length = args.max_steps if args.max_steps is not None else steps
    if not why and length is not None and length < AUTO_IN_GRAPH_MIN_STEPS:
        counted = f"{length:,} --max-steps" if args.max_steps is not None else f"{length:,} steps in --epochs"
        why = f"{counted}: below {AUTO_IN_GRAPH_MIN_STEPS:,} fsdp's in-graph compile does not repay itself"
    if why:
        return ddp, f"auto: {why}"
    if params is None or length is None:
        return args, None
    size = f"{count_words(params)} parameters"
    if params > AUTO_IN_GRAPH_MAX_PARAMS:
        return ddp, f"auto: {size}: above {count_words(AUTO_IN_GRAPH_MAX_PARAMS)} fsdp's in-graph engine is not faster"
    return in_graph, (
        f"auto: sharded in the compiled graph: {length:,} steps of {size} on {world} GPUs of one node "
        "repay its longer first compile (--strategy ddp to opt out)"
    )


def count_words(n: int) -> str:
    return f"{n / 1e6:,.0f}M" if n >= 10**6 else f"{n:,}"


def deepspeed_config_for(args, world_size: int) -> dict[str, Any]:
    """deepspeed_config for parsed training arguments (a TrainArgs) on `world_size` processes."""
    return deepspeed_config(
        parse_strategy(args.strategy),
        micro_batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        world_size=world_size,
        precision=args.precision,
        max_grad_norm=args.max_grad_norm,
    )


# Eager DDP all-reduces each 25 MB bucket (PyTorch's default) as soon as backward fills it.
# Under torch.compile, Dynamo splits the compiled graph at every bucket boundary to keep that
# overlap, and GPT-2 small's ~500 MB of gradients made ~20 graphs: on 4xH200, weak scaling was
# 78.9% with 25 MB buckets and 91.9% with 1000 MB (one bucket, one graph; bench/README.md). The
# fusion the splits cost was worth more than the overlap they bought.
DDP_BUCKET_MB_EAGER, DDP_BUCKET_MB_COMPILED = 25, 1000
# That trade holds on NVLink only. Where the all-reduce crosses a slower link it takes longer than
# the fusion saves, and overlapping it with the backward pays: on 4 H200s with NCCL's peer-to-peer
# off (NCCL_P2P_DISABLE=1, a stand-in for PCIe-only hosts), 25 MB buckets ran the compiled step at
# 1.23x and 1.18x one bucket's speed (bench/README.md, session 13). AWS connects these cards over
# PCIe only (g4dn, g5, g6, g6e); several nodes meet over the network, slower again than NVLink.
PCIE_ONLY_GPUS = ("T4", "A10G", "L4", "L40S")


def slow_gpu_link(env: Mapping[str, str], device_name: str | None, peer_access: bool | None = None) -> str | None:
    """Why the gradients' all-reduce crosses a link slower than NVLink (processes on several
    nodes, NCCL's peer-to-peer off or impossible between the node's GPUs, GPUs that AWS connects
    over PCIe only), or None."""
    world = int(env.get("WORLD_SIZE", "1"))
    local = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    if world > local:
        return f"processes on {-(-world // local)} nodes"
    if env.get("NCCL_P2P_DISABLE", "0").strip().lower() not in ("", "0", "false"):
        return "NCCL_P2P_DISABLE is set"
    if peer_access is False:
        return "no peer-to-peer access between the GPUs"
    words = (device_name or "").upper().replace("-", " ").split()
    if "PCIE" in words or any(gpu in words for gpu in PCIE_ONLY_GPUS):
        return f"{device_name} GPUs, connected over PCIe"
    return None


# Compiling costs a first step of 11-33 s (GPT-2 small, 4 H200s) and then saves 17-45 ms a step:
# measured side by side on one machine (bench/README.md, session 11), the compile is repaid after
# 695 steps under ddp (85.3 -> 40.0 ms), 1,032 under ZeRO-2 (77.0 -> 51.7 ms) and 639 under ZeRO-3
# block by block (128.9 -> 112.3 ms). Below this many optimizer steps the default stays eager.
COMPILE_MIN_STEPS = 1000
# --precision fp8 repays its compile sooner: eager, each float8 layer's scaling and casts are passes
# of their own, and the step runs 0.74x eager bf16's. llama-1b on an H200 (sessions 34-38): micro-batch
# 8 eager 450.7 ms a step against 195.8 compiled, a first step of 66.6 s cold against 1.6 (repaid
# after 255 steps); micro-batch 16 856.2 against 372.0 ms, 104-122 s cold against 1.9 (after 211-248). Twice the
# measured break-even, for smaller models, whose steps save fewer milliseconds.
COMPILE_MIN_STEPS_FP8 = 500
# Evaluation's own compile is taken to pay once its forwards add up to this many training
# micro-batches (a forward is about a third of a step's work, so 200 steps' worth). Its break-even
# has not been measured; this is the threshold evaluation has used since session 8.
EVAL_COMPILE_MIN_BATCHES = 600


def compile_decision(
    requested: bool | None,
    *,
    cuda: bool,
    strategy: Strategy,
    max_steps: int,
    has_blocks: bool = True,
    fp8: bool = False,
) -> tuple[bool, str]:
    """Whether to torch.compile the model, and the reason the log line gives.

    --compile / --no-compile decide; the default compiles where it is safe and pays: CUDA GPUs
    (Inductor's CPU code is slower to build than it saves on small runs), DDP, FSDP (each block
    compiled, its sharding hooks left outside), one process, ZeRO-2 (the model compiled inside
    DeepSpeed's engine) or ZeRO-3 (each block compiled, DeepSpeed's hooks left outside), and a run
    long enough to repay compiling (COMPILE_MIN_STEPS; `fp8`, --precision fp8: COMPILE_MIN_STEPS_FP8).
    `has_blocks`: the model names its transformer block class, which ZeRO-3's default compile needs
    (compiled whole, it recompiles at every block's hooks)."""
    if requested is not None:
        return requested, "--compile" if requested else "--no-compile"
    if not cuda:
        return False, "default: no CUDA GPU"
    if strategy.uses_deepspeed and strategy not in (Strategy.zero2, Strategy.zero3):
        # Never measured compiled on a GPU. ZeRO-3 block by block ran 1.15x its eager step at
        # GPT-2 small and 1.0x at XL with 30% less memory (4 H200s, session 11).
        return False, f"default: {strategy.value} runs eager: not measured compiled (--compile to try it)"
    if strategy is Strategy.zero3 and not has_blocks:
        return False, "default: zero3 runs eager: the model names no transformer block class to compile"
    if max_steps < compile_min_steps(fp8):
        return False, f"default: {max_steps} steps are too few to repay compiling (--compile to force)"
    return True, "default on CUDA GPUs; --no-compile to opt out"


def compile_min_steps(fp8: bool) -> int:
    """The run length from which the default compiles (compile_decision)."""
    return COMPILE_MIN_STEPS_FP8 if fp8 else COMPILE_MIN_STEPS


def eval_compile_decision(*, evals: int, eval_samples: int, batch_size: int) -> tuple[bool, str]:
    """Whether a compiled job also runs its evaluation compiled, and the reason the log line gives.

    Evaluation is a graph of its own (no gradients, eval mode, its own batch shapes) with a compile
    of its own: 19 s for GPT-2 small on one H200 and 41 s for GPT-2 XL on two, to evaluate 13 and
    14 samples (bench/README.md, session 8). It pays when the run's evaluation forwards add up to
    EVAL_COMPILE_MIN_BATCHES training micro-batches. `eval_samples` is one evaluation's samples per
    process, `batch_size` the training micro-batch per process."""
    total, needed = evals * eval_samples, EVAL_COMPILE_MIN_BATCHES * batch_size
    if total >= needed:
        return True, f"{total} evaluation samples per process over the run repay it"
    return False, f"{total} evaluation samples per process over the run are too few to repay compiling"


# Strategies whose sharding hooks run around each transformer block: compiled, each block is compiled
# on its own and the hooks stay eager between blocks. A whole-model graph breaks at every hook:
# FSDP2's cannot be traced at all, and Dynamo traces DeepSpeed's ZeRO-3 hooks, specialises them on
# each block's id and recompiles them block after block (GPT-2 XL on 4 H200s hit the recompile limit
# with no first step after 46 s; on 2 CPU processes, 60 recompiles and 14 graphs against 2 graphs
# block by block, bench/README.md, session 10).
BLOCK_COMPILED = (Strategy.fsdp, Strategy.zero3, Strategy.zero3_offload)


def compile_unit_for(
    strategy: Strategy, requested: str | None, in_graph: bool = False, fsdp_blocks_per_unit: int | None = None
) -> str:
    """What one torch.compile covers: --compile-unit, else blocks where sharding hooks sit between
    them (BLOCK_COMPILED), else the whole model; and the whole model for fsdp sharded inside the
    graph (`in_graph`, fsdp_in_graph) and for FSDP2 with no units of blocks (--fsdp-blocks-per-unit
    0), whose one unit's hooks sit around the model's forward, not inside it."""
    if in_graph or (strategy is Strategy.fsdp and fsdp_blocks_per_unit == 0):
        return "model"
    return requested or ("block" if strategy in BLOCK_COMPILED else "model")


def ddp_bucket_mb(
    requested: int | None,
    compiled: bool,
    compile_unit: str | None = None,
    compiled_autograd: bool = False,
    slow_link: bool = False,
) -> int:
    """DDP's gradient bucket size in MB: --ddp-bucket-mb, else the default for eager or compiled.
    Compiled block by block (--compile-unit block), the graphs are not split at buckets: gradients
    reach DDP's reducer block by block, as in an eager backward, so the eager size serves. So it
    does with --compiled-autograd, whose backward is one graph whatever the buckets: one bucket
    would hold every all-reduce back until the last gradient. And over a slow link (slow_gpu_link)
    the overlap is worth more than one graph."""
    if requested is not None:
        return requested
    whole = compiled and compile_unit != "block" and not compiled_autograd and not slow_link
    return DDP_BUCKET_MB_COMPILED if whole else DDP_BUCKET_MB_EAGER


def ddp_buckets_for(args, compiled: bool, slow_link: str | None) -> tuple[int, str | None]:
    """DDP's bucket size for a TrainArgs `args` (ddp_bucket_mb), and the slow link (slow_gpu_link)
    where it is what made the default small: the trainer logs it, a plan shows it."""
    mb = ddp_bucket_mb(args.ddp_bucket_mb, compiled, args.compile_unit, args.compiled_autograd, bool(slow_link))
    fast = ddp_bucket_mb(args.ddp_bucket_mb, compiled, args.compile_unit, args.compiled_autograd)
    return mb, slow_link if mb != fast else None


def planned_link(world_size: int, nodes: int, gpu_model: str | None) -> str | None:
    """slow_gpu_link as the processes of `nodes` instances with `gpu_model` GPUs will find it."""
    env = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(max(1, world_size // nodes))}
    return slow_gpu_link(env, gpu_model)


def accelerate_config(
    strategy: Strategy,
    cluster: ClusterShape,
    *,
    precision: str,
) -> dict[str, Any]:
    """The YAML that `accelerate launch --config_file` reads on one node.

    DeepSpeed strategies launch like DDP (torchrun, one process per device): the training
    process builds its DeepSpeedPlugin from `deepspeed_config`, with real batch sizes. A
    DEEPSPEED launch config would also export accelerate's DeepSpeed variables, which then
    clash with that explicit config. `use_cpu` stays off for them because accelerate skips
    DeepSpeed under it; DeepSpeed picks the CPU itself (DS_ACCELERATOR=cpu). `fsdp` launches
    the same way for the same reason: its process builds the plugin from `fsdp_plugin_settings`.
    """
    if strategy is Strategy.single and cluster.world_size > 1:
        raise ValueError(
            f"strategy 'single' runs one process, but the cluster has {cluster.world_size}; "
            "use --strategy ddp (or a zero* strategy) for several processes"
        )
    if cluster.world_size == 1 and not strategy.needs_process_group:
        distributed_type = "NO"
    else:  # torchrun; accelerate's MULTI_CPU launcher starts one process without mpirun
        distributed_type = "MULTI_GPU"
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed_type,
        "num_machines": cluster.num_nodes,
        "machine_rank": cluster.node_rank,
        "num_processes": cluster.world_size,
        "main_process_ip": cluster.main_addr,
        "main_process_port": cluster.main_port,
        "mixed_precision": Precision(precision).autocast,  # each process converts fp8's linears itself
        "use_cpu": cluster.use_cpu and not strategy.uses_deepspeed,
        "gpu_ids": "all",
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "downcast_bf16": "no",
    }
