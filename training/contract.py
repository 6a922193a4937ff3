"""The container contract: what every job sees, whichever backend started it.

Folders (data channels, model, output, checkpoints) and the cluster shape (nodes, this
node's rank, main node address and port, GPUs per node). SageMaker describes them with
`SM_*` variables; the EC2 bootstrap and the local backend write the `DISTRAIN_*`
variables below. SageMaker's win when both are present. Torch-free.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "DISTRAIN_"
# The exit code of a job stopped on request (128 + SIGTERM) after saving its state: the trainer
# exits with it, the node launcher reports it, backends read it as "stopped", not "failed".
STOP_EXIT_CODE = 143
# SageMaker syncs this folder to checkpoint_config.S3Uri; it has no SM_* variable.
SAGEMAKER_CHECKPOINT_DIR = "/opt/ml/checkpoints"


@dataclass(frozen=True)
class Contract:
    model_dir: Path
    output_dir: Path
    checkpoint_dir: Path
    channels: dict[str, Path] = field(default_factory=dict)
    num_nodes: int = 1
    node_rank: int = 0
    main_addr: str = "127.0.0.1"
    main_port: int = 29500
    gpus_per_node: int = 0
    source: str = "default"  # "sagemaker", "distrain" or "default": who described it

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Contract:
        env = os.environ if env is None else env
        if "SM_MODEL_DIR" in env or "SM_TRAINING_ENV" in env:
            return cls._from_sagemaker(env)
        sm_root = Path(env.get(f"{PREFIX}SAGEMAKER_ROOT", "/opt/ml"))
        if (sm_root / "input/config/resourceconfig.json").is_file():
            return cls._from_sagemaker(sagemaker_env_from_files(sm_root, env))
        if f"{PREFIX}MODEL_DIR" in env:
            return cls._from_distrain(env)
        here = Path.cwd()
        return cls(
            model_dir=here / "model",
            output_dir=here / "output",
            checkpoint_dir=here / "checkpoints",
        )

    @classmethod
    def _from_sagemaker(cls, env: Mapping[str, str]) -> Contract:
        hosts = json.loads(env.get("SM_HOSTS", "[]")) or [env.get("SM_CURRENT_HOST", "algo-1")]
        current = env.get("SM_CURRENT_HOST", hosts[0])
        channels = {
            name: Path(env[f"SM_CHANNEL_{name.upper()}"])
            for name in json.loads(env.get("SM_CHANNELS", "[]"))
            if f"SM_CHANNEL_{name.upper()}" in env
        }
        return cls(
            model_dir=Path(env.get("SM_MODEL_DIR", "/opt/ml/model")),
            output_dir=Path(env.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data")),
            checkpoint_dir=Path(env.get(f"{PREFIX}CHECKPOINT_DIR", SAGEMAKER_CHECKPOINT_DIR)),
            channels=channels,
            num_nodes=len(hosts),
            node_rank=hosts.index(current) if current in hosts else 0,
            # SageMaker resolves algo-N host names inside the job's network.
            main_addr=sorted(hosts)[0] if hosts else "127.0.0.1",
            main_port=int(env.get(f"{PREFIX}MAIN_PORT", "29500")),
            gpus_per_node=int(env.get("SM_NUM_GPUS", "0")),
            source="sagemaker",
        )

    @classmethod
    def _from_distrain(cls, env: Mapping[str, str]) -> Contract:
        channels = {
            key[len(PREFIX + "CHANNEL_") :].lower(): Path(value)
            for key, value in env.items()
            if key.startswith(PREFIX + "CHANNEL_")
        }
        return cls(
            model_dir=Path(env[f"{PREFIX}MODEL_DIR"]),
            output_dir=Path(env[f"{PREFIX}OUTPUT_DIR"]),
            checkpoint_dir=Path(env[f"{PREFIX}CHECKPOINT_DIR"]),
            channels=channels,
            num_nodes=_int(env, "NUM_NODES", 1),
            node_rank=_int(env, "NODE_RANK", 0),
            main_addr=env.get(f"{PREFIX}MAIN_ADDR", "127.0.0.1"),
            main_port=_int(env, "MAIN_PORT", 29500),
            gpus_per_node=_int(env, "GPUS_PER_NODE", 0),
            source="distrain",
        )

    @property
    def failure_file(self) -> Path:
        """Where a failed job leaves its one-line reason (SageMaker shows this one)."""
        if self.source == "sagemaker":
            return self.output_dir.parent / "failure"
        return self.output_dir / "failure"

    def to_env(self) -> dict[str, str]:
        """The `DISTRAIN_*` variables that describe this contract (what backends write)."""
        env = {
            f"{PREFIX}MODEL_DIR": str(self.model_dir),
            f"{PREFIX}OUTPUT_DIR": str(self.output_dir),
            f"{PREFIX}CHECKPOINT_DIR": str(self.checkpoint_dir),
            f"{PREFIX}NUM_NODES": str(self.num_nodes),
            f"{PREFIX}NODE_RANK": str(self.node_rank),
            f"{PREFIX}MAIN_ADDR": self.main_addr,
            f"{PREFIX}MAIN_PORT": str(self.main_port),
            f"{PREFIX}GPUS_PER_NODE": str(self.gpus_per_node),
        }
        for name, path in sorted(self.channels.items()):
            env[f"{PREFIX}CHANNEL_{name.upper()}"] = str(path)
        return env


def sagemaker_env_from_files(root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The SM_* description a SageMaker container gets from its config files.

    distrain-cloud's jobs run their own entrypoint (not the SageMaker training toolkit, which
    is what normally exports SM_*), so the same facts are read from /opt/ml/input/config.
    """
    config = root / "input" / "config"
    resource = json.loads((config / "resourceconfig.json").read_text())
    channels_file = config / "inputdataconfig.json"
    channels = sorted(json.loads(channels_file.read_text())) if channels_file.is_file() else []
    derived = {
        "SM_HOSTS": json.dumps(resource.get("hosts", [])),
        "SM_CURRENT_HOST": resource.get("current_host", "algo-1"),
        "SM_MODEL_DIR": str(root / "model"),
        "SM_OUTPUT_DATA_DIR": str(root / "output" / "data"),
        "SM_CHANNELS": json.dumps(channels),
        f"{PREFIX}CHECKPOINT_DIR": str(root / "checkpoints"),
        **{f"SM_CHANNEL_{c.upper()}": str(root / "input" / "data" / c) for c in channels},
    }
    return {**derived, **env}


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(PREFIX + key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{PREFIX}{key} must be an integer, got {raw!r}") from None


def free_port() -> int:
    """A free local TCP port for a rendezvous: several local jobs at once must not fight over
    torch.distributed's default one."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
