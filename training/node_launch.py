"""Start the training processes of one node: `python -m distrain_cloud.training.node_launch -- ARGS`.

Every backend runs this same command on every node (SageMaker, each EC2 instance, the
local machine). It reads the container contract, renders this node's Accelerate config
from the strategy, and runs `accelerate launch` as a child, one process per GPU (or
`--processes N` CPU processes; one process alone on one machine starts directly), forwarding
SIGTERM/SIGINT to its processes and exiting with its code. Torch-free unless it has to count
GPUs itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .args import TrainArgs, hyperparameters_to_argv, parse_args
from .contract import SECOND_INTERRUPT_S, Contract
from .precision import no_gpu_here, pick_precision, visible_gpus
from .stopping import (
    DEFAULT_STOP_GRACE_S,
    LAUNCHER_MARGIN_S,
    STOP_UNSAVED_EXIT_CODE,
    ProcessTree,
    child_dies_with_us,
    is_unsaved_line,
)
from .strategies import ClusterShape, accelerate_config, provisional_strategy


@dataclass(frozen=True)
class NodeLaunch:
    config: dict
    command: list[str]  # with CONFIG_FILE standing for the rendered config's path
    env: dict[str, str]
    stop_grace_s: float = DEFAULT_STOP_GRACE_S  # the trainers' --stop-grace
    direct: bool = False  # the command is the one training process itself, not a launcher above it


CONFIG_FILE = "{config_file}"
# Names the file each node's first training process writes once the run finished (every step,
# its model saved): the job completed, whatever its launchers exit with afterwards (one killed on
# the way out). A file of node_launch's own, beside its rendered config: never in the job's outputs.
COMPLETED_FILE_ENV = "DISTRAIN_COMPLETED_FILE"
# A backend that wants this node's exit code (and whether it was stopped) after its own end names a
# file here: the local backend, whose CLI may be gone by then.
EXIT_FILE_ENV = "DISTRAIN_EXIT_FILE"
# Set (by the local backend, whose log file has no times of its own): each line this process
# writes starts with the time it was written, `2026-11-28T01:23:45.678Z ` (launcher.logs reads it).
LOG_TIMES_ENV = "DISTRAIN_LOG_TIMES"
# How torchrun's agent reports a training process that a signal ended (a ChildFailedError); one
# process started directly shows it in its own exit code.
_KILLED = re.compile(r"Signal \d+ \((SIG[A-Z0-9]+)\) received by PID")


def stamped(line: str) -> str:
    """`line` as this process writes it: with the time first where LOG_TIMES_ENV asks."""
    if not os.environ.get(LOG_TIMES_ENV):
        return line

    now = datetime.now(timezone.utc)
    return f"{now:%Y-%m-%dT%H:%M:%S}.{now.microsecond // 1000:03d}Z {line}"


def plan_node(
    train_argv: Sequence[str],
    contract: Contract,
    *,
    processes: int | None = None,
    gpus: int | None = None,
    args: TrainArgs | None = None,
) -> NodeLaunch:
    """Pure: what this node will run. The launcher calls it to render plans, with `args`: the
    flags as its plan parsed them once (None: parsed here)."""
    args = parse_args(train_argv) if args is None else args
    gpus = contract.gpus_per_node if gpus is None else gpus
    use_cpu = gpus == 0
    per_node = processes or (gpus if gpus else 1)
    cluster = ClusterShape(
        num_nodes=contract.num_nodes,
        node_rank=contract.node_rank,
        processes_per_node=per_node,
        main_addr=contract.main_addr,
        main_port=contract.main_port,
        use_cpu=use_cpu,
    )
    # On one process resuming an in-graph checkpoint, auto's trainer describes its one-process group itself.
    strategy = provisional_strategy(args.strategy)
    precision = args.precision
    if precision is None:  # what each training process will pick itself (precision.resolve_precision)
        precision = pick_precision(None, *(visible_gpus() if gpus else (0, None)))[0]
    config = accelerate_config(strategy, cluster, precision=precision)
    env = {}
    if strategy.uses_deepspeed and use_cpu:
        env["DS_ACCELERATOR"] = "cpu"
    elif use_cpu:  # torchrun does not pass the config's use_cpu on; gloo DDP needs it
        env["ACCELERATE_USE_CPU"] = "true"
    direct = _one_plain_process(config)
    if direct:
        # What accelerate's simple launcher would do, without its ~2 s of importing torch and
        # Accelerate in a process that only starts one child: the same command and variables.
        env.update(simple_launcher_env(config))
        command = [sys.executable, "-m", "distrain_cloud.training", *train_argv]
    else:
        command = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            CONFIG_FILE,
            "-m",
            "distrain_cloud.training",
            *train_argv,
        ]
    return NodeLaunch(config, command, env, args.stop_grace, direct)


def _one_plain_process(config: dict) -> bool:
    """One process on one machine, no engine of Accelerate's own: `accelerate launch` would run
    its simple launcher, which only sets a few variables and waits for the child. (fp8 is bf16
    in the config: the trainer converts its layers itself, fp8.py.)"""
    return config["distributed_type"] == "NO" and config["num_processes"] == 1 and config["num_machines"] == 1


def simple_launcher_env(config: dict) -> dict[str, str]:
    """The variables accelerate launch's simple launcher sets for `config` (accelerate 1.x,
    `prepare_simple_launcher_cmd_env`), the thread count as node_launch passes it."""
    env = {
        "ACCELERATE_USE_CPU": str(bool(config["use_cpu"])),
        "ACCELERATE_MIXED_PRECISION": config["mixed_precision"],
        "ACCELERATE_DYNAMO_BACKEND": "NO",
        "ACCELERATE_DYNAMO_MODE": "default",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
        "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
        "OMP_NUM_THREADS": str(_threads_per_process(config)),
    }
    if config["use_cpu"]:
        env |= {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"}
    if config.get("gpu_ids") not in (None, "all"):
        env["CUDA_VISIBLE_DEVICES"] = str(config["gpu_ids"])
    return env


def running_type(launch: NodeLaunch) -> str:
    """What the processes run as, for the log line: the config's distributed_type, except that
    processes on CPUs launched through torchrun (a config of MULTI_GPU, which accelerate's
    launcher needs for torchrun) run as MULTI_CPU, or DeepSpeed on CPU."""
    kind = launch.config["distributed_type"]
    if kind == "MULTI_GPU" and launch.config["use_cpu"]:
        return "MULTI_CPU"
    if kind == "MULTI_GPU" and launch.env.get("DS_ACCELERATOR") == "cpu":
        return "DEEPSPEED (CPU)"
    return kind


def _threads_per_process(config: dict) -> int:
    """What accelerate launch would pick for --num_cpu_threads_per_process: OMP_NUM_THREADS
    where set, else on CPUs the physical cores shared among this node's processes, else 1."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if not config["use_cpu"]:
        return 1
    try:
        import psutil

        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        cores = os.cpu_count() or 1
    per_node = max(1, config["num_processes"] // max(1, config["num_machines"]))
    return max(1, cores // per_node)


def _count_gpus() -> int:
    """CUDA GPUs on this machine. torch takes seconds to import, and this process needs nothing
    else from it: where precision.no_gpu_here says so, the answer is 0 without it."""
    if no_gpu_here():
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def main(argv: Sequence[str] | None = None) -> None:
    import yaml

    from .__main__ import _fail

    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="distrain-node-launch")
    p.add_argument("--processes", type=int, help="processes on this node (default: one per GPU, else 1)")
    p.add_argument("--print-config", action="store_true", help="print the rendered config and exit")
    p.add_argument(
        "--hyperparameters",
        metavar="JSON_FILE",
        help="read training flags from a SageMaker hyperparameters.json (before any after --)",
    )
    ns = p.parse_args(ours)
    if ns.hyperparameters:
        with open(ns.hyperparameters) as f:
            train_argv = hyperparameters_to_argv(json.load(f)) + train_argv
    try:
        contract = Contract.from_env()
    except ValueError as e:  # an engine's variables incomplete or contradictory: one line on every node
        _fail(e, None, every_process=True)
    gpus = contract.gpus_per_node or _count_gpus()
    try:
        launch = plan_node(train_argv, contract, processes=ns.processes, gpus=gpus)
    except ValueError as e:
        _fail(e, contract)
    text = yaml.safe_dump(launch.config, sort_keys=True)
    if ns.print_config:
        print(text)
        return
    fd, path = tempfile.mkstemp(prefix="distrain-accelerate-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    command = [path if c == CONFIG_FILE else c for c in launch.command]
    if not launch.direct:
        # Given, so accelerate launch does not pick it itself and print a note saying so on every launch.
        at = command.index("--config_file")
        command[at:at] = ["--num_cpu_threads_per_process", str(_threads_per_process(launch.config))]
    print(
        stamped(
            f"node_launch node_rank={contract.node_rank} nodes={contract.num_nodes} "
            f"processes={launch.config['num_processes']} distributed_type={running_type(launch)} "
            f"code={Path(__file__).parent}"
        ),
        flush=True,
    )
    completed = Path(path).with_suffix(".completed")
    stops: list[int] = []
    try:
        env = {**os.environ, **launch.env, "DISTRAIN_DIE_WITH_LAUNCHER": "1"}  # see __main__._run
        env[COMPLETED_FILE_ENV] = str(completed)
        bound_s = launch.stop_grace_s + LAUNCHER_MARGIN_S
        code = _run_forwarding_signals(
            command, env, contract.failure_file, bound_s, completed=completed, stops=stops, direct=launch.direct
        )
    finally:
        os.unlink(path)
        completed.unlink(missing_ok=True)
    code = _exit_code(code, contract)
    _record_exit(code, stops)
    sys.exit(code)


def _record_exit(code: int, stops: list[int]) -> None:
    """This node's exit code, and the stop signal it got, where the backend asked (EXIT_FILE_ENV)."""
    path = os.environ.get(EXIT_FILE_ENV)
    if path:
        try:
            Path(path).write_text(json.dumps({"exit_code": code, "stopped": stops[0] if stops else None}))
        except OSError:  # a full disk: the backend then knows only that the job ended
            pass


def killed_line(sig: str) -> str:
    """The one line for a training process that a signal ended, with its likely cause."""
    job = os.environ.get("DISTRAIN_JOB_NAME") or os.environ.get("TRAINING_JOB_NAME") or "JOB"
    cause = {
        "SIGKILL": "likely the out-of-memory killer (the machine ran out of memory: a smaller --batch-size or "
        "--block-size, or fewer --processes, needs less)",
        "SIGSEGV": "a crash in native code (a library's or a driver's)",
        "SIGBUS": "a crash in native code, or shared memory (/dev/shm) too small for the data loader",
        "SIGABRT": "a library aborted the process (its message is in the lines above)",
    }.get(sig, "something on this machine sent it")
    return (
        f"error: a training process was killed by {sig}: {cause}; resume from the last checkpoint with "
        f"`distrain-cloud resume {job}`"
    )


def _run_forwarding_signals(
    command: list[str],
    env: dict[str, str],
    failure_file: Path,
    bound_s: float,
    *,
    completed: Path | None = None,
    stops: list[int] | None = None,
    direct: bool = False,
) -> int:
    """Run accelerate's launcher as a child (`direct`: the one training process itself);
    SIGTERM/SIGINT (spot interruption, stop, Ctrl-C) go to every training process, which save a
    checkpoint and exit 143 (SIGTERM) or 130 (SIGINT), or,
    when their step does not end within --stop-grace, exit 124 saying nothing was saved. A
    second Ctrl-C ends them at once (SIGKILL). Whatever still runs `bound_s` after the stop (the
    grace and the launcher's time to exit) is killed, the whole tree, and this exits 124.

    The launcher dies with this process (and the trainers with the launcher: Trainer.__init__), so
    a node_launch killed outright leaves no training process holding a GPU.

    The signal goes to the training processes themselves (found under the launcher), and the
    launcher's own process ignores both signals (the training processes take the defaults
    back): torchrun's agent relays it again, and the trainer counts copies a few milliseconds
    apart as one (as it does those a terminal's Ctrl-C sends to the whole process group).

    Its stderr passes through as it comes, except the launcher's own failure report (the
    agent's log line and ChildFailedError traceback), which is
    held back and dropped when the job already explained itself (the failure file) or stopped
    on request: bad input and stops stay one line. A training process that a signal ended (the
    out-of-memory killer's SIGKILL) is one line too, naming the signal, its likely cause and the
    resume command, in the failure file as well; the exit code is then 128 + the signal's number.
    A run that wrote `completed` (every step done, its model saved) exits 0, whatever its
    launcher did afterwards. `stops` gets the stop signals this process received.
    """

    def ignore_stops() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    # `direct`: the child is the one training process itself, not a launcher above the training
    # processes. Its own children are its data loader workers, which no stop signal may reach.
    # Without /proc the training processes cannot be found: the launcher then keeps the defaults.
    reachable = Path("/proc/self").is_dir() and not direct
    preexec = child_dies_with_us(signal.SIGKILL, then=ignore_stops if reachable else None)
    # Stamping each line needs its stdout too; otherwise it goes where this process's goes.
    stdout = subprocess.PIPE if os.environ.get(LOG_TIMES_ENV) else None
    proc = subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.PIPE, preexec_fn=preexec)
    tree = ProcessTree(proc.pid)
    stopping: list[tuple[int, float]] = []  # (signal, when)
    stops = [] if stops is None else stops
    held: list[str] = []
    unsaved: list[str] = []  # a trainer's line saying its stop saved nothing

    def forward(signum, frame):
        # A second Ctrl-C (not a copy of the first: see SECOND_INTERRUPT_S) kills.
        now = time.monotonic()
        second = bool(stopping) and signum == signal.SIGINT and now - stopping[0][1] >= SECOND_INTERRUPT_S
        stopping.append((signum, now))
        stops.append(signum)
        tree.refresh()  # while every process still hangs below the launcher
        for pid in [proc.pid, *([] if direct else _training_processes(proc.pid))]:
            try:
                os.kill(pid, signal.SIGKILL if second else signum)
            except ProcessLookupError:  # already gone
                pass

    def relay():
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode(errors="replace")
            if is_unsaved_line(line):  # the stop's one line: shown even among held lines
                unsaved.append(line)
            elif held or "torch/distributed/elastic" in line or line.startswith("Traceback (most recent call"):
                held.append(line)
                continue
            _write(sys.stderr, line)

    def relay_stdout():
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            _write(sys.stdout, raw.decode(errors="replace"))

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    readers = [threading.Thread(target=relay, daemon=True)]
    if proc.stdout is not None:
        readers.append(threading.Thread(target=relay_stdout, daemon=True))
    for reader in readers:
        reader.start()
    killed = False
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            if stopping:
                tree.refresh()  # processes that left the launcher's group or lost their parent meanwhile
                if time.monotonic() - stopping[0][1] > bound_s and not killed:
                    _write(
                        sys.stderr,
                        f"node_launch: training processes still running {bound_s:g} s after the stop: "
                        "killing them (no checkpoint saved)\n",
                    )
                    tree.kill()
                    killed = True
        for reader in readers:
            reader.join(timeout=10)  # the pipe ends when every process holding it has
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code != 0 and completed is not None and completed.is_file():
        _write(
            sys.stderr,
            f"node_launch: the run finished (every step, its model saved), then its launcher ended "
            f"({_describe(code)}): the job completed\n",
        )
        return 0
    # Not for a stop, nor for a job that explained itself (a user's own traceback may quote one).
    killer = None if stopping or failure_file.is_file() else _killing_signal(code, held)
    if killer is not None:
        line = killed_line(killer)
        _write(sys.stderr, line + "\n")
        try:
            failure_file.parent.mkdir(parents=True, exist_ok=True)
            failure_file.write_text(line + "\n")
        except OSError:
            pass
        return 128 + signal.Signals[killer].value
    if held and not (code != 0 and (failure_file.is_file() or stopping)):
        for line in held:
            _write(sys.stderr, line)
    if stopping and code != 0:
        return STOP_UNSAVED_EXIT_CODE if unsaved or killed else 128 + stopping[0][0]
    return code if code >= 0 else 128 - code  # a training process started directly, killed: as a shell says it


def _write(stream, line: str) -> None:
    """One line, stamped where asked, in one write (lines of two streams sharing a file stay whole)."""
    stream.write(stamped(line))
    stream.flush()


def _describe(code: int) -> str:
    killed = code < 0 and -code in signal.valid_signals()
    return f"killed by {signal.Signals(-code).name}" if killed else f"exit code {code}"


def _killing_signal(code: int, held: list[str]) -> str | None:
    """The signal that ended a training process: torchrun's report says it, or a negative code
    does (the process started directly, or the launcher itself, killed rather than failed); None
    when none did."""
    if code < 0 and -code in signal.valid_signals():
        return signal.Signals(-code).name
    if code == 0:
        return None
    for line in held:
        found = _KILLED.search(line)
        if found and found.group(1) in signal.Signals.__members__:
            return found.group(1)
    return None


def _training_processes(root: int) -> list[int]:
    """The training entry points (`-m distrain_cloud.training`) among the descendants of `root`,
    from /proc; none where there is no /proc (the signal then reaches the launcher only). Not
    their own descendants: data loader workers are forks with the same command line, and torch's
    SIGTERM handler in a worker dies of any SIGTERM but its parent's, which fails the trainer's
    step instead of the checkpointed stop the signal asks for."""
    children: dict[int, list[int]] = {}
    commands: dict[int, list[str]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended meanwhile
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])  # the name in (...) may hold spaces
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        argv = commands.get(pid, [])
        if "distrain_cloud.training" in argv and "accelerate.commands.launch" not in argv:
            found.append(pid)
        else:
            todo += children.get(pid, [])
    return found


def _exit_code(code: int, contract: Contract) -> int:
    # torchrun reports any worker failure as 1; the contract's failure file says it was bad input,
    # unless a traceback lies beside it (a failure no check foresaw: exit 1, see __main__).
    # A code from 128 up is a signal's (node_launch's own line named it), never bad input.
    if 0 < code < 128 and contract.failure_file.is_file():
        return 1 if (contract.output_dir / "traceback.txt").is_file() else 2
    return code


if __name__ == "__main__":
    main()
