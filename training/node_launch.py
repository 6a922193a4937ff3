"""Start the training processes of one node: `python -m distrain_cloud.training.node_launch -- ARGS`.

Every backend runs this same command on every node (SageMaker, each EC2 instance, the
local machine). It reads the container contract, renders this node's Accelerate config
from the strategy, and runs `accelerate launch` as a child, one process per GPU (or
`--processes N` CPU processes), forwarding SIGTERM/SIGINT to it and exiting with its code.
Torch-free unless it has to count GPUs itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .args import parse_args
from .contract import STOP_EXIT_CODE, Contract
from .strategies import ClusterShape, accelerate_config, parse_strategy


@dataclass(frozen=True)
class NodeLaunch:
    config: dict
    command: list[str]  # with CONFIG_FILE standing for the rendered config's path
    env: dict[str, str]


CONFIG_FILE = "{config_file}"


def plan_node(
    train_argv: Sequence[str], contract: Contract, *, processes: int | None = None, gpus: int | None = None
) -> NodeLaunch:
    """Pure: what this node will run. The launcher calls it to render plans."""
    args = parse_args(train_argv)
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
    strategy = parse_strategy(args.strategy)
    config = accelerate_config(strategy, cluster, precision=args.precision)
    env = {}
    if strategy.uses_deepspeed and use_cpu:
        env["DS_ACCELERATOR"] = "cpu"
    elif use_cpu:  # torchrun does not pass the config's use_cpu on; gloo DDP needs it
        env["ACCELERATE_USE_CPU"] = "true"
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
    return NodeLaunch(config, command, env)


def _count_gpus() -> int:
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
        import json

        from .args import hyperparameters_to_argv

        with open(ns.hyperparameters) as f:
            train_argv = hyperparameters_to_argv(json.load(f)) + train_argv
    contract = Contract.from_env()
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
    print(
        f"node_launch node_rank={contract.node_rank} nodes={contract.num_nodes} "
        f"processes={launch.config['num_processes']} distributed_type={launch.config['distributed_type']} "
        f"code={Path(__file__).parent}",
        flush=True,
    )
    try:
        code = _run_forwarding_signals(command, {**os.environ, **launch.env}, contract.failure_file)
    finally:
        os.unlink(path)
    sys.exit(_exit_code(code, contract))


def _run_forwarding_signals(command: list[str], env: dict[str, str], failure_file: Path) -> int:
    """Run accelerate's launcher as a child; SIGTERM/SIGINT (spot interruption, stop) go to
    it, and through it to every training process, which save a checkpoint and exit
    STOP_EXIT_CODE.

    Its stderr passes through as it comes, except the launcher's own failure report (the
    agent's log line and ChildFailedError traceback), which is held back and dropped when
    the job already explained itself in the failure file: bad input stays one line.
    """
    import signal
    import subprocess
    import threading

    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    stopping: list[int] = []
    held: list[str] = []

    def forward(signum, frame):
        stopping.append(signum)
        proc.send_signal(signum)

    def relay():
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode(errors="replace")
            if held or "torch/distributed/elastic" in line or line.startswith("Traceback (most recent call"):
                held.append(line)
            else:
                sys.stderr.write(line)
                sys.stderr.flush()

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait()
        reader.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if held and not (code != 0 and failure_file.is_file()):
        sys.stderr.write("".join(held))
    return STOP_EXIT_CODE if stopping and code != 0 else code


def _exit_code(code: int, contract: Contract) -> int:
    # torchrun reports any worker failure as 1; the contract's failure file says it was bad input.
    if code not in (0, STOP_EXIT_CODE) and contract.failure_file.is_file():
        return 2
    return code


if __name__ == "__main__":
    main()
