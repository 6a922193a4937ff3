"""Run the training entry point exactly as a backend does: a subprocess with a fresh contract.

`train(*flags)` runs `python -m distrain_cloud.training FLAGS` (or, with `processes=N`,
`python -m distrain_cloud.training.node_launch --processes N -- FLAGS`) with the
DISTRAIN_* contract pointing under tmp_path, and returns a `TrainRun`: its returncode, stdout,
stderr, and `metrics`, the JSON lines of metrics.jsonl.
Runs that share a `name` share a contract (that is how a rerun resumes).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from distrain_cloud.training.contract import free_port

# Per-run wall-clock cap: the slowest run here takes well under a minute on 2 cores.
RUN_TIMEOUT_S = 240

# Variables of the calling environment that would change what a run does.
_STRIPPED_PREFIXES = ("DISTRAIN_", "SM_", "WANDB_", "ACCELERATE_", "DS_", "TORCHELASTIC_")
_STRIPPED = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "ROLE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "HF_TOKEN",
    "OMP_NUM_THREADS",
    # Inductor sets it in any process that compiled something (this worker, after an in-process
    # compile test); the runs get the session's cache from shared_env, or the trainer's default.
    "TORCHINDUCTOR_CACHE_DIR",
}


@dataclass
class Contract:
    """The contract folders of one named run, under tmp_path/<name>/."""

    root: Path

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def workdir(self) -> Path:
        """The run's current directory: nothing should be written here."""
        return self.root / "cwd"

    def env(self) -> dict[str, str]:
        return {
            "DISTRAIN_MODEL_DIR": str(self.model_dir),
            "DISTRAIN_OUTPUT_DIR": str(self.output_dir),
            "DISTRAIN_CHECKPOINT_DIR": str(self.checkpoint_dir),
        }

    def checkpoints(self) -> list[Path]:
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(p for p in self.checkpoint_dir.iterdir() if p.name.startswith("checkpoint-"))

    def complete_checkpoints(self) -> list[Path]:
        return [p for p in self.checkpoints() if (p / "COMPLETE").is_file()]


@dataclass
class TrainRun:
    returncode: int
    stdout: str
    stderr: str
    metrics: list[dict]
    contract: Contract
    argv: list[str]

    def describe(self) -> str:
        """For assertion messages: the command and the end of its output."""
        return (
            f"command: {' '.join(self.argv)}\nreturncode: {self.returncode}\n"
            f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}"
        )

    def lines(self, prefix: str) -> list[str]:
        """stdout lines that start with `prefix`."""
        return [line for line in self.stdout.splitlines() if line.startswith(prefix)]

    @property
    def train_losses(self) -> dict[int, float]:
        return train_losses(self.metrics)

    @property
    def evals(self) -> list[dict]:
        return [m for m in self.metrics if "eval_loss" in m]

    @property
    def final_eval(self) -> dict:
        assert self.evals, "no eval record in metrics.jsonl\n" + self.describe()
        return self.evals[-1]


def train_losses(metrics: Sequence[dict]) -> dict[int, float]:
    """step -> train_loss, the last value recorded for each step (a resumed run repeats steps)."""
    out: dict[int, float] = {}
    for m in metrics:
        if "train_loss" in m:
            out[m["step"]] = m["train_loss"]
    return dict(sorted(out.items()))


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIPPED_PREFIXES) and k not in _STRIPPED}
    env.update(
        {
            "OMP_NUM_THREADS": "1",  # 2 processes on 2 cores: no oversubscription
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


def uses_deepspeed(flags: Sequence[str]) -> bool:
    return any(flag == "--strategy" and value.startswith("zero") for flag, value in itertools.pairwise(flags))


_DEEPSPEED_BUILD: list[subprocess.Popen[str]] = []  # the session's build, once started


def start_deepspeed_cpu_op_build() -> None:
    """DeepSpeed on CPU compiles a shared-memory op with gcc the first time a process starts its
    communication (over a minute on 2 cores), then loads it from torch's extension cache. The
    session builds it in the background from the start, while the tests that need no DeepSpeed
    run; under two xdist workers one builds and the other waits on torch's build lock."""
    if not _DEEPSPEED_BUILD:
        code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
        env = base_env({"DS_ACCELERATOR": "cpu"})
        argv = [sys.executable, "-c", code]
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        _DEEPSPEED_BUILD.append(subprocess.Popen(argv, env=env, text=True, **pipes))


@functools.cache
def build_deepspeed_cpu_op() -> float:
    """Wait for the build (started now if it was not), before a DeepSpeed run starts its clock:
    outside every run's time limit. Returns the seconds waited."""
    start = time.monotonic()
    start_deepspeed_cpu_op_build()
    build = _DEEPSPEED_BUILD[0]
    _, err = build.communicate(timeout=900)
    if build.returncode != 0:  # the runs will then fail with DeepSpeed's own message
        warnings.warn(f"building DeepSpeed's CPU op failed:\n{err[-2000:]}", stacklevel=1)
    return time.monotonic() - start


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the build when a test that trains with DeepSpeed (marked `deepspeed`) is collected."""
    if session.config.option.collectonly:
        return
    if any(item.get_closest_marker("deepspeed") for item in session.items):
        start_deepspeed_cpu_op_build()


def command(flags: Sequence[str], processes: int | None) -> list[str]:
    if processes is None:
        return [sys.executable, "-m", "distrain_cloud.training", *flags]
    return [sys.executable, "-m", "distrain_cloud.training.node_launch", "--processes", str(processes), "--", *flags]


class Runner:
    """Starts entry-point runs whose contracts live under `root`."""

    def __init__(self, root: Path, shared_env: dict[str, str]):
        self.root, self.shared_env = root, shared_env

    def contract(self, name: str) -> Contract:
        c = Contract(self.root / name)
        c.workdir.mkdir(parents=True, exist_ok=True)
        return c

    def with_checkpoint(self, name: str, run: TrainRun, step: int) -> Contract:
        """A new run folder whose checkpoints are `run`'s of `step` alone: that job come back
        elsewhere (another number of processes, another node) to resume from it."""
        import shutil

        c = self.contract(name)
        folder = f"checkpoint-{step:08d}"
        shutil.copytree(run.contract.checkpoint_dir / folder, c.checkpoint_dir / folder)
        return c

    def copy(self, name: str, run: TrainRun) -> Contract:
        """A new run folder holding all that `run` left (checkpoints, metrics, model): the same job,
        to start again (or to damage first) without training its steps once more."""
        import shutil

        shutil.copytree(run.contract.root, self.root / name)
        return self.contract(name)

    def popen(
        self, *flags: str, name: str = "run", processes: int | None = None, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, Contract, list[str]]:
        if uses_deepspeed(flags):
            build_deepspeed_cpu_op()  # a test not marked deepspeed: still outside the run's time limit
        c = self.contract(name)
        run_env = base_env({**self.shared_env, **c.env(), "DISTRAIN_MAIN_PORT": str(free_port()), **(env or {})})
        argv = command(flags, processes)
        proc = subprocess.Popen(
            argv,
            cwd=c.workdir,
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        return proc, c, argv

    def finish(self, proc: subprocess.Popen, c: Contract, argv: list[str], timeout: float = RUN_TIMEOUT_S) -> TrainRun:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            pytest.fail(f"run timed out after {timeout}s: {' '.join(argv)}\n{out[-3000:]}\n{err[-3000:]}")
        return TrainRun(proc.returncode, out, err, read_metrics(c.output_dir / "metrics.jsonl"), c, argv)

    def __call__(
        self,
        *flags: str,
        name: str = "run",
        processes: int | None = None,
        env: dict[str, str] | None = None,
        timeout: float = RUN_TIMEOUT_S,
    ) -> TrainRun:
        proc, c, argv = self.popen(*flags, name=name, processes=processes, env=env)
        return self.finish(proc, c, argv, timeout)

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        """Kill a run started with popen() and everything it started, if it is still running."""
        if proc.poll() is None:
            _kill_group(proc)
            proc.communicate()

    def many(self, jobs: Sequence[dict], parallel: int = 2) -> list[TrainRun]:
        """Independent runs, `parallel` at a time (single-process runs use one core each).

        Each job is a dict with `flags` and optionally `name`, `processes`, `env`.
        """
        results: list[TrainRun | None] = [None] * len(jobs)
        running: list[tuple[int, subprocess.Popen, Contract, list[str]]] = []
        pending = list(enumerate(jobs))
        try:
            while pending or running:
                while pending and len(running) < parallel:
                    i, job = pending.pop(0)
                    running.append(
                        (
                            i,
                            *self.popen(
                                *job["flags"],
                                name=job.get("name", f"job{i}"),
                                processes=job.get("processes"),
                                env=job.get("env"),
                            ),
                        )
                    )
                i, proc, c, argv = running.pop(0)
                results[i] = self.finish(proc, c, argv)
        finally:
            for _, proc, _, _ in running:
                _kill_group(proc)
                proc.wait()
        return results  # type: ignore[return-value]


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a run and the processes it started (its own session: start_new_session=True)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def narrow_llama():
    """narrow_llama(layers=2): llama-1b's architecture 64 wide with a 256-token vocabulary, built from
    its config in this process (the fp8 conversions' subject)."""

    def build(layers: int = 2):
        from distrain_cloud.training import modeling
        from distrain_cloud.training.args import parse_args

        narrow = (
            f"hidden_size=64,intermediate_size=128,num_hidden_layers={layers},num_attention_heads=4,"
            "num_key_value_heads=2,vocab_size=256"
        )
        args = parse_args(["--task", "causal-lm", "--preset", "llama-1b", "--config-overrides", narrow])
        return modeling.load_model(args, modeling.load_tokenizer(args))

    return build


@pytest.fixture
def few_steps():
    """few_steps(model, steps, autocast=False): the losses of `steps` AdamW steps (lr 1e-2) on one
    fixed batch of 2 x 32 tokens, under bf16 autocast where asked (the float8 layers' dtype)."""

    def train(model, steps: int, autocast: bool = False) -> list[float]:
        import torch

        ids = torch.randint(0, model.config.vocab_size, (2, 32))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    return train


@pytest.fixture(scope="session")
def shared_env(tmp_path_factory) -> dict[str, str]:
    """Caches shared by every run of the session, away from the developer's home folder."""
    root = tmp_path_factory.mktemp("caches")
    return {
        "HF_HOME": str(root / "hf"),
        "HF_DATASETS_CACHE": str(root / "hf" / "datasets"),
        "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"),
        "WANDB_DATA_DIR": str(root / "wandb-data"),
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
    }


@pytest.fixture
def aot_eager() -> dict[str, str]:
    """A run's environment for tests of compile plumbing (graph capture, DDP's bucketing, FSDP's
    hooks): Dynamo and AOTAutograd without Inductor's C++ build, half a minute a process on CPU
    (trainer._compile). Inductor itself runs in test_compile_default.py and test_training_forward.py."""
    return {"DISTRAIN_COMPILE_BACKEND": "aot_eager"}


@pytest.fixture
def auto_as_on_gpus() -> Callable[..., dict[str, str]]:
    """`auto_as_on_gpus(min_steps=, max_params=)`: a run's environment under which --strategy auto
    decides as on CUDA GPUs of one node, with these thresholds (auto_shim/sitecustomize.py)."""

    def env(*, min_steps: int, max_params: int) -> dict[str, str]:
        shim = str(Path(__file__).parent / "auto_shim")
        return {
            "PYTHONPATH": os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")])),
            "DISTRAIN_TEST_AUTO_MIN_STEPS": str(min_steps),
            "DISTRAIN_TEST_AUTO_MAX_PARAMS": str(max_params),
        }

    return env


@pytest.fixture
def train(tmp_path, shared_env) -> Runner:
    """`train(*flags, name=..., processes=..., env=...)` -> TrainRun, contract under tmp_path/<name>."""
    return Runner(tmp_path, shared_env)


@pytest.fixture(scope="module")
def module_train(tmp_path_factory, shared_env) -> Runner:
    """The same, for module-scoped baselines shared by several tests."""
    return Runner(tmp_path_factory.mktemp("module-runs"), shared_env)


# A tiny GPT-2 like the tiny-gpt2 preset, but without dropout: with dropout, each process
# draws its own masks, so 1 and 2 processes cannot give the same numbers.
NO_DROPOUT_GPT2 = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 64,
    "n_positions": 512,
    "attn_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "summary_first_dropout": 0.0,
}


@pytest.fixture(scope="session")
def no_dropout_config(tmp_path_factory) -> Path:
    """config.json of a dropout-free tiny GPT-2 for --model-config (vocab from the shipped tokenizer)."""
    from transformers import PreTrainedTokenizerFast

    from distrain_cloud.training.modeling import SHIPPED_TOKENIZER

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHIPPED_TOKENIZER))
    eos, pad = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<pad>")
    config = {**NO_DROPOUT_GPT2, "vocab_size": len(tok), "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad}
    path = tmp_path_factory.mktemp("configs") / "tiny-gpt2-no-dropout.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="session")
def sharded_lm_baseline(tmp_path_factory, shared_env, no_dropout_config) -> TrainRun:
    """The eager DDP job (2 processes, test_fsdp.compared_lm_flags) that both fsdp engines are
    compared with, in test_fsdp.py and test_graph_fsdp.py: one run for both files on a worker."""
    from test_fsdp import compared_lm_flags

    runner = Runner(tmp_path_factory.mktemp("sharded-lm-baseline"), shared_env)
    return runner(*compared_lm_flags(no_dropout_config), "--strategy", "ddp", name="lm-ddp", processes=2)


@pytest.fixture
def dynamo_graphs():
    """`dynamo_graphs(fn, *inputs)` -> the FX graphs Dynamo captures when compiling fn and calling
    it once (each runs as traced; no Inductor, so it is fast on CPU)."""
    import torch

    def capture(fn, *inputs) -> list:
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        torch._dynamo.reset()
        try:
            torch.compile(fn, backend=backend)(*inputs)
        finally:
            torch._dynamo.reset()
        return graphs

    return capture
