"""The training recipe: setup, train, evaluate, save. Reads top to bottom.

Every side effect that must happen once (printing, files, W&B, the Hub) sits behind
`accelerator.is_main_process`; everything collective (evaluation, checkpoints, the final
gather of ZeRO-3 weights) runs on all processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import importlib.util
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .args import ArgumentError, TrainArgs, default_lr
from .contract import INTERRUPT_EXIT_CODE, STOP_EXIT_CODE, Contract, free_port
from .decisions import Decisions, decide
from .profiling import Profiler
from .stopping import StopRequest, collective_timeout_handler, die_with_parent
from .strategies import (
    AUTO,
    Strategy,
    deepspeed_config_for,
    eval_compile_decision,
    fsdp_blocks_per_unit,
    fsdp_plugin_settings,
    provisional_strategy,
    slow_gpu_link,
)

# A setup step silent for this long gets a line saying what it is doing.
SLOW_PHASE_S = 10.0
WANDB_RESERVED = ":;,#?/'"  # characters W&B refuses in a run id


@dataclasses.dataclass
class TrainState:
    """Where training stands: what a checkpoint records beside the weights and optimizer, so that
    a resumed run continues from the same step, batch and W&B run."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already trained on
    wandb_run_id: str | None = None

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> TrainState:
        """From a checkpoint's trainer_state.json (which also holds what it can be resumed with)."""
        return cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved})

    def to_saved(self, **resumable_with: Any) -> dict[str, Any]:
        """What checkpoint.save writes to trainer_state.json."""
        return {**dataclasses.asdict(self), **resumable_with}


class Trainer:
    def __init__(self, args: TrainArgs, contract: Contract):
        self.args, self.contract = args, contract
        self.given_args = args  # as given: --strategy auto still auto (decisions.decide resolves it)
        self.lr = args.lr if args.lr is not None else default_lr(args)  # parse_args has filled it in
        # --strategy auto becomes ddp or fsdp in setup, where the processes and the checkpoint are known.
        self.strategy = provisional_strategy(args.strategy)
        self.decisions: Decisions  # setup's (decisions.py): the run's every choice and why
        self.graph_sharded = False  # fsdp sharded inside the compiled graph (graph_fsdp.py): setup decides
        self.stopping = StopRequest(args.stop_grace)  # SIGTERM/SIGINT, at any moment, bounded (stopping.py)
        self.stop_requested = False  # acted on at step boundaries, by every process at once
        self._born = time.perf_counter()
        if os.environ.get("DISTRAIN_DIE_WITH_LAUNCHER"):  # node_launch's: no trainer outlives its launcher
            die_with_parent(signal.SIGKILL)

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Check and prepare this process's environment, then build the Accelerator, the data, the
        model and its optimizer, and compile where it pays: one named step each, in this order."""
        import torch
        from accelerate.utils import set_seed

        from . import checkpoint, data, modeling

        world = int(os.environ.get("WORLD_SIZE", "1"))  # processes the launcher started
        # Read once each: DDP's buckets and auto's pick (twice) depend on the link; auto's on the
        # checkpoint it resumes, if any (read by every process: one node's folder).
        self.slow_link = slow_gpu_link(os.environ, *_local_gpu(torch.cuda.is_available())) if world > 1 else None
        self.resumes = checkpoint.newest_state(self.contract.checkpoint_dir) if self.args.strategy == AUTO else None
        # Decided before the Accelerator, which the engine and DDP's buckets configure; auto may
        # wait for the model's size and the run's length, decided again below.
        self._decide(world, cuda=torch.cuda.is_available())
        a = self.args
        self._check_environment(world, cuda=torch.cuda.is_available())
        self._patch_environment(cuda=torch.cuda.is_available())
        _allow_tf32(torch)
        self.accelerator = self._make_accelerator(world, cuda=torch.cuda.is_available())
        acc = self.accelerator
        if self.decisions.decided:  # else still undecided: said once the model is loaded
            self._print_strategy()
        set_seed(a.seed)
        with _slow_phase("loading the tokenizer and data (tokenized once, then cached)", self._print):
            self._load_data()
        with _slow_phase(f"loading the model {a.model or a.model_config or ''} (downloaded on first use)", self._print):
            model = self._load_model()
        train_dl, eval_dl, self.train_sampler = data.make_loaders(
            a, self.data, self.tokenizer, acc.num_processes, acc.device.type == "cuda"
        )
        self.steps_per_epoch = max(1, len(self.train_sampler) // a.grad_accum)
        self.max_steps = a.max_steps if a.max_steps is not None else math.ceil(a.epochs * self.steps_per_epoch)
        # Now with the model's size and the run's length: auto's pick, if it waited, and the compile.
        undecided = not self.decisions.decided
        params = sum(p.numel() for p in model.parameters())
        blocks = bool(_transformer_blocks(model))
        self._decide(world, cuda=torch.cuda.is_available(), params=params, steps=self.max_steps, has_blocks=blocks)
        a = self.args
        if undecided:  # in-graph fsdp or ddp, both of which take the Accelerator built above
            self._print_strategy()
        self.lm_loss_why_not = modeling.use_head_loss(model, a, self.strategy.value, self.graph_sharded)
        self.compiled, self.compile_why = self.decisions.compiled, self.decisions.compile_why
        if self.compiled and a.compiled_autograd:
            # Read when DDP wraps the model (acc.prepare): its reducer then leaves the all-reduces
            # to compiled autograd, which traces them into the backward graph.
            torch._dynamo.config.optimize_ddp = "python_reducer"
        builds = (
            " (DeepSpeed builds its ops on first use: minutes on a fresh machine)"
            if self.strategy.uses_deepspeed
            else ""
        )
        with _slow_phase(f"preparing the model and optimizer for {self.strategy.value}{builds}", self._print):
            if self.graph_sharded:
                self._shard_in_graph(model, torch)
            elif self.strategy is Strategy.fsdp:
                self._shard_block_units(model)
            optimizer = self._optimizer(model, torch)
            if self.graph_sharded:  # the model is not Accelerate's to wrap: DDP would all-reduce the shards
                self.model = model
                if acc.scaler is not None:  # fp16: every process skips an overflowing step, or none
                    from .graph_fsdp import agreeing_scaler

                    acc.scaler = agreeing_scaler(acc.scaler, acc.device.type)
                self.optimizer, self.train_dl, self.eval_dl = acc.prepare(optimizer, train_dl, eval_dl)
            else:
                self.model, self.optimizer, self.train_dl, self.eval_dl = acc.prepare(
                    model, optimizer, train_dl, eval_dl
                )
        self._compile(torch)

    def _decide(self, world: int, *, cuda: bool, **known: Any) -> None:
        """The run's decisions (decisions.decide) for this launch: its processes, its GPUs' link,
        the checkpoint auto resumes, if any, and what is `known` of the model and the run."""
        # From the arguments as given, each time: the reasons stay those of the first decision.
        d = self.decisions = decide(
            self.given_args, world=world, cuda=cuda, slow_link=self.slow_link, saved=self.resumes, **known
        )
        self.args, self.strategy = d.args, d.strategy
        self.graph_sharded, self.fsdp_why = d.in_graph, d.engine_why

    def _check_environment(self, world: int, *, cuda: bool) -> None:
        """Flags this machine or this launch cannot serve, refused before anything is built."""
        a = self.args
        if not self.lr > 0:  # also nan; the launcher's plan check says it before a job starts
            raise ArgumentError(f"--lr {a.lr:g}: the learning rate must be positive, e.g. --lr 3e-4")
        if a.fused_ce and a.ce_kernel == "liger" and importlib.util.find_spec("liger_kernel") is None:
            raise ArgumentError("--ce-kernel liger needs the liger-kernel package (pip install liger-kernel)")
        if a.ddp_reduce_dtype == "bf16" and not cuda:
            raise ArgumentError("--ddp-reduce-dtype bf16 needs GPUs (NCCL); gloo on CPU reduces fp32 or fp16")
        if self.strategy.value == "single" and world > 1:
            raise ArgumentError(f"--strategy single runs one process, but {world} were started; use --strategy ddp")

    def _patch_environment(self, *, cuda: bool) -> None:
        """Variables torch and DeepSpeed read later, set before they read them."""
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # a cache the user chose wins
            # Inductor's caches (FX graphs, AOT autograd graphs, Triton kernels) live beside the
            # checkpoints, which every backend keeps for a lineage (S3 for cloud jobs), so a resumed
            # job (a spot restart on another machine) loads its kernels instead of compiling them
            # again. Set before anything asks torch for its cache folder (it then fixes the default).
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.contract.checkpoint_dir / "compile-cache")
        if self.strategy.needs_process_group and "LOCAL_RANK" not in os.environ:
            # Started without a launcher: describe the one-process group torchrun would.
            os.environ.update(
                {
                    "RANK": "0",
                    "LOCAL_RANK": "0",
                    "WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(free_port()),
                }
            )
            if self.strategy is Strategy.fsdp and not cuda:  # gloo, as node_launch asks on CPU
                os.environ["ACCELERATE_USE_CPU"] = "true"

    def _make_accelerator(self, world: int, *, cuda: bool) -> Any:
        """The Accelerator, with our DDP settings and, for ZeRO strategies, the DeepSpeed plugin, for
        fsdp the FSDP2 one."""
        from accelerate import Accelerator
        from accelerate.utils import (
            DataLoaderConfiguration,
            DeepSpeedPlugin,
            FullyShardedDataParallelPlugin,
        )

        a, d = self.args, self.decisions
        ds_plugin, backend = None, None
        if self.strategy.uses_deepspeed:
            ds_plugin = DeepSpeedPlugin(hf_ds_config=deepspeed_config_for(a, world))
            if not cuda:
                # Without a named backend accelerate counts one process under DeepSpeed on
                # CPU while DeepSpeed sees them all; gloo makes both agree.
                backend = "gloo"
        # A collective whose peer never comes fails after --collective-timeout instead of hanging.
        handlers: list[Any] = [_ddp_kwargs(a.ddp_reduce_dtype, d.ddp_bucket_mb)]
        handlers.append(collective_timeout_handler(a.collective_timeout, backend))
        fsdp_plugin = None
        if self.strategy is Strategy.fsdp and not self.graph_sharded:
            fsdp_plugin = FullyShardedDataParallelPlugin(**fsdp_plugin_settings())
        accelerator = Accelerator(
            mixed_precision=a.precision,
            gradient_accumulation_steps=a.grad_accum,
            deepspeed_plugin=ds_plugin,
            fsdp_plugin=fsdp_plugin,
            # Global batches split across processes: the same data per optimizer step
            # whatever the world size.
            # non_blocking (with pinned memory): the host queues the copy and moves on
            # instead of waiting for the GPU to finish the previous step.
            dataloader_config=DataLoaderConfiguration(split_batches=True, non_blocking=True),
            # The data order is ours (seed, epoch), so nothing needs syncing or drawing
            # from the global RNG.
            rng_types=[],
            log_with="wandb" if a.report_to == "wandb" else None,
            kwargs_handlers=handlers,
        )
        if fsdp_plugin is not None:
            _select_fsdp(accelerator, fsdp_plugin)
        accelerator.register_save_state_pre_hook(_drop_tied_copies)
        return accelerator

    def _print_strategy(self) -> None:
        for line in self.decisions.strategy_lines(self.accelerator.num_processes):
            self._print(line)

    def _load_data(self) -> None:
        """The tokenizer and the tokenized splits (the main process first: it fills the caches)."""
        from . import data, modeling

        with _loading(self.args, "its tokenizer"):
            self.tokenizer = modeling.load_tokenizer(self.args)
        self.data = data.prepare(self.args, self.contract, self.tokenizer, self.accelerator.main_process_first)

    def _load_model(self) -> Any:
        """The model as it trains: loss-only training forwards, the attention kernel for this data,
        and for ZeRO-3 whole transformer blocks gathered at once."""
        from . import modeling

        a = self.args
        _select_sdpa_backend(a.sdpa_backend, padded=self.data.padded)
        names = self.data.label_names
        with _loading(a, "it"):
            model = modeling.load_model(
                a, self.tokenizer, len(names) if names else None, dict(enumerate(names)) if names else None
            )
        self.num_parameters = modeling.count_parameters(model)
        modeling.training_forward(model)
        if self.strategy.zero_stage == 3 and a.zero3_block_fetch:
            self._fetch_blocks_whole(model)
        return model

    def _compile(self, torch) -> None:
        """torch.compile the prepared model where it pays (strategies.compile_decision), as accelerate's
        dynamo plugin would, but with a backend that runs a graph Inductor fails on eagerly, with a
        warning, instead of ending the job."""
        a = self.args
        self._print(f"compile={'on' if self.compiled else 'off'} ({self.compile_why})")
        self.compiled_eval = False
        self.backward_compiler: Any = None
        self.eager_now = False  # compiled regions forced eager after a failed compiled backward (_backward)
        if not self.compiled:
            return
        evals = (self.max_steps - 1) // a.eval_every + 1 if a.eval_every else 1  # the final one too
        eval_samples = len(self.eval_dl) * (a.eval_batch_size or a.batch_size)
        self.compiled_eval, why = eval_compile_decision(evals=evals, eval_samples=eval_samples, batch_size=a.batch_size)
        self._print(f"compile_eval={'on' if self.compiled_eval else 'off'} ({why})")
        self._print(f"compile_cache={os.environ['TORCHINDUCTOR_CACHE_DIR']}")
        # PyTorch's way to bisect a compile problem: "aot_eager" runs Dynamo and AOTAutograd
        # (graph capture, DDP's bucketing, FSDP's hooks) without Inductor's code generation,
        # "eager" Dynamo alone. The CPU tests of compile plumbing use it: Inductor's C++ build
        # takes half a minute a process on CPU, and its numerics have tests of their own.
        backend: Any = os.environ.get("DISTRAIN_COMPILE_BACKEND")
        if backend:
            self._print(f"compile_backend={backend} (DISTRAIN_COMPILE_BACKEND)")
        else:
            backend = _inductor_or_eager(a.compile_mode, self._print)
        if a.compile_tuning:
            # Inductor then tries block sizes and warp counts around its heuristic pick for
            # each generated kernel (the norms, dropouts, adds and the loss: about 40% of
            # GPT-2 small's GPU time on an H100, the rest being cuBLAS and cuDNN).
            import torch._inductor.config as inductor_config

            inductor_config.coordinate_descent_tuning = True
        unit = self.decisions.compile_unit
        if unit == "block" and self._compile_blocks(torch, backend):
            return
        if self.strategy.uses_deepspeed:
            # DeepSpeed's own way: compile the model inside its engine, in place. Compiling the
            # engine traced its forward's bookkeeping too, whose flags change between steps: the
            # first steps each compiled the whole model again (4 compiles on 2 CPU processes; on 4
            # H200s ZeRO-2's second 10 steps did not finish in 47 s, bench/README.md, session 9).
            self.model.compile(backend=backend)
            self._print("compile_unit=model (inside DeepSpeed's engine)")
            return
        if self.graph_sharded:  # the shards' gathers and reduce-scatters bucketed in the graph
            import torch._inductor.config as inductor_config

            from .graph_fsdp import INDUCTOR_SETTINGS

            for key, value in INDUCTOR_SETTINGS.items():
                if hasattr(inductor_config, key):  # torch >= 2.9
                    setattr(inductor_config, key, value)
        self.model = torch.compile(self.model, backend=backend)
        self._print("compile_unit=model")
        if a.compiled_autograd:
            self.backward_compiler = torch.compile(backend=backend)
            reduces = ", DDP's all-reduces in it" if self.accelerator.num_processes > 1 else ""
            self._print(f"compiled_autograd=on (the backward one graph{reduces})")

    def _compile_blocks(self, torch, backend: Any) -> bool:
        """Compile each transformer block's forward and the loss, not the model (--compile-unit block;
        by default under fsdp and ZeRO-3, strategies.BLOCK_COMPILED). Blocks of one class share one
        compiled graph (Dynamo lifts their weights to inputs), so the compile takes about one
        block's time whatever the depth. False, with nothing compiled, where ZeRO-3 is compiled with no
        --compile-unit and the model names no block class: the caller then compiles the whole model
        (the default compile_decision keeps such a model eager).

        fsdp and ZeRO-3: the sharding hooks around a block or unit (gather its weights, free them,
        reduce its gradients) run eagerly between compiled blocks, as in torchtitan, instead of
        breaking one compiled graph at every unit. DDP: a block's gradients reach DDP's reducer when
        that block's backward ends, so its buckets are all-reduced while earlier blocks' backward
        runs, as in an eager step; one compiled model instead all-reduces its one bucket after the
        whole backward."""
        model = self.accelerator.unwrap_model(self.model)
        blocks = _transformer_blocks(model)
        if not blocks and self.strategy is not Strategy.fsdp:  # fsdp then compiles the loss alone, as before
            if self.args.compile_unit is None:  # ZeRO-3's default unit: compile the whole model instead
                return False
            raise ArgumentError(
                f"--compile-unit block: {type(model).__name__} names no "
                "transformer block class (_no_split_modules); use --compile-unit model"
            )
        if self.strategy is Strategy.ddp or self.strategy is Strategy.single:
            # Dynamo would otherwise split each block's graph at DDP's bucket boundaries (the
            # splitting one compiled model needs); the reducer's own hooks give the overlap here.
            torch._dynamo.config.optimize_ddp = False
        for block in blocks:
            block.forward = torch.compile(block.forward, backend=backend)
        # And the model's own loss, which the blocks leave out: eager, it upcasts the logits
        # (16x1024x50k for GPT-2 small) to fp32 and reads and writes them several times each way;
        # compiled, one fused pass (about 20 ms of an H100's step, bench/README.md, session 7).
        # --lm-loss fast needs no compiling: its one pass over the logits is a kernel of its own.
        from .modeling import HEAD_LOSS

        fast = bool(model.__dict__.get(HEAD_LOSS))
        if not fast:
            model.loss_function = torch.compile(model.loss_function, backend=backend)
        self._print(f"compile_unit=block blocks={len(blocks)} loss={'fast' if fast else 'compiled'}")
        return True

    def _backward(self, loss: Any, again: Callable[[], Any], micro: int) -> Any:
        """acc.backward(loss); with --compiled-autograd, traced and compiled as one graph (torch's
        compiled autograd, a private API in torch 2.11). Returns the loss backward'd: `again()`'s
        where a compiled job's backward failed.

        A compiled model's backward graph is compiled at its first backward, out of reach of the
        backend's guard (_inductor_or_eager), and compiled autograd's first run raised inside an
        Inductor kernel on 4 H200s under torch 2.11 (bench/README.md, session 11; _seeded_backward
        avoids that one). Either way the compiler costs speed, not the job: said once, the
        micro-batch's forward runs again and its backward eagerly (compiled autograd off, or under
        ddp and one process the whole job eager from here, DDP's reducer reset for the forward it
        did not finish). Only on a micro-batch that starts an optimizer step, since later ones add
        to gradients a half-run backward may have touched, and never for running out of memory,
        which eager would do sooner."""
        import torch

        ca = self.backward_compiler
        try:
            with _compiled_autograd(ca):
                if self.compiled and os.environ.pop("DISTRAIN_TEST_COMPILED_BACKWARD_FAIL", ""):  # test hook, once
                    _fail_partway(self.model)
                if ca is None:
                    self.accelerator.backward(loss)
                else:
                    _seeded_backward(self.accelerator, loss)
            return loss
        except Exception as e:
            stance = hasattr(torch.compiler, "set_stance")  # torch >= 2.6
            whole_job = (
                self.compiled and not self.eager_now and stance and self.strategy in (Strategy.ddp, Strategy.single)
            )
            if micro or isinstance(e, torch.OutOfMemoryError) or not (ca is not None or whole_job):
                raise
            reason = " ".join(str(e).split())[:200] or type(e).__name__
            if ca is not None:
                self.backward_compiler = None
                # DDP's Python reducer stays: it then all-reduces each gradient on its own, slowly
                alone = ", each gradient all-reduced alone" if self.accelerator.num_processes > 1 else ""
                what = f"the backward runs eagerly from here{alone} (drop --compiled-autograd)"
            else:
                torch.compiler.set_stance("force_eager")  # every compiled region, for the rest of the job
                reducer = getattr(self.model, "reducer", None)
                if reducer is not None and not getattr(self.model, "_use_python_reducer", False):
                    reducer._reset_state()
                self.eager_now, what = True, "the job runs eagerly from here (--no-compile avoids it)"
            self._print(f"warning: the compiled backward failed ({reason}); {what}")
        self.optimizer.zero_grad(set_to_none=True)
        loss = again()
        self.accelerator.backward(loss)
        return loss

    def _clip(self, max_norm: float) -> None:
        """Clip the gradients' total norm; under fsdp on the local shards (training/sharded.py)."""
        acc = self.accelerator
        if self.graph_sharded:
            from .graph_fsdp import clip_

            acc.unscale_gradients()  # fp16's loss scale first, as below
            clip_(self.model, max_norm)
            return
        grads = None
        if self.strategy is Strategy.fsdp:
            from .sharded import sharded_grads

            grads = sharded_grads(self.model.parameters())
        if grads is None:
            acc.clip_grad_norm_(self.model.parameters(), max_norm)
            return
        from .sharded import clip_sharded_grads_

        acc.unscale_gradients()  # fp16's loss scale first, once, as Accelerate's own clipping does
        clip_sharded_grads_(grads, max_norm)

    def _print_first_step(self, seconds: float) -> None:
        line = f"first_step_s={seconds:.1f}"
        if self.compiled:
            from torch._dynamo.utils import counters

            line += f" compile_cache_hits={counters['inductor']['fxgraph_cache_hit']}"
        self._print(line)
        if self.compiled:
            # Distinct graphs Dynamo captured: blocks compiled one by one share one (_compile_blocks).
            self._print(f"compiled_graphs={counters['stats']['unique_graphs']}")
            times = _compile_times()
            if times:
                self._print(f"compile_times={times}")

    def _shard_in_graph(self, model, torch) -> None:
        """fsdp, --compile-unit model: every weight a flat shard that an all-gather in the model's
        graph turns back into the weight (graph_fsdp.py). The model stays outside Accelerate's
        prepare, so it is placed here, and runs its forward under the training precision's
        autocast as Accelerate would make it."""
        import torch.distributed as dist

        from . import graph_fsdp

        acc = self.accelerator
        if not dist.is_initialized():  # one process: Accelerate starts no group, the gathers need one
            timeout = datetime.timedelta(seconds=self.args.collective_timeout)
            dist.init_process_group("nccl" if acc.device.type == "cuda" else "gloo", timeout=timeout)
        model.to(acc.device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(acc.mixed_precision, torch.float32)
        weights = graph_fsdp.shard_model(model, dtype)
        if acc.mixed_precision != "no":
            model.forward = torch.autocast(acc.device.type, dtype=dtype)(model.forward)
        self._print(f"fsdp_sharding=in-graph weights={weights} processes={acc.num_processes} ({self.fsdp_why})")

    def _shard_block_units(self, model) -> None:
        """fsdp: shard the transformer blocks in units of several consecutive blocks
        (strategies.fsdp_blocks_per_unit), before Accelerate shards the rest of the model."""
        from .modeling import count_parameters
        from .sharded import shard_block_units

        blocks = _transformer_blocks(model)
        if not blocks:
            self._print("fsdp_shard_unit=model blocks=0")
            return
        per_unit = fsdp_blocks_per_unit(self.args.fsdp_blocks_per_unit, len(blocks), count_parameters(blocks[0]))
        acc, name = self.accelerator, type(blocks[0]).__name__  # before FSDP renames it FSDP<name>
        units = shard_block_units(blocks, per_unit, acc.state.fsdp_plugin, mixed_precision=acc.mixed_precision != "no")
        self._print(f"fsdp_shard_unit={name} blocks={len(blocks)} blocks_per_unit={per_unit} units={units}")
        if acc.device.type == "cuda":  # where the other engine is an option worth naming
            self._print(f"fsdp: FSDP2 ({self.fsdp_why})")

    def _fetch_blocks_whole(self, model) -> None:
        """ZeRO-3 gathers parameters per module through Python hooks; for GPT-2's dozen small
        layers per block that host overhead, not bandwidth, bounds the step. Making each
        transformer block (the classes the model names in _no_split_modules, the unit FSDP
        wraps) a ZeRO-3 leaf gathers a block at once: a block's parameters are live together,
        which prefetching brings about anyway."""
        from deepspeed.utils import set_z3_leaf_modules

        classes = sorted({type(m) for m in _transformer_blocks(model)}, key=lambda c: c.__name__)
        if classes:
            set_z3_leaf_modules(model, classes)
            self._print("zero3_fetch_unit=" + ",".join(c.__name__ for c in classes))

    def _optimizer(self, model, torch):
        a = self.args
        # No weight decay on biases and normalisation weights: exactly the 1-D parameters.
        # ZeRO-3 has already partitioned them into flat shards: their shape is in ds_shape.
        decay: list[Any] = []
        other: list[Any] = []
        # Weights sharded in the graph keep theirs in full_shape (graph_fsdp.py).
        shape = lambda p: getattr(p, "full_shape", getattr(p, "ds_shape", p.shape))  # noqa: E731
        for p in model.parameters():
            if p.requires_grad:
                (other if len(shape(p)) < 2 else decay).append(p)
        groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": other, "weight_decay": 0.0}]
        count = lambda ps: sum(getattr(p, "ds_numel", math.prod(shape(p))) for p in ps)  # noqa: E731
        self._print(f"optimizer_params decay={count(decay)} no_decay={count(other)}")
        if self.strategy.offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam  # the optimizer runs where its state lives

            return DeepSpeedCPUAdam(groups, lr=self.lr)
        if self.strategy is Strategy.fsdp and not self.graph_sharded:
            from .sharded import shard_local_adamw

            return shard_local_adamw(groups, lr=self.lr)
        # Fused AdamW is one kernel per step instead of several per parameter.
        fused = self.accelerator.device.type == "cuda"
        return torch.optim.AdamW(groups, lr=self.lr, fused=fused)

    # ------------------------------------------------------------------ train

    def train(self) -> dict[str, Any]:
        from . import checkpoint

        a, acc = self.args, self.accelerator
        state = TrainState()
        resumed = self._resume_point()
        if resumed:
            path, saved = resumed
            # Before Accelerate reads it: a ZeRO checkpoint of another world size or strategy
            # would end in a DeepSpeed traceback there.
            checkpoint.check_resumable(path, saved, acc.num_processes, self.strategy.value, self._sharding)
            batches = checkpoint.resume_batches(path, saved, acc.num_processes, a.batch_size, a.grad_accum)
            acc.load_state(str(path))
            if self.graph_sharded:  # each process's own shards and optimizer state
                from .graph_fsdp import load

                unwrapped = acc.unwrap_model(self.model, keep_torch_compile=False)
                load(path, unwrapped, self.optimizer, saved.get("world_size"))
            state = TrainState.from_saved(saved)
            state.batch_in_epoch = batches.batch_in_epoch
            self._print(f"resumed_from={path.name} step={state.step}")
            if batches.grad_accum != a.grad_accum:
                self._accumulate(batches.grad_accum)
                a = self.args
            if batches.note:
                self._print(batches.note)
            if state.step >= self.max_steps:  # a finished run, resumed as it was: nothing to train
                raise checkpoint.CheckpointError(
                    f"{path.name} is at step {state.step} and this run trains {self.max_steps} steps: it completed; "
                    f"to train further, resume with a higher --max-steps (e.g. --max-steps {2 * state.step})"
                )
            if batches.regrouped and state.batch_in_epoch and self.data.lengths is not None:
                # Length-grouped batches are formed in pools of whole batches: another batch size
                # groups the rest of this epoch anew (later epochs are whole again).
                self._print(
                    "note: batches of another size group this epoch's examples by length anew: some of the "
                    "rest of this epoch may repeat examples already trained on, or skip some"
                )
        self._start_tracking(state)
        self.stopping.install(self._print, speaks=acc.is_local_main_process)
        self.contract.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_file = self.contract.output_dir / "metrics.jsonl"

        profiler = Profiler(a.profile_steps, acc, self.contract.output_dir)
        progress = self._bar = self._progress(initial=state.step)
        window = _Window()
        self.model.train()
        started, first_step_done = time.perf_counter(), False
        self._clock = (started, state.step)  # for elapsed and remaining time in the step lines
        self._training_started = started  # `done:` times training apart from setup (a first op build: minutes)
        while state.step < self.max_steps and not self.stop_requested:
            self.train_sampler.set_epoch(state.epoch)
            self.train_dl.set_epoch(state.epoch)
            loader = self.train_dl
            if state.batch_in_epoch:
                loader = acc.skip_first_batches(self.train_dl, state.batch_in_epoch)
            micro, micro_loss = 0, 0.0
            batches = iter(loader)
            while True:
                t0 = time.perf_counter()
                batch = next(batches, None)
                window.data_wait += time.perf_counter() - t0
                if batch is None:
                    break
                lr = lr_at(state.step, self.lr, a.warmup_steps, self.max_steps, a.scheduler)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                with acc.accumulate(self.model):
                    with profiler.phase("forward"):
                        loss = self._loss(batch, state.step, micro)
                    with profiler.phase("backward"):
                        loss = self._backward(loss, functools.partial(self._loss, batch, state.step, micro), micro)
                    if acc.sync_gradients and a.max_grad_norm and not self.strategy.uses_deepspeed:
                        with profiler.phase("clip"):
                            self._clip(a.max_grad_norm)
                    with profiler.phase("optimizer"):
                        self.optimizer.step()
                        self.optimizer.zero_grad(set_to_none=True)
                # A new tensor, never the loss itself: CUDA graphs (reduce-overhead) reuse the
                # loss's memory on their next replay.
                micro_loss, micro = micro_loss + loss.detach(), micro + 1
                window.add_tokens(batch)
                state.batch_in_epoch += 1
                if not acc.sync_gradients:
                    continue
                state.step += 1
                step = state.step
                if not first_step_done:  # compilation happens here: what a resumed job pays again
                    self._print_first_step(time.perf_counter() - started)
                    first_step_done = True
                window.losses.append(micro_loss / micro)
                micro, micro_loss = 0, 0.0
                progress.update(1)
                profiler.step(step)
                self._check_stop(step)
                if step % a.log_every == 0 or step == self.max_steps or self.stop_requested:
                    self._log_train(step, window)
                    window = _Window()
                if a.eval_every and step % a.eval_every == 0 and step < self.max_steps:
                    self.evaluate(step)
                if (a.save_every and step % a.save_every == 0) or self.stop_requested:
                    # What the checkpoint can be resumed with is recorded beside the position.
                    saved = state.to_saved(
                        world_size=acc.num_processes,
                        strategy=self.strategy.value,
                        sharding=self._sharding,
                        batch_size=a.batch_size,  # with the world size, the global batch a resume keeps
                        grad_accum=a.grad_accum,
                    )
                    checkpoint.save(
                        acc, self.contract.checkpoint_dir, step, saved, a.keep_checkpoints, self._save_shards
                    )
                _maybe_die_for_test(step)
                if step >= self.max_steps or self.stop_requested:
                    break
            if batch is None:
                state.epoch += 1
                state.batch_in_epoch = 0
        progress.close()
        profiler.close()
        if self.stop_requested:  # the loop saved a checkpoint at the step it stopped
            # A process told by the others (it saw no signal itself) stops as SIGTERM would.
            self.stopping.saved()
            sig = self.stopping.signal or signal.SIGTERM
            self._print(f"stopped={sig.name} step={state.step} checkpoint_saved=1")
            acc.end_training()
            sys.exit(INTERRUPT_EXIT_CODE if sig == signal.SIGINT else STOP_EXIT_CODE)
        return self.evaluate(state.step)

    def _accumulate(self, micro_batches: int) -> None:
        """Train with this many micro-batches a step from here (a resume on another number of
        processes keeping its global batch, checkpoint.resume_batches); a run counted in epochs
        keeps its number of epochs."""
        self.args = dataclasses.replace(self.args, grad_accum=micro_batches)
        self.accelerator.gradient_accumulation_steps = micro_batches
        self.steps_per_epoch = max(1, len(self.train_sampler) // micro_batches)
        if self.args.max_steps is None:
            self.max_steps = math.ceil(self.args.epochs * self.steps_per_epoch)

    @property
    def _sharding(self) -> str | None:
        """How the checkpoints hold sharded weights, where two engines share a strategy."""
        return "in-graph" if self.graph_sharded else None

    def _save_shards(self, folder) -> None:
        """checkpoint.save's part for this process beside Accelerate's: under in-graph fsdp its shards."""
        if self.graph_sharded:
            from .graph_fsdp import save

            save(folder, self.accelerator.unwrap_model(self.model, keep_torch_compile=False), self.optimizer)

    def _resume_point(self):
        """The newest complete checkpoint that verifies, chosen by the main process (which
        reads it once and says once which ones it skipped) and handed to the others, so that
        every process loads the same one."""
        from . import checkpoint

        acc = self.accelerator
        found = checkpoint.latest(self.contract.checkpoint_dir) if acc.is_main_process else None
        if acc.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            found = broadcast_object_list([found])[0]
        return found

    def _loss(self, batch, step: int, micro: int):
        if self.args.task == "masked-lm":
            batch = self._mask(batch, seed=(self.args.seed, step, micro, self.accelerator.process_index))
        elif self.args.task == "causal-lm":
            if self.args.fused_ce:
                return self._fused_lm_loss(batch["input_ids"])
            batch = {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
        return self.model(**batch).loss

    def _fused_lm_loss(self, input_ids):
        import torch

        from .losses import fused_causal_lm_loss, liger_causal_lm_loss

        # Through the wrapped model (DDP needs its forward), with logits for one position
        # only; the LM head and loss run chunked in losses.py.
        out = self.model(input_ids=input_ids, output_hidden_states=True, logits_to_keep=1)
        head = self.accelerator.unwrap_model(self.model).get_output_embeddings().weight
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.args.precision, torch.float32)
        if self.args.ce_kernel == "liger":
            return liger_causal_lm_loss(out.hidden_states[-1], head, input_ids, dtype=dtype)
        return fused_causal_lm_loss(out.hidden_states[-1], head, input_ids, dtype=dtype, compile_=self.compiled)

    def _mask(self, batch, seed: tuple[int, ...]):
        """MLM masking from a generator keyed on (seed, step, ...): deterministic, so resume
        is exact, and independent of the data loader's prefetching."""
        import torch

        ids = batch["input_ids"]
        g = torch.Generator(device="cpu").manual_seed(hash(seed) & 0x7FFF_FFFF)
        probs = torch.rand(ids.shape, generator=g).to(ids.device)
        special = torch.zeros_like(ids, dtype=torch.bool)
        for tid in self.tokenizer.all_special_ids:
            special |= ids == tid
        masked = (probs < self.args.mlm_probability) & ~special
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        # BERT's 80/10/10: mask, random token, unchanged.
        choice = torch.rand(ids.shape, generator=g).to(ids.device)
        inputs = torch.where(masked & (choice < 0.8), torch.full_like(ids, self.tokenizer.mask_token_id), ids)
        random_ids = torch.randint(len(self.tokenizer), ids.shape, generator=g).to(ids.device)
        inputs = torch.where(masked & (choice >= 0.8) & (choice < 0.9), random_ids, inputs)
        return {"input_ids": inputs, "labels": labels}

    # ------------------------------------------------------------------ evaluate

    def evaluate(self, step: int) -> dict[str, float]:
        import torch
        import torch.nn.functional as F

        acc, task = self.accelerator, self.args.task
        self.model.eval()
        parts: dict[str, list] = {}
        eager = self.compiled and not self.compiled_eval  # strategies.eval_compile_decision
        with torch.no_grad(), _eager(torch) if eager else contextlib.nullcontext():
            for i, batch in enumerate(self.eval_dl):
                if task == "masked-lm":
                    batch = self._mask(batch, seed=(self.args.seed, -1, i, acc.process_index))
                elif task == "causal-lm":
                    batch = {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
                logits = self.model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float()
                labels = batch["labels"]
                values: tuple[Any, ...]
                if task == "classification":
                    loss = F.cross_entropy(logits, labels, reduction="none")
                    values = (loss, logits.argmax(-1), labels)
                else:
                    if task == "causal-lm":
                        logits, labels = logits[:, :-1], labels[:, 1:]
                    tok = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100)
                    values = (tok.sum(1), (labels != -100).sum(1))
                # Drops the samples repeated to even out the last batch across processes.
                for key, v in zip(
                    ("loss", "pred", "label") if task == "classification" else ("sum", "count"),
                    acc.gather_for_metrics(values),
                    strict=True,
                ):
                    parts.setdefault(key, []).append(v.cpu())
        self.model.train()
        cat = {k: torch.cat(v) for k, v in parts.items()}
        if task == "classification":
            metrics = {
                "eval_loss": cat["loss"].double().mean().item(),
                "eval_accuracy": (cat["pred"] == cat["label"]).double().mean().item(),
                "eval_f1_macro": macro_f1(cat["pred"], cat["label"], len(self.data.label_names or ())),
                "eval_samples": float(len(cat["label"])),
            }
        else:
            mean = (cat["sum"].double().sum() / cat["count"].sum().clamp(min=1)).item()
            metrics = {
                "eval_loss": mean,
                "eval_perplexity": math.exp(min(mean, 50.0)),
                "eval_samples": float(len(cat["sum"])),
            }
        self._emit(step, metrics)
        return metrics

    # ------------------------------------------------------------------ save

    def save(self, eval_metrics: dict[str, float]) -> None:
        acc, a = self.accelerator, self.args
        acc.wait_for_everyone()
        if not a.save_model:
            self._print(self._summary(eval_metrics, saved=False))
            acc.end_training()
            return
        unwrapped = acc.unwrap_model(self.model)
        if self.graph_sharded:  # collective: the full weights, in place, for the model, Hub and sample
            from .graph_fsdp import unshard

            unwrapped = acc.unwrap_model(self.model, keep_torch_compile=False)  # names without compile's prefix
            self.optimizer.state.clear()  # training is over: its memory makes room for the weights
            unshard(unwrapped)
            state_dict = unwrapped.state_dict()
        else:
            state_dict = acc.get_state_dict(self.model)  # collective: gathers ZeRO-3 shards
        model_dir = self.contract.model_dir
        if acc.is_main_process:
            from .checkpoint import SaveError, disk_failure, fault_point

            try:
                model_dir.mkdir(parents=True, exist_ok=True)
                fault_point("model")
                unwrapped.save_pretrained(model_dir, state_dict=state_dict, safe_serialization=True)
                self.tokenizer.save_pretrained(model_dir)
                resolved = {
                    **a.to_dict(),
                    "world_size": acc.num_processes,
                    "max_steps_resolved": self.max_steps,
                    "num_parameters": self.num_parameters,
                    "final_metrics": eval_metrics,
                }
                (model_dir / "training_args.json").write_text(json.dumps(resolved, indent=2, default=str))
                (model_dir / "README.md").write_text(
                    model_card(a, eval_metrics, self.num_parameters, acc.num_processes)
                )
            except Exception as e:
                line = disk_failure(e, model_dir, "the model", "the model there is incomplete")
                if line is None:
                    raise
                raise SaveError(line) from e
            self._print(f"model_saved={model_dir}")
        if a.task == "causal-lm" and a.generate_tokens:
            self._sample(unwrapped)
        if a.push_to_hub and acc.is_main_process:
            from .hub import push_to_hub

            url = push_to_hub(model_dir, a.push_to_hub, private=a.hub_private or None, revision=a.hub_revision)
            branch = f" branch={a.hub_revision}" if a.hub_revision else ""
            self._print(f"pushed_to_hub={a.push_to_hub}{branch} commit={url}")
        self._print(self._summary(eval_metrics, saved=True))
        acc.wait_for_everyone()
        acc.end_training()

    def _summary(self, eval_metrics: dict[str, float], *, saved: bool) -> str:
        """The run in one line, for the end of every log: what it did, where it ended, where it is.
        Words, not key=value: metric parsers already have every value from the step lines."""
        losses = []
        if getattr(self, "metrics_file", None) and self.metrics_file.is_file():
            rows = [json.loads(line) for line in self.metrics_file.read_text().splitlines() if line.strip()]
            losses = [r["train_loss"] for r in rows if "train_loss" in r]
        now = time.perf_counter()
        began = getattr(self, "_training_started", now)
        parts = [
            f"done: {self.max_steps} steps in {_hms(now - began)} of training, "
            f"after {_hms(began - self._born)} of setup"
        ]
        if losses:
            parts.append(f"train_loss {losses[0]:.4g} -> {losses[-1]:.4g}")
        shown = {k: v for k, v in eval_metrics.items() if k != "eval_samples"}
        if shown:
            parts.append(", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
        parts.append(f"model in {self.contract.model_dir}" if saved else "no model saved (--no-save-model)")
        return "; ".join(parts)

    def _sample(self, unwrapped) -> None:
        import torch

        acc = self.accelerator
        # Weights sharded across processes: every process runs each forward (its gathers) in step.
        sharded = self.strategy.zero_stage == 3 or self.strategy is Strategy.fsdp
        if not (acc.is_main_process or sharded):
            return
        inputs = self.tokenizer(self.args.generate_prompt, return_tensors="pt").to(acc.device)
        # Eagerly: a few tokens of one sample never repay compiling, and every new length would
        # recompile what is still compiled in place (blocks compiled one by one, the loss).
        with torch.no_grad(), _eager(torch):
            out = unwrapped.generate(
                **inputs,
                max_new_tokens=self.args.generate_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
                synced_gpus=sharded,
            )
        text = self.tokenizer.decode(out[0], skip_special_tokens=True)
        self._print("sample=" + json.dumps(text))
        if acc.is_main_process:  # beside the metrics, for the report
            (self.contract.output_dir / "sample.txt").write_text(text + "\n")  # the prompt and what followed

    # ------------------------------------------------------------------ plumbing

    def _start_tracking(self, state: TrainState) -> None:
        a, acc = self.args, self.accelerator
        if a.report_to != "wandb":
            return
        if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
            # No key: write the run offline (sync it later with `wandb sync`) instead of failing.
            os.environ["WANDB_MODE"] = "offline"
        state.wandb_run_id = choose_wandb_run_id(state.wandb_run_id, os.environ)
        wandb_dir = self.contract.output_dir
        if acc.is_main_process:
            wandb_dir.mkdir(parents=True, exist_ok=True)
        extra = wandb_settings(a, self.contract, os.environ)
        acc.init_trackers(
            a.wandb_project,
            config={**a.to_dict(), **extra.pop("config"), "world_size": acc.num_processes},
            init_kwargs={
                "wandb": {
                    "id": state.wandb_run_id,
                    "resume": "allow",
                    "name": a.run_name,
                    "entity": a.wandb_entity,
                    "dir": str(wandb_dir),
                    **extra,
                }
            },
        )
        run = acc.get_tracker("wandb", unwrap=True) if acc.is_main_process else None
        url = getattr(run, "url", None) if os.environ.get("WANDB_MODE") != "offline" else None
        if url:  # once, where the job's log shows it: the launcher may not know the entity
            self._print(f"wandb_run={url}")

    def _check_stop(self, step: int) -> None:
        acc = self.accelerator
        if acc.num_processes == 1:
            self.stop_requested = self.stopping.received
            return
        # Every process must agree before a collective save; agree at log steps only,
        # so the common case costs no extra synchronisation.
        if step % self.args.log_every == 0:
            import torch

            flag = torch.tensor(float(self.stopping.received), device=acc.device)
            self.stop_requested = acc.reduce(flag, "sum").item() > 0

    def _log_train(self, step: int, window: _Window) -> None:
        import torch

        acc = self.accelerator
        loss = acc.reduce(torch.stack(window.losses).mean(), "mean").item()
        elapsed = max(time.perf_counter() - window.start, 1e-9)
        tokens = acc.reduce(torch.as_tensor(window.tokens, device=acc.device).float(), "sum").item()
        metrics = {
            "train_loss": loss,
            "lr": self.optimizer.param_groups[0]["lr"],
            "tokens_per_sec": tokens / elapsed,
            "step_time": elapsed / len(window.losses),
            "data_wait_pct": 100.0 * window.data_wait / elapsed,
        }
        if window.positions:
            positions = acc.reduce(torch.tensor(float(window.positions), device=acc.device), "sum").item()
            metrics["pad_pct"] = 100.0 * (1.0 - tokens / max(positions, 1.0))
        if acc.device.type == "cuda":  # the most loaded process is the one that runs out
            peak = torch.tensor(torch.cuda.max_memory_allocated(acc.device) / 2**30, device=acc.device)
            metrics["peak_mem_gb"] = acc.gather(peak[None]).max().item()
        self._bar.set_postfix(loss=f"{loss:.4g}", tokens_per_sec=f"{metrics['tokens_per_sec']:.0f}", refresh=False)
        self._emit(step, metrics)

    def _emit(self, step: int, metrics: dict[str, float]) -> None:
        acc = self.accelerator
        acc.log(metrics, step=step)
        if acc.is_main_process:
            # key=value lines: stable for SageMaker metric regexes, the bench and grep (fields are
            # only ever added, at the end). Then, for people reading a log: where the run stands.
            now = time.time()
            extra: dict[str, str] = {}
            started, first = getattr(self, "_clock", (time.perf_counter(), step))
            if "train_loss" in metrics:
                elapsed = time.perf_counter() - started
                left = (self.max_steps - step) * elapsed / max(step - first, 1)
                extra = {"progress": f"{step}/{self.max_steps}", "elapsed": _hms(elapsed), "eta": _hms(left)}
            extra["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
            fields: dict[str, float | str] = {**metrics, **extra}
            self._print(" ".join([f"step={step}"] + [f"{k}={_fmt(v)}" for k, v in fields.items()]))
            with open(self.metrics_file, "a") as f:
                f.write(json.dumps({"step": step, **metrics}) + "\n")

    def _print(self, line: str) -> None:
        if self.accelerator.is_main_process:
            bar = getattr(self, "_bar", None)
            if bar is not None and not bar.disable:
                bar.write(line)  # above the progress bar, which redraws below
            else:
                print(line, flush=True)

    def _progress(self, initial: int):
        from tqdm.auto import tqdm

        return tqdm(
            total=self.max_steps,
            initial=initial,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=not self.accelerator.is_main_process or not sys.stderr.isatty(),
        )


class _Window:
    """What happened since the last log line."""

    def __init__(self):
        self.start = time.perf_counter()
        self.losses: list = []
        self.tokens: Any = 0
        self.positions = 0  # padded batch positions, when batches are padded
        self.data_wait = 0.0

    def add_tokens(self, batch) -> None:
        # Real (non-padding) tokens; summed on the device to avoid a sync per step.
        mask = batch.get("attention_mask")
        if mask is None:
            self.tokens = self.tokens + batch["input_ids"].numel()
        else:
            self.tokens = self.tokens + mask.sum()
            self.positions += mask.numel()


@contextlib.contextmanager
def _slow_phase(what: str, say: Callable[[str], None], after_s: float | None = None) -> Iterator[None]:
    """A line when a setup step has run for SLOW_PHASE_S with nothing to show (a download, an op
    build), and one when it ends: a quiet minute then reads as work, not a hang. Quick ones say
    nothing."""
    started, said = time.perf_counter(), []

    def say_once() -> None:
        said.append(True)
        say(f"setup: {what}...")

    timer = threading.Timer(SLOW_PHASE_S if after_s is None else after_s, say_once)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if said:
            say(f"setup: {what.split(' (')[0]}: done in {_hms(time.perf_counter() - started)}")


@contextlib.contextmanager
def _loading(args: TrainArgs, what: str) -> Iterator[None]:
    """A model or tokenizer that cannot be loaded (not on the Hub, no network, gated, no such
    folder) is a bad --model: one line naming it, not the Hub client's chained tracebacks."""
    try:
        yield
    except ArgumentError:  # a flag already named (--config-overrides)
        raise
    except OSError as e:
        flag, name = next((f, n) for f, n in _model_flags(args, what) if n)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ""
        if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0"):
            hint = " (HF_HUB_OFFLINE is set: only models already in the local cache load)"
        raise ArgumentError(f"{flag} {name}: cannot load {what}: {reason}{hint}") from e
    except ValueError as e:  # a model with no head for this task, or files that do not parse
        flag, name = next((f, n) for f, n in _model_flags(args, what) if n)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Unrecognized configuration class" in reason:
            raise ArgumentError(f"--task {args.task} with {flag} {name}: {reason}") from e
        raise ArgumentError(f"{flag} {name}: cannot load {what}: {reason}") from e


def _model_flags(args: TrainArgs, what: str) -> list[tuple[str, str | None]]:
    tokenizer = [("--tokenizer", args.tokenizer)] if what == "its tokenizer" else []
    return [*tokenizer, ("--model", args.model), ("--model-config", args.model_config), ("--model", "(default)")]


def _allow_tf32(torch: Any) -> None:
    # TF32 for any fp32 matmul left (bf16/fp16 autocast covers the rest).
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def _ddp_kwargs(reduce_dtype: str, bucket_mb: int) -> Any:
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    # Gradients live in DDP's buckets: no copy into them after backward, less memory.
    # A bf16/fp16 hook halves the all-reduce's bytes (opt-in: it averages in that precision).
    hook = {
        "fp32": DDPCommunicationHookType.NO,
        "bf16": DDPCommunicationHookType.BF16,
        "fp16": DDPCommunicationHookType.FP16,
    }[reduce_dtype]
    return DistributedDataParallelKwargs(gradient_as_bucket_view=True, bucket_cap_mb=bucket_mb, comm_hook=hook)


def _select_sdpa_backend(name: str, *, padded: bool) -> None:
    import torch

    if not torch.cuda.is_available():
        return
    if name == "auto":
        if padded:
            # cuDNN's attention builds an execution plan for every new shape, and dynamic
            # padding makes dozens of them: on an H100, variable-length GPT-2 classification
            # ran at 0.74x transformers.Trainer's max_length padding with it and 1.73x without
            # (bench/README.md). PyTorch then takes memory-efficient attention for the mask.
            torch.backends.cuda.enable_cudnn_sdp(False)
        return
    flags = {
        "flash": torch.backends.cuda.enable_flash_sdp,
        "cudnn": torch.backends.cuda.enable_cudnn_sdp,
        "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
        "math": torch.backends.cuda.enable_math_sdp,
    }
    for key, enable in flags.items():
        enable(key == name)


def lr_at(step: int, peak: float, warmup: int, total: int, kind: str) -> float:
    """The learning rate for optimizer step `step` (0-based): linear warmup, then decay.

    A pure function of the step, set on the optimizer each step: it survives resume with no
    scheduler state, and behaves the same under every strategy's optimizer wrapper.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    if kind == "constant":
        return peak
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * (1.0 - progress)


def macro_f1(pred, label, num_classes: int) -> float:
    scores = []
    for c in range(num_classes):
        tp = ((pred == c) & (label == c)).sum().item()
        fp = ((pred == c) & (label != c)).sum().item()
        fn = ((pred != c) & (label == c)).sum().item()
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores) if scores else 0.0


def choose_wandb_run_id(saved: str | None, env: Mapping[str, str]) -> str:
    """The W&B run this job logs to: the one its checkpoint names (a resumed job appends to it),
    else the one the launcher chose (DISTRAIN_WANDB_RUN_ID, so it could print the run's URL at
    submit), else a new one."""
    if saved:
        return saved
    chosen = env.get("DISTRAIN_WANDB_RUN_ID", "").strip()
    if chosen and not any(c in chosen for c in WANDB_RESERVED):
        return chosen
    import secrets

    return secrets.token_hex(4)


def wandb_settings(args: TrainArgs, contract: Contract, env: Mapping[str, str]) -> dict[str, Any]:
    """W&B group, tags and the config beyond the flags: the runs of one lineage (a job and the jobs
    that resumed it) side by side, and where and with what code each ran."""
    # A lineage shares the first job's checkpoint folder: for our contracts, <first job>/checkpoints.
    lineage = env.get("DISTRAIN_LINEAGE") or (
        contract.checkpoint_dir.parent.name if contract.source == "distrain" else None
    )
    instance = env.get("SM_CURRENT_INSTANCE_TYPE") or env.get("DISTRAIN_INSTANCE_TYPE")
    config = {
        "job": args.run_name,
        "lineage": lineage or args.run_name,
        "instance": instance,  # as the backend names it; None where it does not
        "image": env.get("DISTRAIN_IMAGE_URI") or env.get("SAGEMAKER_TRAINING_IMAGE"),
        "backend": contract.source,
        "code_hash": code_hash(),
    }
    tags = [t for t in (args.task, args.strategy, args.precision, contract.source) if t]
    return {"group": lineage or args.run_name, "tags": tags, "config": config}


def code_hash() -> str:
    """The training code that ran, as 12 hex digits of sha256 over this package's .py files."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def model_card(args: TrainArgs, metrics: Mapping[str, float], num_parameters: int, world_size: int) -> str:
    """The model folder's README.md (the Hub shows it): what was trained, on what, how, and how well."""
    base = args.model or args.model_config or "the built-in tiny GPT-2 configuration"
    data = args.dataset or args.train_file or "the job's train channel"
    rows = "".join(f"| {k} | {_fmt(v)} |\n" for k, v in metrics.items())
    settings = {
        "task": args.task,
        "strategy": args.strategy,
        "precision": args.precision,
        "processes": world_size,
        "batch size": args.batch_size,
        "gradient accumulation": args.grad_accum,
        "learning rate": args.lr,
        "max steps": args.max_steps,
        "epochs": args.epochs,
        "seed": args.seed,
    }
    shown = "".join(f"| {k} | {v} |\n" for k, v in settings.items() if v is not None)
    return (
        "---\n"
        f"tags: [distrain-cloud, {args.task}]\n"
        + (f"base_model: {args.model}\n" if args.model else "")
        + "library_name: transformers\n---\n\n"
        f"# {args.run_name or 'distrain-cloud model'}\n\n"
        f"A {args.task} model ({num_parameters:,} parameters) trained from {base} on {data} with distrain-cloud.\n\n"
        f"## Final evaluation\n\n| metric | value |\n| --- | --- |\n{rows}\n"
        f"## Training settings\n\n| setting | value |\n| --- | --- |\n{shown}"
    )


def _hms(seconds: float) -> str:
    """7.2 -> '7s', 62 -> '1m02s', 3725 -> '1h02m05s': readable in a log line, one token for key=value
    parsers."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    h, m = divmod(s // 60, 60)
    return f"{h}h{m:02d}m{s % 60:02d}s" if h else f"{m}m{s % 60:02d}s"


def _fmt(v: float | str) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _maybe_die_for_test(step: int) -> None:
    # Test hook: a `kill -9` right after this optimizer step, to prove exact resume.
    if os.environ.get("DISTRAIN_TEST_KILL_AT_STEP") == str(step):
        os.kill(os.getpid(), 9)
    # And a failure no check foresaw (a library's error, a bug), to prove it is still one line.
    if os.environ.get("DISTRAIN_TEST_RAISE_AT_STEP") == str(step):
        raise RuntimeError(f"injected failure at step {step}")
    # And a process whose next step never ends (a peer gone silent, a stuck collective): the others
    # wait for it inside their next collective.
    hang = os.environ.get("DISTRAIN_TEST_HANG_AT_STEP", "").split(":")  # STEP[:RANK]
    if hang[0] == str(step) and os.environ.get("RANK", "0") == (hang[1:] or ["0"])[0]:
        while True:
            time.sleep(3600)


def _inductor_or_eager(mode: str, say):
    """Inductor's torch.compile backend for `mode`; a graph it fails to compile runs eagerly, once
    said, so a compiler bug costs speed, not the job. (A backward graph is compiled at its first
    backward, outside this guard: Trainer._backward catches a failure there.)"""
    import os

    import torch

    inductor = torch._TorchCompileInductorWrapper(mode, None, False)
    warned: list[bool] = []

    def backend(graph, example_inputs):
        try:
            if os.environ.get("DISTRAIN_TEST_COMPILE_FAIL"):  # test hook: an Inductor failure
                raise RuntimeError("injected compile failure")
            return inductor(graph, example_inputs)
        except Exception as e:
            if not warned:
                reason = " ".join(str(e).split())[:200] or type(e).__name__
                say(f"warning: torch.compile failed ({reason}); running that part eagerly (--no-compile avoids it)")
                warned.append(True)
            return graph.forward

    return backend


def _compile_times(top: int = 8) -> str:
    """Where the first step's compile went, by the compiler's own timers
    (torch._dynamo.utils.compile_times), the longest first. Times are inclusive (a phase holds
    the phases it calls) and summed over calls. The longest first compile (fsdp sharded in the
    graph: about 80 s against DDP's 25-30 s at GPT-2 small) is what these name the parts of."""
    try:
        from torch._dynamo.utils import compile_times

        names, values = compile_times(repr="csv", aggregate=True)
        timed = sorted(((str(n), float(str(v))) for n, v in zip(names, values, strict=True)), key=lambda nt: -nt[1])
    except Exception:  # a private helper: its form may change with torch, and this is only a log line
        return ""
    return " ".join(f"{name}:{seconds:.1f}s" for name, seconds in timed[:top])


def _local_gpu(cuda: bool) -> tuple[str | None, bool | None]:
    """This process's card (LOCAL_RANK's, not the current device, whose context every process would
    share) and whether it reaches another of the node's cards peer to peer; (None, None) on CPU."""
    if not cuda:
        return None, None
    import torch

    index, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    peer = torch.cuda.can_device_access_peer(index, (index + 1) % count) if count > 1 else None
    return torch.cuda.get_device_name(index), peer


def _fail_partway(model) -> None:
    """Test hook: the next backward raises partway, after some gradients have reached their hooks
    (DDP's reducer's among them), as a kernel failing inside a compiled backward leaves it."""
    params = [p for p in model.parameters() if p.requires_grad]
    handles: list[Any] = []

    def fail(grad):
        handles.pop().remove()
        raise RuntimeError("injected failure in the compiled backward")

    handles.append(params[len(params) // 2].register_hook(fail))


def _seeded_backward(accelerator: Any, loss: Any) -> None:
    """accelerator.backward(loss) for compiled autograd (ddp or one process, no DeepSpeed): the
    accumulation's 1/k seeds the backward instead of dividing the loss. Accelerate's `loss / k`
    saves k, a Scalar, on the division's backward node; compiled autograd lifts it into its graph
    as an input, and under torch 2.11 with CUDA it then passed the Python int where Inductor's
    first kernel read a 0-d tensor (bench/README.md, session 11). Seeded, the graph has no Scalar
    input, and every gradient is the same."""
    import torch

    scaler = accelerator.scaler  # fp16's loss scale: a tensor product, no Scalar either
    scaled = scaler.scale(loss) if scaler is not None else loss
    scaled.backward(torch.full_like(scaled, 1.0 / accelerator.gradient_accumulation_steps))


def _compiled_autograd(compiler: Any) -> Any:
    """A context in which backward runs through torch's compiled autograd with `compiler`; none if None."""
    if compiler is None:
        return contextlib.nullcontext()
    from torch._dynamo import compiled_autograd

    return compiled_autograd._enable(compiler)


def _eager(torch) -> Any:
    """A context in which what was compiled (the model, or the blocks in place and the loss) runs
    eagerly, compiling nothing new. set_stance is torch >= 2.6; the [train] extra allows 2.4,
    where this does nothing (and Accelerate refuses FSDP2, so fsdp, anyway)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance else contextlib.nullcontext()


def _drop_tied_copies(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
    """Accelerate's save_state hook: each model's state dict without the second name of a tied
    weight (GPT-2's lm_head.weight is wte.weight), as transformers saves tied weights and
    safetensors needs them. Accelerate would drop the same names itself, with a warning at
    every checkpoint ("Removed shared tensor"); loading ties them again. The first name of each
    storage is kept, as Accelerate keeps it, so the files are the same."""
    import torch
    from accelerate.utils import id_tensor_storage  # Accelerate's own test of a shared storage

    for state in weights:
        seen: set[Any] = set()
        for name in list(state):
            if isinstance(state[name], torch.Tensor):
                storage = id_tensor_storage(state[name])
                if storage in seen:
                    del state[name]
                seen.add(storage)


def _transformer_blocks(model) -> list[Any]:
    """The model's transformer blocks: modules of the classes it names in _no_split_modules (GPT2Block,
    BertLayer), the unit FSDP shards and ZeRO-3 fetches whole. FSDP2 renames a sharded block's class
    (FSDPGPT2Block, a subclass), so base classes count too."""
    model = getattr(model, "_orig_mod", model)
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]


def _select_fsdp(accelerator, plugin) -> None:
    """Make sure accelerate runs `fsdp` as FSDP. Accelerate 1.x turns its plugin on only for GPU-like
    devices (its state lists MULTI_GPU, MULTI_XPU, ... but not MULTI_CPU) and otherwise quietly
    runs plain DDP, while FSDP2 itself shards over gloo on CPU: on CPU the state is set to FSDP
    here, in both of accelerate's shared states (AcceleratorState copies PartialState's on every
    construction), so CPU jobs and tests run the sharding, checkpoints and saves of GPU jobs."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = accelerator.state
    if state.distributed_type == DistributedType.FSDP:
        return
    if state.distributed_type != DistributedType.MULTI_CPU:
        raise ArgumentError(
            f"--strategy fsdp needs a process group, but accelerate runs {state.distributed_type.value}: "
            "start it with distrain-cloud submit or node_launch"
        )
    state.fsdp_plugin = plugin
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
