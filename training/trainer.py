"""The training recipe: setup, train, evaluate, save. Reads top to bottom.

Every side effect that must happen once (printing, files, W&B, the Hub) sits behind
`accelerator.is_main_process`; everything collective (evaluation, checkpoints, the final
gather of ZeRO-3 weights) runs on all processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    broadcast_object_list,
    id_tensor_storage,
    set_seed,
)
from torch._dynamo.utils import counters
from tqdm.auto import tqdm

from . import checkpoint, compiling, data, engines, faults, modeling, tasks
from .args import (
    ArgumentError,
    TrainArgs,
    default_lr,
    fp8_bf16_layer_names,
    fp8_linear_of,
    residual_stream_bf16,
    rope_tables_wanted,
)
from .contract import INTERRUPT_EXIT_CODE, STOP_EXIT_CODE, Contract, free_port
from .decisions import Decisions, decide
from .engines.base import residual_in_bf16, transformer_blocks
from .fp8 import linear_layer_names, use_fp8
from .fusion import fuse_projections
from .hub import HubPushError, kept_model_line, push_to_hub
from .optim import ClippedAdamW
from .phases import hms as _hms
from .phases import slow_phase as _slow_phase
from .profiling import Profiler
from .rope import use_rope_tables
from .stopping import StopRequest, collective_timeout_handler
from .strategies import AUTO, eval_compile_decision, provisional_strategy, slow_gpu_link
from .tracking import GuardedTracking, fmt, model_card, start_wandb


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
    def __init__(
        self,
        args: TrainArgs,
        contract: Contract,
        *,
        precision_note: str = "",
        raw_data: tuple[Any, list[str]] | None = None,
    ):
        self.args, self.contract = args, contract
        # data.load_checked's, where the entry point checked the data before it imported torch.
        self.raw_data = raw_data
        self.precision_note = precision_note  # __main__'s precision choice, said once the input loaded
        self.given_args = args  # as given: --strategy auto still auto (decisions.decide resolves it)
        self.lr = args.lr if args.lr is not None else default_lr(args)  # parse_args has filled it in
        # --strategy auto becomes ddp or fsdp in setup, where the processes and the checkpoint are known.
        self.strategy = provisional_strategy(args.strategy)
        self.decisions: Decisions  # setup's (decisions.py): the run's every choice and why
        self.stopping = StopRequest(args.stop_grace)  # SIGTERM/SIGINT, at any moment, bounded (stopping.py)
        self.stop_requested = False  # acted on at step boundaries, by every process at once
        self._born = time.perf_counter()

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Check and prepare this process's environment, then build the Accelerator, the data, the
        model and its optimizer, and compile where it pays: one named step each, in this order."""
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
        _say_op_builds(self.engine.ops_to_build())  # DeepSpeed may build one now, or at prepare
        self.accelerator = self._make_accelerator(world, cuda=torch.cuda.is_available())
        acc = self.accelerator
        if self.decisions.decided:  # else still undecided: said once the model is loaded
            self._print_strategy()
        set_seed(a.seed)
        with _slow_phase("loading the tokenizer and tokenizing the data (once, then cached)", self._print):
            self._load_data()
        with _slow_phase(f"loading the model {a.model or a.model_config or ''} (downloaded on first use)", self._print):
            model = self._load_model()
        if self.precision_note:  # after the data and model: bad input is one line on stderr, nothing else
            self._print(self.precision_note)
        train_dl, eval_dl, self.train_sampler = data.make_loaders(
            a, self.data, self.tokenizer, acc.num_processes, acc.device.type == "cuda"
        )
        self.steps_per_epoch = max(1, len(self.train_sampler) // a.grad_accum)
        self.max_steps = a.max_steps if a.max_steps is not None else math.ceil(a.epochs * self.steps_per_epoch)
        # Now with the model's size and the run's length: auto's pick, if it waited, and the compile.
        undecided = not self.decisions.decided
        params = sum(p.numel() for p in model.parameters())
        blocks = bool(transformer_blocks(model))
        # fp8's auto recipe multiplies the LM head in float8 where this model's head can
        head_why_not = modeling.fp8_head_model_why_not(model) if a.precision == "fp8" else None
        self._decide(
            world,
            cuda=torch.cuda.is_available(),
            params=params,
            steps=self.max_steps,
            has_blocks=blocks,
            fp8_head_why_not=head_why_not,
        )
        a = self.args
        if a.precision == "fp8":  # before prepare and compile: the linear layers multiply in float8
            fp8_line = use_fp8(
                model,
                a.fp8_recipe,
                a.fp8_bf16_edge_blocks,
                a.fp8_fast_accum,
                bool(a.fp8_head),
                fp8_linear_of(a),
                a.fp8_scaling,
                head_grad_input=a.fp8_head_grad_input,
                head_forward=a.fp8_head_forward,
                head_backward=a.fp8_head_backward,
                head_why=self.decisions.fp8_head_why,
                grad_dtype=a.fp8_grad_dtype,
                bf16_layers=fp8_bf16_layer_names(a, linear_layer_names(model)),
            )
            self._print(fp8_line)
        if undecided:  # in-graph fsdp or ddp, both of which take the Accelerator built above
            self._print_strategy()
        # --fp8-head: the head's backward accumulates fast only where every backward matmul does
        head_fp8 = ("fast" if a.fp8_fast_accum == "all" else "exact") if a.fp8_head else None
        if head_fp8 and a.fp8_head_grad_input == "bf16":
            head_fp8 += "+bf16-grad-input"
        if head_fp8 and a.fp8_head_forward == "bf16":
            head_fp8 += "+bf16-forward"
        if head_fp8 and a.fp8_head_backward == "bf16":
            head_fp8 += "+bf16-backward"
        self.lm_loss_why_not = modeling.use_head_loss(model, self.decisions.head_loss_why_not, head_fp8)
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if residual_stream_bf16(a, self.strategy.value, model_type) and (a.residual_dtype == "bf16" or blocks):
            self._print(residual_in_bf16(model, auto=a.residual_dtype == AUTO))
        elif a.residual_dtype == "bf16":  # auto's sharded pick: its 16-bit weights make the stream bf16 already
            self._print(f"residual_dtype=bf16 (already: {self.strategy.value}'s weights are 16-bit)")
        if a.fuse_projections:  # after fp8's layers are in: a float8 group is fused in float8
            if self.strategy.value in ("ddp", "single"):
                self._print(fuse_projections(model))
            else:  # auto's sharded pick gathers each layer's weights for that layer's own call
                self._print(f"fuse_projections=off (--fuse-projections: not under {self.strategy.value})")
        # Any engine: only the rotary module's forward changes, on this process's model. Eager, the
        # module already computes the tables once a forward: auto leaves it alone there.
        if rope_tables_wanted(a, self.decisions.compiled):
            self._print(use_rope_tables(model, auto=a.rope_tables is None))
        self.compiled, self.compile_why = self.decisions.compiled, self.decisions.compile_why
        engine = self.engine
        with _slow_phase(
            f"preparing the model and optimizer for {self.strategy.value}{engine.setup_words}", self._print
        ):
            engine.shard(model, acc)
            optimizer = engine.optimizer(self._param_groups(model), self.lr, acc)
            self.model, self.optimizer, self.train_dl, self.eval_dl = engine.prepare(
                acc, model, optimizer, train_dl, eval_dl
            )
        self._compile()

    def _decide(self, world: int, *, cuda: bool, **known: Any) -> None:
        """The run's decisions (decisions.decide) for this launch: its processes, its GPUs' link,
        the checkpoint auto resumes, if any, and what is `known` of the model and the run."""
        # From the arguments as given, each time: the reasons stay those of the first decision.
        d = self.decisions = decide(
            self.given_args, world=world, cuda=cuda, slow_link=self.slow_link, saved=self.resumes, **known
        )
        self.args, self.strategy = d.args, d.strategy
        self.engine = engines.engine_for(d, self._print)

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
        self.contract.use_compile_cache()  # a no-op after the entry point, which did it before the imports
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
            os.environ.update(self.engine.environment(cuda=cuda))

    def _make_accelerator(self, world: int, *, cuda: bool) -> Any:
        """The Accelerator, with our DDP settings and the engine's plugin (DeepSpeed's, FSDP2's)."""
        a, d = self.args, self.decisions
        plugins, backend = self.engine.accelerator_settings(world, cuda=cuda)
        # A collective whose peer never comes fails after --collective-timeout instead of hanging.
        handlers: list[Any] = [_ddp_kwargs(a.ddp_reduce_dtype, d.ddp_bucket_mb)]
        handlers.append(collective_timeout_handler(a.collective_timeout, backend))
        accelerator = Accelerator(
            mixed_precision="bf16" if a.precision == "fp8" else a.precision,  # fp8: bf16 autocast, see fp8.py
            gradient_accumulation_steps=a.grad_accum,
            **plugins,
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
        self.engine.accelerator_built(accelerator)
        accelerator.register_save_state_pre_hook(_drop_tied_copies)
        return accelerator

    def _print_strategy(self) -> None:
        """What auto picked and why, and DDP's buckets (Decisions.strategy_lines)."""
        for line in self.decisions.strategy_lines(self.accelerator.num_processes):
            self._print(line)

    def _load_data(self) -> None:
        """The tokenizer and the tokenized splits (the main process first: it fills the caches)."""
        with _loading(self.args, "its tokenizer"):
            self.tokenizer = modeling.load_tokenizer(self.args)
        loaded = self.raw_data or data.load_checked(self.args, self.contract)
        self.raw_data = None  # tokenized below; the raw splits are not needed again
        self.data = data.prepare(self.args, loaded, self.tokenizer, self.accelerator.main_process_first)

    def _load_model(self) -> Any:
        """The model as it trains: loss-only training forwards, the attention kernel for this data,
        and for ZeRO-3 whole transformer blocks gathered at once."""
        a = self.args
        _select_sdpa_backend(a.sdpa_backend, padded=self.data.padded)
        names = self.data.label_names
        with _loading(a, "it"):
            model = modeling.load_model(
                a, self.tokenizer, len(names) if names else None, dict(enumerate(names)) if names else None
            )
        self.num_parameters = modeling.count_parameters(model)
        modeling.training_forward(model)
        self.engine.loaded(model)
        return model

    def _compile(self) -> None:
        """torch.compile the prepared model where it pays (the decisions' compiled), as accelerate's
        dynamo plugin would, but with a backend that runs a graph Inductor fails on eagerly, with a
        warning, instead of ending the job."""
        a = self.args
        self._print(f"compile={'on' if self.compiled else 'off'} ({self.compile_why})")
        self.compiled_eval = False
        self.backward_compiler: Any = None
        self.eager_now = False  # compiled regions forced eager after a failed compiled backward (_backward)
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # under Accelerate's wrapper
        clipped = isinstance(optimizer, ClippedAdamW)
        if a.compile_optimizer and not clipped:  # auto's pick was a sharded engine, which clips its shards
            self._print(f"compile_optimizer=off (--compile-optimizer: not under {self.strategy.value})")
        elif clipped and not self.compiled:
            self._print("compile_optimizer=off (the model is not compiled: the clip and AdamW's update run eagerly)")
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
            backend = compiling.inductor_or_eager(a.compile_mode, self._print)
        if a.compile_tuning:
            compiling.tune_kernels()
        if clipped:
            optimizer.compile(backend)
            self._print("compile_optimizer=on (the gradient clip and AdamW's update as one compiled step)")
        if self.decisions.compile_unit == "block":
            unwrapped = self.accelerator.unwrap_model(self.model)
            if compiling.compile_blocks(unwrapped, self.engine, backend, a.compile_unit, self._print):
                return
        self.model, self.backward_compiler = self.engine.compile(self.accelerator, self.model, backend)

    def _backward(self, loss: Any, again: Callable[[], Any], micro: int) -> Any:
        """acc.backward(loss); with --compiled-autograd, traced and compiled as one graph (torch's
        compiled autograd, a private API in torch 2.11). Returns the loss backward'd: `again()`'s
        where a compiled job's backward failed.

        A compiled model's backward graph is compiled at its first backward, out of reach of the
        backend's guard (compiling.inductor_or_eager), and compiled autograd's first run raised inside an
        Inductor kernel on 4 H200s under torch 2.11 (bench/README.md, session 11; compiling.seeded_backward
        avoids that one). Either way the compiler costs speed, not the job: said once, the
        micro-batch's forward runs again and its backward eagerly (compiled autograd off, or under
        ddp and one process the whole job eager from here, DDP's reducer reset for the forward it
        did not finish). Only on a micro-batch that starts an optimizer step, since later ones add
        to gradients a half-run backward may have touched, and never for running out of memory,
        which eager would do sooner."""
        ca = self.backward_compiler
        try:
            with compiling.compiled_autograd(ca):
                if self.compiled and faults.compiled_backward_fails_once():  # a test's (training/faults.py)
                    compiling.fail_partway(self.model)
                if ca is None:
                    self.accelerator.backward(loss)
                else:
                    compiling.seeded_backward(self.accelerator, loss)
            return loss
        except Exception as e:
            stance = hasattr(torch.compiler, "set_stance")  # torch >= 2.6
            whole_job = self.compiled and not self.eager_now and stance and self.engine.eager_fallback
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

    def _print_first_step(self, seconds: float) -> None:
        line = f"first_step_s={seconds:.1f}"
        if self.compiled:
            line += f" compile_cache_hits={counters['inductor']['fxgraph_cache_hit']}"
        self._print(line)
        if self.compiled:
            # Distinct graphs Dynamo captured: blocks compiled one by one share one (_compile_blocks).
            self._print(f"compiled_graphs={counters['stats']['unique_graphs']}")
            times = compiling.compile_times_line()
            if times:
                self._print(f"compile_times={times}")

    def _param_groups(self, model) -> list[dict[str, Any]]:
        """AdamW's parameter groups, weight decay on the matrices only; the engine builds the optimizer."""
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
        return groups

    # ------------------------------------------------------------------ train

    def train(self) -> dict[str, Any]:
        a, acc = self.args, self.accelerator
        state = TrainState()
        resumed = self._resume_point()
        if resumed:
            path, saved = resumed
            # Before Accelerate reads it: a ZeRO checkpoint of another world size or strategy
            # would end in a DeepSpeed traceback there.
            checkpoint.check_resumable(path, saved, acc.num_processes, self.strategy.value, self.decisions.sharding)
            batches = checkpoint.resume_batches(path, saved, acc.num_processes, a.batch_size, a.grad_accum)
            acc.load_state(str(path))
            self.engine.load_extras(path, acc, self.model, self.optimizer, saved)
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
        elif note := _nothing_resumed(os.environ, self.contract.checkpoint_dir):
            self._print(note)
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
                    if acc.sync_gradients and a.max_grad_norm and self.engine.clips_gradients:
                        with profiler.phase("clip"):
                            self.engine.clip(acc, self.model, a.max_grad_norm)
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
                        sharding=self.decisions.sharding,
                        batch_size=a.batch_size,  # with the world size, the global batch a resume keeps
                        grad_accum=a.grad_accum,
                    )
                    shards = functools.partial(
                        self.engine.save_extras, accelerator=acc, model=self.model, optimizer=self.optimizer
                    )
                    checkpoint.save(acc, self.contract.checkpoint_dir, step, saved, a.keep_checkpoints, shards)
                faults.after_step(step)  # a test's kill, failure, hang or slow step (training/faults.py)
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
            self._end_training()
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

    def _resume_point(self):
        """The newest complete checkpoint that verifies, chosen by the main process (which
        reads it once and says once which ones it skipped) and handed to the others, so that
        every process loads the same one."""
        acc = self.accelerator
        found = checkpoint.latest(self.contract.checkpoint_dir) if acc.is_main_process else None
        if acc.num_processes > 1:
            found = broadcast_object_list([found])[0]
        return found

    def _loss(self, batch, step: int, micro: int):
        acc = self.accelerator
        seed = (self.args.seed, step, micro, acc.process_index)
        unwrapped = acc.unwrap_model(self.model) if self.args.fused_ce else None
        return tasks.training_loss(self.model, unwrapped, batch, self.args, self.tokenizer, seed, self.compiled)

    # ------------------------------------------------------------------ evaluate

    def evaluate(self, step: int) -> dict[str, float]:
        acc, task = self.accelerator, self.args.task
        self.model.eval()
        parts: dict[str, list] = {}
        eager = self.compiled and not self.compiled_eval  # strategies.eval_compile_decision
        with torch.no_grad(), compiling.eager() if eager else contextlib.nullcontext():
            for i, batch in enumerate(self.eval_dl):
                batch = tasks.eval_batch(
                    batch, self.args, self.tokenizer, seed=(self.args.seed, -1, i, acc.process_index)
                )
                logits = self.model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float()
                values = tasks.eval_values(task, logits, batch["labels"])
                # Drops the samples repeated to even out the last batch across processes.
                gathered = acc.gather_for_metrics(tuple(values.values()))
                for key, v in zip(values, gathered, strict=True):
                    parts.setdefault(key, []).append(v.cpu())
        self.model.train()
        cat = {k: torch.cat(v) for k, v in parts.items()}
        metrics = tasks.eval_metrics(task, cat, len(self.data.label_names or ()))
        self._emit(step, metrics)
        return metrics

    # ------------------------------------------------------------------ save

    def save(self, eval_metrics: dict[str, float]) -> None:
        acc, a = self.accelerator, self.args
        acc.wait_for_everyone()
        if not a.save_model:
            self._print(self._summary(eval_metrics, saved=False))
            self._end_training()
            return
        # Collective: gathers ZeRO-3's and fsdp's shards.
        unwrapped, state_dict = self.engine.full_state_dict(acc, self.model, self.optimizer)
        model_dir = self.contract.model_dir
        if acc.is_main_process:
            try:
                model_dir.mkdir(parents=True, exist_ok=True)
                faults.in_save("model")
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
                line = checkpoint.disk_failure(e, model_dir, "the model", "the model there is incomplete")
                if line is None:
                    raise
                raise checkpoint.SaveError(line) from e
            self._print(f"model_saved={model_dir}")
        if a.task == "causal-lm" and a.generate_tokens:
            self._sample(unwrapped)
        if a.push_to_hub and acc.is_main_process:
            try:
                url = push_to_hub(model_dir, a.push_to_hub, private=a.hub_private or None, revision=a.hub_revision)
            except HubPushError as e:  # the model is saved: say how to retry the push alone
                raise HubPushError(f"{e}; {kept_model_line(a.push_to_hub, model_dir)}") from None
            branch = f" branch={a.hub_revision}" if a.hub_revision else ""
            self._print(f"pushed_to_hub={a.push_to_hub}{branch} commit={url}")
        self._print(self._summary(eval_metrics, saved=True))
        acc.wait_for_everyone()
        self._end_training()

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
        acc = self.accelerator
        # Weights sharded across processes: every process runs each forward (its gathers) in step.
        sharded = self.engine.weights_sharded
        if not (acc.is_main_process or sharded):
            return
        inputs = self.tokenizer(self.args.generate_prompt, return_tensors="pt").to(acc.device)
        # Eagerly: a few tokens of one sample never repay compiling, and every new length would
        # recompile what is still compiled in place (blocks compiled one by one, the loss).
        with torch.no_grad(), compiling.eager():
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
        self.tracking = GuardedTracking(self.accelerator, self._print)  # W&B failing never ends the run
        if self.args.report_to == "wandb":
            state.wandb_run_id = start_wandb(
                self.accelerator, self.args, self.contract, state.wandb_run_id, self._print
            )

    def _end_training(self) -> None:
        """The trackers finished (a failure said, not raised), then Accelerate's own end."""
        tracking = getattr(self, "tracking", None)
        if tracking is not None:
            tracking.finish()
        self.accelerator.end_training()

    def _check_stop(self, step: int) -> None:
        acc = self.accelerator
        if acc.num_processes == 1:
            self.stop_requested = self.stopping.received
            return
        # Every process must agree before a collective save; agree at log steps only,
        # so the common case costs no extra synchronisation.
        if step % self.args.log_every == 0:
            flag = torch.tensor(float(self.stopping.received), device=acc.device)
            self.stop_requested = acc.reduce(flag, "sum").item() > 0

    def _log_train(self, step: int, window: _Window) -> None:
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
        self.tracking.log(metrics, step)
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
            self._print(" ".join([f"step={step}"] + [f"{k}={fmt(v)}" for k, v in fields.items()]))
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
        return tqdm(
            total=self.max_steps,
            initial=initial,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=not self.accelerator.is_main_process or not sys.stderr.isatty(),
        )


def _say_op_builds(ops: list[str]) -> None:
    """Before a minute of silence on a fresh machine: which ops are built, and that it is once.
    The first process alone (the others build nothing: they wait on torch's build lock)."""
    if ops and int(os.environ.get("RANK", "0")) == 0:
        names = ", ".join(ops)
        print(
            f"setup: DeepSpeed compiles its {names} op{'s' if len(ops) > 1 else ''} for this machine first "
            "(a minute or more each, once: later runs load them)",
            flush=True,
        )


def _nothing_resumed(env: Mapping[str, str], checkpoints: Path) -> str | None:
    """The line for a job that resumes another (its lineage is an earlier job's) but finds no
    checkpoint: it trains from step 1, and says so rather than silently."""
    lineage = env.get("DISTRAIN_LINEAGE")
    job = env.get("DISTRAIN_JOB_NAME") or env.get("TRAINING_JOB_NAME")
    if not lineage or not job or lineage == job:
        return None
    return (
        f"note: this job resumes lineage {lineage}, but its checkpoints ({checkpoints}) hold none: "
        "training starts again from step 1"
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
    # Gradients live in DDP's buckets: no copy into them after backward, less memory.
    # A bf16/fp16 hook halves the all-reduce's bytes (opt-in: it averages in that precision).
    hook = {
        "fp32": DDPCommunicationHookType.NO,
        "bf16": DDPCommunicationHookType.BF16,
        "fp16": DDPCommunicationHookType.FP16,
    }[reduce_dtype]
    return DistributedDataParallelKwargs(gradient_as_bucket_view=True, bucket_cap_mb=bucket_mb, comm_hook=hook)


def _select_sdpa_backend(name: str, *, padded: bool) -> None:
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


def _local_gpu(cuda: bool) -> tuple[str | None, bool | None]:
    """This process's card (LOCAL_RANK's, not the current device, whose context every process would
    share) and whether it reaches another of the node's cards peer to peer; (None, None) on CPU."""
    if not cuda:
        return None, None
    index, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    peer = torch.cuda.can_device_access_peer(index, (index + 1) % count) if count > 1 else None
    return torch.cuda.get_device_name(index), peer


def _drop_tied_copies(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
    """Accelerate's save_state hook: each model's state dict without the second name of a tied
    weight (GPT-2's lm_head.weight is wte.weight), as transformers saves tied weights and
    safetensors needs them. Accelerate would drop the same names itself, with a warning at
    every checkpoint ("Removed shared tensor"); loading ties them again. The first name of each
    storage is kept, as Accelerate keeps it, so the files are the same."""
    for state in weights:
        seen: set[Any] = set()
        for name in list(state):
            if isinstance(state[name], torch.Tensor):
                storage = id_tensor_storage(state[name])
                if storage in seen:
                    del state[name]
                seen.add(storage)
