"""Each manifest `distrain-cloud export` writes, run on this machine as its engine starts it: the
node command of the manifest (SkyPilot's `run` under bash, the pod's `command`), the manifest's
environment, and the variables the engine adds on each node (its env contract, as its source sets
them: docs/portability.md), 2 nodes on loopback with 2 CPU processes each. The losses equal those of
the same training flags run as a local 2x2 job with distrain-cloud's own variables (what the EC2
node agent writes).

Stand-ins, and only these: the nodes are processes of this machine (127.0.0.1 is the main node's
address), the image or synced workdir is this venv (its `python` first on PATH; SkyPilot's `setup`
is not run), and each engine's rendezvous port is a free one (the engines' 29500 or 23456 may be
taken on a shared test machine). A multi-node CPU run is gloo over loopback.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from distrain_cloud.training.contract import free_port

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

FLAGS = ["--task", "causal-lm", "--block-size", "64", "--batch-size", "8", "--max-steps", "4", "--log-every", "1"]
FLAGS += ["--report-to", "none", "--no-save-model", "--generate-tokens", "0", "--max-eval-samples", "16"]
NODES, PROCESSES = 2, 2
_ENGINE_VARS = ("DISTRAIN_", "SM_", "SKYPILOT_", "DSTACK_", "AWS_BATCH_", "PET_", "TORCHELASTIC_", "ACCELERATE_")
_STRIPPED = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}


def exported(engine: str, capsys) -> dict[str, Any]:
    from clirun import run_cli

    image = [] if engine == "skypilot" else ["--image", "registry.example.com/distrain-cloud:test"]
    hardware = ["--accelerator", "cpu", "--processes", str(PROCESSES), "--nodes", str(NODES)]
    code, out, err = run_cli(capsys, "export", engine, "--dry-run", *hardware, *image, "--", *FLAGS)
    assert code == 0, err
    return yaml.safe_load(out)


def engine_contract(engine: str, rank: int, port: int) -> dict[str, str]:
    """What the engine adds to node `rank`'s environment (docs/portability.md cites the source)."""
    if engine == "skypilot":  # sky/skylet/constants.py, set by the backend for `run`
        return {
            "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NODE_IPS": "\n".join(["127.0.0.1"] * NODES),
            "SKYPILOT_NUM_NODES": str(NODES),
            "SKYPILOT_NUM_GPUS_PER_NODE": "0",
            "DISTRAIN_MAIN_PORT": str(port),  # SkyPilot names no port: the task's envs may
        }
    if engine == "trainjob":  # kubeflow/trainer's Torch plugin
        return {
            "PET_NNODES": str(NODES),
            "PET_NPROC_PER_NODE": str(PROCESSES),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
        }
    if engine == "pytorchjob":  # training-operator 1.9's setPodEnv, nprocPerNode set
        return {
            "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
            "WORLD_SIZE": str(NODES * PROCESSES),
            "RANK": str(rank),
            "PET_NODE_RANK": str(rank),
            "PET_NPROC_PER_NODE": str(PROCESSES),
            "PET_NNODES": str(NODES),
        }
    # distrain-cloud's own contract, as the EC2 node agent writes it
    return {
        "DISTRAIN_NUM_NODES": str(NODES),
        "DISTRAIN_NODE_RANK": str(rank),
        "DISTRAIN_MAIN_ADDR": "127.0.0.1",
        "DISTRAIN_MAIN_PORT": str(port),
        "DISTRAIN_MODEL_DIR": "distrain-job/model",
        "DISTRAIN_OUTPUT_DIR": "distrain-job/output",
        "DISTRAIN_CHECKPOINT_DIR": "distrain-job/checkpoints",
    }


def node_command(manifest: dict[str, Any], engine: str) -> tuple[list[str], dict[str, str]]:
    """The node's command and the manifest's own environment for it."""
    if engine == "skypilot":
        return ["bash", "-c", manifest["run"]], {k: str(v) for k, v in manifest["envs"].items()}
    if engine == "trainjob":
        trainer = manifest["spec"]["trainer"]
        return trainer["command"], {e["name"]: e["value"] for e in trainer["env"]}
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] + replicas["Worker"]["replicas"] == NODES
    (container,) = replicas["Worker"]["template"]["spec"]["containers"]
    return container["command"], {e["name"]: e["value"] for e in container["env"]}


def start_nodes(
    name: str, command: list[str], manifest_env: dict[str, str], engine: str, root: Path, shared: dict[str, str]
) -> list[subprocess.Popen[str]]:
    port = free_port()
    here = {k: v for k, v in os.environ.items() if not k.startswith(_ENGINE_VARS) and k not in _STRIPPED}
    here["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), here.get("PATH", "")])  # the image's python
    here |= {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **shared}
    procs = []
    for rank in range(NODES):
        cwd = root / name / f"node{rank}"  # each node's own disk
        cwd.mkdir(parents=True)
        env = {**here, **manifest_env, **engine_contract(engine, rank, port)}
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        procs.append(subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, **pipes))
    return procs


def finish(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def losses(root: Path) -> dict[int, float]:
    import json

    path = root / "node0" / "distrain-job" / "output" / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


def test_each_export_runs_as_its_engine_starts_it_and_trains_like_a_local_2x2_job(tmp_path, capsys, shared_env):
    """One run of all four jobs at once (their 16 processes mostly wait on one another's imports on
    this machine's two cores): the exports, and the baseline with the very training flags they run
    under distrain-cloud's own contract."""
    manifests = {engine: exported(engine, capsys) for engine in ("skypilot", "trainjob", "pytorchjob")}
    commands = {engine: node_command(manifest, engine) for engine, manifest in manifests.items()}
    commands["local"] = (commands["trainjob"][0], {})
    running = {engine: start_nodes(engine, *commands[engine], engine, tmp_path, shared_env) for engine in commands}
    try:
        ended = {engine: finish(procs) for engine, procs in running.items()}
    finally:  # a run that failed or hung leaves none of the others behind
        for proc in [proc for procs in running.values() for proc in procs if proc.poll() is None]:
            os.killpg(proc.pid, 9)
            proc.wait()
    for engine, nodes in ended.items():
        for rank, node in enumerate(nodes):
            command = shlex.join(commands[engine][0])
            assert node.returncode == 0, f"{engine} node {rank}: {command}\n{node.stderr[-4000:]}"
            first = node.stdout.splitlines()[0]
            assert first.startswith(f"node_launch node_rank={rank} nodes=2 processes=4 distributed_type=MULTI_CPU")
    baseline = losses(tmp_path / "local")
    assert sorted(baseline) == [1, 2, 3, 4]
    for engine in manifests:
        got = losses(tmp_path / engine)
        assert got.keys() == baseline.keys(), engine
        for step, loss in baseline.items():
            assert got[step] == pytest.approx(loss, rel=1e-6), (engine, step, got, baseline)
