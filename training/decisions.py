"""The run's decisions, as one value: which strategy and engine, compiled how, with which loss and
buckets, and why each.

Torch-free and pure: the trainer decides here (twice: before the model is loaded, then with its
size and the run's length), the launcher's plan and its memory estimate decide here with what a
plan knows, and so the three cannot disagree. The rules themselves (each with the measurements
behind it) live in strategies.py; this file is the only caller that puts them together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from . import strategies  # by module: a test's shim replaces strategies.resolve_auto (tests/training/auto_shim)
from .args import (
    FP8_AUTO_BF16_LAYERS,
    ArgumentError,
    fp8_auto_recipe,
    fp8_bf16_layer_names,
    fp8_flags_given,
    fp8_linear_of,
)
from .engines.facts import FACTS, GRAPH_FSDP, engine_of
from .modeling import head_loss_flags_why_not
from .strategies import AUTO, COMPILE_MIN_STEPS, Strategy

if TYPE_CHECKING:
    from .args import TrainArgs


@dataclass(frozen=True)
class Decisions:
    """What the run does and why. `args` are the arguments as decided: --strategy auto made
    concrete (and --compile-unit model where auto picked fsdp sharded in the graph),
    --fsdp-blocks-per-unit 0 where FSDP2 made a small compiled model one unit (fsdp_units_why), and
    under --precision fp8 the head and fast accumulation settings fp8_auto_recipe made concrete."""

    args: TrainArgs
    strategy: Strategy  # as the processes launch: ddp while auto is still undecided
    strategy_why: str | None  # auto's reason; None for a strategy the user named
    decided: bool  # False: auto waits for the model's size or the run's length
    engine: str  # a name of engines/facts.py: SINGLE, DDP, DEEPSPEED, FSDP2 or GRAPH_FSDP
    engine_why: str | None  # fsdp's: why this engine of its two
    compiled: bool
    compile_why: str
    compile_length_known: bool  # False: the run's length was not known, so taken as long enough to compile
    compile_unit: str  # "model" or "block": what one torch.compile covers, if compiled
    head_loss_why_not: str | None  # None: the flags allow losses.head_loss (the model may still not)
    ddp_bucket_mb: int
    ddp_slow_link: str | None  # the slow link that made the buckets small, if it did
    # why FSDP2's units are what they are, where the model's size decided it unasked (strategies.
    # fsdp_one_unit); args say 0 where it made the whole model one unit
    fsdp_units_why: str | None = None
    # why --precision fp8's auto recipe left the LM head bf16 (args.fp8_auto_recipe), if it did;
    # whether auto decided the head (no --fp8-head, --no-fp8-head or other head flag given)
    fp8_head_why: str | None = None
    fp8_head_auto: bool = False

    @property
    def zero_stage(self) -> int | None:
        return self.strategy.zero_stage

    @property
    def in_graph(self) -> bool:
        """fsdp sharded inside the compiled graph (graph_fsdp.py) rather than by FSDP2."""
        return self.engine == GRAPH_FSDP

    @property
    def sharding(self) -> str | None:
        """How a checkpoint holds sharded weights, where two engines share a strategy."""
        return "in-graph" if self.in_graph else None

    @property
    def strategy_words(self) -> str:
        """The strategy as the memory check names it: fsdp with the engine it runs."""
        if self.strategy is not Strategy.fsdp:
            return self.args.strategy
        return "fsdp sharded in the graph" if self.in_graph else "fsdp (FSDP2)"

    @property
    def compile_words(self) -> str:
        """How a plan names the compile decision after the strategy: ", compiled", nothing (eager),
        or, where it turns on a run length not known, the length it needs."""
        if not self.compiled:
            return ""
        if not self.compile_length_known and self.args.compile is None:
            return f", compiled if it runs {strategies.compile_min_steps(self.args.precision == 'fp8'):,}+ steps"
        return ", compiled"

    @property
    def ddp_buckets_words(self) -> str:
        """What a plan shows for DDP's gradient buckets: the size the training processes pick
        (strategies.ddp_buckets_for), and why."""
        mb = self.ddp_bucket_mb
        if self.args.ddp_bucket_mb is not None:
            return f"{mb} MB (--ddp-bucket-mb)"
        if mb == strategies.DDP_BUCKET_MB_COMPILED:
            return f"{mb} MB: one bucket, one compiled graph (GPUs of one node over NVLink)"
        return (
            f"{mb} MB: {self.ddp_slow_link}, so the all-reduces overlap the backward"
            if self.ddp_slow_link
            else f"{mb} MB"
        )

    def strategy_lines(self, processes: int) -> list[str]:
        """What the job logs about its strategy: auto's pick and why (one process running plain ddp
        says nothing: the usual quick check), then DDP's buckets where it runs DDP."""
        lines = []
        if self.strategy_why and (processes > 1 or self.strategy is not Strategy.ddp):
            lines.append(f"strategy={self.strategy.value} ({self.strategy_why})")
        if self.strategy is Strategy.ddp and processes > 1:
            lines.append(f"ddp_bucket_mb={self.ddp_bucket_mb}")
            if self.ddp_slow_link:  # it made the default small
                why = "small gradient buckets, so the all-reduces overlap the backward"
                lines.append(f"ddp: {self.ddp_slow_link}: {why}")
        return lines


# Without Inductor to fuse them, each float8 layer's scaling and casts are passes of their own:
# llama-1b at micro-batch 8 on an H200 ran 36,354 tokens/s in fp8 eager against 49,087 in bf16
# eager (session 38), where compiled fp8 runs 83,656 (session 37; bench/README.md).
FP8_EAGER = (
    "float8 runs slower eager than bf16 does (llama-1b on an H200: 0.74x bf16's eager speed; compiled, "
    "1.25-1.3x bf16's): give --compile, or train a short run in bf16"
)


def decide(
    args: TrainArgs,
    *,
    world: int,
    cuda: bool,
    slow_link: str | None = None,
    saved: Mapping[str, Any] | None = None,
    params: int | None = None,
    steps: int | None = None,
    has_blocks: bool = True,
    fp8_head_why_not: str | None = None,
) -> Decisions:
    """The decisions for `args` on `world` processes (`cuda`: on CUDA GPUs; `slow_link`: why their
    all-reduce crosses a link slower than NVLink, strategies.slow_gpu_link), resuming the trainer
    state `saved` if any, for a model of `params` parameters (None: not known yet) over `steps`
    optimizer steps (None: only --max-steps, if given, says). `has_blocks`: the model names its
    transformer block class (ZeRO-3's default compile needs it). `fp8_head_why_not`: why the loaded
    model's LM head cannot multiply in float8 (modeling.fp8_head_model_why_not; None: it can, or the
    model is not loaded yet)."""
    resolved, strategy_why = strategies.resolve_auto(
        args, world=world, cuda=cuda, slow_link=slow_link, saved=saved, params=params, steps=steps
    )
    strategy = strategies.provisional_strategy(resolved.strategy)
    in_graph, engine_why = False, None
    if strategy is Strategy.fsdp:
        in_graph, fsdp_why = strategies.fsdp_in_graph(resolved, cuda=cuda)
        engine_why = strategy_why or fsdp_why
    engine = engine_of(strategy, in_graph)
    if resolved.precision == "fp8" and not FACTS[engine].fp8:
        # auto with fp8 is ddp, but a resumed checkpoint's strategy comes first (resolve_auto)
        raise ArgumentError(
            f"--precision fp8 runs under --strategy ddp or single; this run resumes a checkpoint trained with "
            f"{resolved.strategy} ({strategy_why}): drop --precision fp8"
        )
    length = resolved.max_steps if resolved.max_steps is not None else steps
    fp8 = resolved.precision == "fp8"  # its compile repays sooner, and its eager step is slower than bf16's
    compiled, compile_why = strategies.compile_decision(
        resolved.compile,
        cuda=cuda,
        strategy=strategy,
        max_steps=COMPILE_MIN_STEPS if length is None else length,
        has_blocks=has_blocks,
        fp8=fp8,
    )
    if fp8 and not compiled:
        compile_why += f"; {FP8_EAGER}"
    # DDP's buckets are fixed when the Accelerator is built, before the data says how long a run
    # counted in --epochs is: sized for the compile --max-steps alone decides.
    sized_for, _ = strategies.compile_decision(
        resolved.compile,
        cuda=cuda,
        strategy=strategy,
        max_steps=COMPILE_MIN_STEPS if resolved.max_steps is None else resolved.max_steps,
        fp8=fp8,
    )
    bucket_mb, bucket_link = strategies.ddp_buckets_for(resolved, sized_for, slow_link)
    one_unit, units_why = False, None
    if strategy is Strategy.fsdp and not in_graph:
        one_unit, units_why = strategies.fsdp_one_unit(resolved, compiled=compiled, params=params)
    if one_unit:
        resolved = replace(resolved, fsdp_blocks_per_unit=0)
    head_loss_why_not = head_loss_flags_why_not(resolved, engine)
    resolved, fp8_head_why = fp8_auto_recipe(resolved, head_loss_why_not or fp8_head_why_not)
    # the head flags given (--fp8-head, or one shaping the head, which asks for it too)
    asked = " and ".join(flag for flag in fp8_flags_given(args) if flag.startswith("--fp8-head"))
    if resolved.fp8_head and head_loss_why_not:  # only asked for: auto leaves it bf16 there
        raise ArgumentError(
            f"{asked}: the LM head multiplies in float8 inside the fast LM loss, which this run does not use "
            f"({head_loss_why_not}): drop {asked}"
        )
    return Decisions(
        args=resolved,
        strategy=strategy,
        strategy_why=strategy_why,
        decided=resolved.strategy != AUTO,
        engine=engine,
        engine_why=engine_why,
        compiled=compiled,
        compile_why=compile_why,
        compile_length_known=length is not None,
        compile_unit=strategies.compile_unit_for(
            strategy, resolved.compile_unit, in_graph, resolved.fsdp_blocks_per_unit
        ),
        head_loss_why_not=head_loss_why_not,
        ddp_bucket_mb=bucket_mb,
        ddp_slow_link=bucket_link,
        fsdp_units_why=units_why,
        fp8_head_why=fp8_head_why,
        fp8_head_auto=args.precision == "fp8" and not asked,
    )


def planned(
    args: TrainArgs,
    *,
    world_size: int,
    nodes: int,
    gpu_model: str | None,
    params: int | None,
    cuda: bool | None = None,
    saved: Mapping[str, Any] | None = None,
) -> Decisions:
    """decide() as the training processes will on `nodes` machines of `world_size` processes in
    all with `gpu_model` GPUs (None: no GPUs, unless `cuda` says there are), resuming the
    checkpoint `saved` if any (a cloud plan does not read it: a resumed job keeps its checkpoint's
    pick). Where auto waits for what only the job knows, it is planned as ddp, and the reason says
    what the job will decide."""
    cuda = gpu_model is not None if cuda is None else cuda
    link = strategies.planned_link(world_size, nodes, gpu_model) if world_size > 1 else None
    decided = decide(args, world=world_size, cuda=cuda, slow_link=link, saved=saved, params=params)
    if decided.decided:
        return decided
    unknown = " and ".join(
        what
        for what, missing in (("the model's size", params is None), ("the run's steps", args.max_steps is None))
        if missing
    )
    why = (
        f"auto: ddp, or fsdp sharded in the compiled graph for {strategies.AUTO_IN_GRAPH_MIN_STEPS:,}+ steps of a "
        f"model of at most {strategies.count_words(strategies.AUTO_IN_GRAPH_MAX_PARAMS)} parameters: the job "
        f"decides, once it knows {unknown}"
    )
    return replace(decided, args=replace(decided.args, strategy=Strategy.ddp.value), strategy_why=why)


def shown(decisions: Decisions) -> str:
    """The strategy as a plan shows it: auto's pick and why."""
    d = decisions
    return f"{d.args.strategy} ({d.strategy_why})" if d.strategy_why else d.args.strategy


def plan_configs(decisions: Decisions, world_size: int) -> dict[str, Any]:
    """What a plan shows beside the Accelerate launch config: the settings the training process
    builds for the decided strategy on `world_size` processes (the engine as decided, so on GPUs
    or not as the job will be)."""
    d, args = decisions, decisions.args
    if d.strategy.uses_deepspeed:
        return {"deepspeed_config": strategies.deepspeed_config_for(args, world_size)}
    if d.strategy is Strategy.fsdp:
        if d.in_graph:
            return {"fsdp_sharding": f"in the compiled graph, every weight a flat shard ({d.engine_why})"}
        per_unit = fsdp_units_shown(d)
        return {"fsdp_plugin": strategies.fsdp_plugin_settings(), "fsdp_blocks_per_unit": per_unit}
    return {"fp8_recipe": fp8_shown(d)} if args.precision == "fp8" else {}  # fp8 runs under ddp or single


def fp8_shown(d: Decisions) -> str:
    """--precision fp8's recipe as a plan shows it, as decided (args.fp8_auto_recipe): whose float8
    layers and scaling (and --fp8-grad-dtype e4m3), the backward's fast accumulation, and the LM
    head's matmuls."""
    a = d.args
    if a.fp8_head:
        kept = [
            part
            for part, dtype in (
                ("input gradient", a.fp8_head_grad_input),
                ("forward", a.fp8_head_forward),
                ("backward", a.fp8_head_backward),
            )
            if dtype == "bf16"
        ]
        head = "float8" + (f", its {' and '.join(kept)} bf16" if kept else "")
        head += " (auto; bf16 where the model's head cannot)" if d.fp8_head_auto else ""
    else:
        head = f"bf16 (auto: {d.fp8_head_why})" if d.fp8_head_why else "bf16"
    layers = f"{fp8_linear_of(a)} float8 layers, {a.fp8_recipe} {a.fp8_scaling} scaling"
    layers += ", e4m3 output gradients" if a.fp8_grad_dtype == "e4m3" else ""
    if a.fp8_bf16_layers == AUTO:  # the names are the loaded model's to confirm
        layers += f", the {', '.join(FP8_AUTO_BF16_LAYERS)} layers bf16 (auto; where the model has both)"
    elif names := fp8_bf16_layer_names(a):
        layers += f", the {', '.join(names)} layers bf16"
    shown = f"{layers}, fast accumulation in the backward: {a.fp8_fast_accum}; the LM head {head}"
    return shown if d.compiled else f"{shown}; eager ({d.compile_why})"


def fsdp_units_shown(d: Decisions) -> int | str:
    """FSDP2's units as a plan shows them: the number asked, or 0 and why, or what the job will
    decide once it knows the model's size."""
    per_unit, why = d.args.fsdp_blocks_per_unit, d.fsdp_units_why
    if per_unit == 0:
        return f"0 ({why or 'none: the whole model one unit'})"
    if per_unit is not None:
        return per_unit
    if why:  # the size decided: units of blocks
        return why
    units = f"units of about {strategies.FSDP_UNIT_PARAMS // 10**6}M parameters"
    if d.compiled and d.args.compile_unit is None:
        most = strategies.count_words(strategies.FSDP_ONE_UNIT_MAX_PARAMS)
        one = f"compiled, a model of at most {most} is one unit, the job decides once it knows the model's size"
        return f"auto ({units}; {one})"
    return f"auto ({units})"
