"""The container contract: what every job sees, whichever backend started it.

Folders (data channels, model, output, checkpoints) and the cluster shape (nodes, this
node's rank, main node address and port, GPUs per node). SageMaker describes them with
`SM_*` variables; the EC2 node agent and the local backend write the `DISTRAIN_*`
variables below. SageMaker's win when both are present. Where no `DISTRAIN_*` variable names
the shape, those of SkyPilot, dstack, AWS Batch multi-node jobs and torchrun-style launchers
(Kubeflow PyTorchJob and TrainJob, torchrun) do, so the same entry point runs under those
engines (docs/portability.md); an engine that says several nodes but not how to reach them is
refused, never run as one node. Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "DISTRAIN_"
# The exit code of a job stopped on request (128 + SIGTERM) after saving its state: the trainer
# exits with it, the node launcher reports it, backends read it as "stopped", not "failed".
STOP_EXIT_CODE = 143
# The same stop asked for with Ctrl-C (128 + SIGINT): also "stopped", with a checkpoint.
INTERRUPT_EXIT_CODE = 130
STOP_EXIT_CODES = frozenset({STOP_EXIT_CODE, INTERRUPT_EXIT_CODE})
# A SIGINT this long after the first stop signal is the user's second Ctrl-C (which ends the job
# at once), not a copy of the first relayed by a launcher in between or sent to the whole group.
SECOND_INTERRUPT_S = 1.0
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
    # who described the shape: "sagemaker", "distrain", "skypilot", "dstack", "aws-batch", "torchrun" or "default"
    source: str = "default"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Contract:
        env = os.environ if env is None else env
        if "SM_MODEL_DIR" in env or "SM_TRAINING_ENV" in env:
            return cls._from_sagemaker(env)
        sm_root = Path(env.get(f"{PREFIX}SAGEMAKER_ROOT", "/opt/ml"))
        if (sm_root / "input/config/resourceconfig.json").is_file():
            return cls._from_sagemaker(sagemaker_env_from_files(sm_root, env))
        names_shape = any(f"{PREFIX}{k}" in env for k in ("NUM_NODES", "NODE_RANK", "MAIN_ADDR"))
        shape = None if names_shape else engine_shape(env)
        if f"{PREFIX}MODEL_DIR" in env:
            contract = cls._from_distrain(env)
            # Folders of ours with an engine's cluster (a SkyPilot task that sets DISTRAIN_MODEL_DIR).
            return contract if shape is None else dataclasses.replace(contract, **shape)
        here = Path.cwd()
        return cls(
            model_dir=here / "model",
            output_dir=here / "output",
            checkpoint_dir=here / "checkpoints",
            **(shape or {}),
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

    def use_compile_cache(self) -> None:
        """Inductor's caches (FX graphs, AOT autograd graphs, Triton kernels) beside the checkpoints,
        which every backend keeps for a lineage (S3 for cloud jobs), so a resumed job (a spot restart
        on another machine) loads its kernels instead of compiling them again. A cache the user chose
        wins. Call it before torch's compile machinery is imported: importing it fixes the default
        folder in TORCHINDUCTOR_CACHE_DIR."""
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.checkpoint_dir / "compile-cache"))

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


def engine_shape(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The cluster shape another engine describes (SkyPilot, dstack, AWS Batch, then torchrun-style
    variables: Kubeflow's PyTorchJob and Trainer v2 TrainJob, torchrun itself), as Contract fields,
    or None when none of them does.

    An engine whose variables say several nodes but leave out what a node needs to find the others
    (the main node's address, its own rank), or contradict one another, is refused with a
    ValueError naming the variables: trained alone, each node would write the same checkpoints.
    docs/portability.md cites where each engine sets them."""
    for read in (_skypilot_shape, _dstack_shape, _aws_batch_shape, _torchrun_shape):
        shape = read(env)
        if shape is not None:
            return shape
    return None


def _incomplete(engine: str, says: str, missing: Sequence[str]) -> ValueError:
    names = " and ".join(missing)
    verb = "is" if len(missing) == 1 else "are"
    return ValueError(
        f"{engine}: {says}, but {names} {verb} not set: refusing to train this node alone (every node "
        "would write the same checkpoints); set them, or run one node"
    )


def _lines(env: Mapping[str, str], key: str) -> list[str]:
    return [line.strip() for line in env.get(key, "").splitlines() if line.strip()]


def _counted(env: Mapping[str, str], engine: str, nodes_var: str, ips_var: str) -> tuple[int, list[str]]:
    """The node count an engine gives in `nodes_var`, else by its IP list; both given must agree."""
    ips = _lines(env, ips_var)
    nodes = _env_int(env, nodes_var, len(ips) or 1)
    if ips and env.get(nodes_var, "").strip() and len(ips) != nodes:
        raise ValueError(
            f"{engine}: {nodes_var}={nodes} contradicts {ips_var}, which lists {len(ips)} nodes: "
            "refusing to guess the cluster"
        )
    return nodes, ips


def _skypilot_shape(env: Mapping[str, str]) -> dict[str, Any] | None:
    # SkyPilot runs the task's `run` once per node with these; SKYPILOT_NODE_IPS lists the
    # nodes one per line, rank 0's first.
    if not any(k in env for k in ("SKYPILOT_NODE_RANK", "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_IPS")):
        return None
    nodes, ips = _counted(env, "SkyPilot", "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_IPS")
    if nodes > 1:
        missing = [k for k in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS") if not env.get(k, "").strip()]
        if missing:
            raise _incomplete("SkyPilot", f"SKYPILOT_NUM_NODES={nodes}", missing)
    return _shape(
        "skypilot",
        nodes,
        _env_int(env, "SKYPILOT_NODE_RANK", 0),
        "SKYPILOT_NODE_RANK",
        ips[0] if ips else "127.0.0.1",
        _port(env),
        _env_int(env, "SKYPILOT_NUM_GPUS_PER_NODE", 0),
    )


def _dstack_shape(env: Mapping[str, str]) -> dict[str, Any] | None:
    # dstack's runner gives every node of a task these (its executor's job environment).
    keys = ("DSTACK_NODE_RANK", "DSTACK_NODES_NUM", "DSTACK_MASTER_NODE_IP", "DSTACK_NODES_IPS")
    if not any(k in env for k in keys):
        return None
    nodes, ips = _counted(env, "dstack", "DSTACK_NODES_NUM", "DSTACK_NODES_IPS")
    addr = env.get("DSTACK_MASTER_NODE_IP", "").strip()
    if nodes > 1:
        missing = [k for k in ("DSTACK_NODE_RANK", "DSTACK_MASTER_NODE_IP") if not env.get(k, "").strip()]
        if missing:
            raise _incomplete("dstack", f"{nodes} nodes (DSTACK_NODES_NUM or DSTACK_NODES_IPS)", missing)
    rank = _env_int(env, "DSTACK_NODE_RANK", 0)
    gpus = _env_int(env, "DSTACK_GPUS_PER_NODE", 0)
    return _shape("dstack", nodes, rank, "DSTACK_NODE_RANK", addr or "127.0.0.1", _port(env), gpus)


def _aws_batch_shape(env: Mapping[str, str]) -> dict[str, Any] | None:
    # A multi-node parallel job: the main node (not always index 0) must be rank 0, where torchrun
    # keeps its rendezvous store. Batch gives the main node's address to the other nodes only;
    # the main node serves the store itself, so its own loopback address reaches it.
    if "AWS_BATCH_JOB_NUM_NODES" not in env:
        return None
    nodes = _env_int(env, "AWS_BATCH_JOB_NUM_NODES", 1)
    index = _env_int(env, "AWS_BATCH_JOB_NODE_INDEX", 0)
    if not 0 <= index < max(nodes, 1):
        raise ValueError(f"AWS_BATCH_JOB_NODE_INDEX={index} is not a node index of {nodes} nodes")
    says = f"AWS_BATCH_JOB_NUM_NODES={nodes}"
    if nodes > 1:
        missing = [k for k in ("AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_MAIN_NODE_INDEX") if k not in env]
        if missing:
            raise _incomplete("AWS Batch", says, missing)
    main = _env_int(env, "AWS_BATCH_JOB_MAIN_NODE_INDEX", 0)
    rank = (index - main) % nodes if nodes > 0 else 0
    addr = env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS") or ""
    if nodes > 1 and rank != 0 and not addr:
        missing = ["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]
        raise _incomplete("AWS Batch", f"{says} and this is not the main node", missing)
    return _shape("aws-batch", nodes, rank, "AWS_BATCH_JOB_NODE_INDEX", addr or "127.0.0.1", _port(env), 0)


# Any of these says a torchrun-style engine started this process: torchrun itself, a Kubeflow
# PyTorchJob (MASTER_ADDR, RANK, WORLD_SIZE and, from training-operator 1.9, the PET_* twins),
# a Kubeflow Trainer v2 TrainJob (the PET_* variables alone) or an elastic PyTorchJob
# (PET_RDZV_ENDPOINT and PET_NNODES, no MASTER_ADDR).
_TORCH_KEYS = ("MASTER_ADDR", "PET_MASTER_ADDR", "PET_NNODES", "PET_NODE_RANK", "PET_RDZV_ENDPOINT")


def _torchrun_shape(env: Mapping[str, str]) -> dict[str, Any] | None:
    # torchrun-style variables, as a per-node launcher (a PyTorchJob or TrainJob pod, a Slurm script)
    # or torchrun itself sets them. Per-node launchers count nodes in WORLD_SIZE and give the node's
    # index in RANK; inside torchrun's workers (LOCAL_RANK set) those count processes instead, and
    # the group already formed: nothing there is refused.
    if not any(k in env for k in _TORCH_KEYS):
        return None
    in_worker = "LOCAL_RANK" in env
    engine = _torch_engine(env)
    addr_var = next((v for v in ("MASTER_ADDR", "PET_MASTER_ADDR") if env.get(v, "").strip()), None)
    rank_var = next((v for v in ("NODE_RANK", "GROUP_RANK", "PET_NODE_RANK") if v in env), None)
    if rank_var is None and not in_worker and "RANK" in env and addr_var == "MASTER_ADDR":
        rank_var = "RANK"
    counts = {v: env[v] for v in ("NNODES", "PET_NNODES", "GROUP_WORLD_SIZE") if env.get(v, "").strip()}
    nodes_var = next(iter(counts), None)
    if nodes_var is not None:
        nodes = _node_count(engine, nodes_var, counts[nodes_var], in_worker)
        for other, raw in counts.items():
            if not in_worker and _node_count(engine, other, raw, in_worker) != nodes:
                raise ValueError(f"{engine}: {nodes_var}={counts[nodes_var]} contradicts {other}={raw}")
    elif in_worker and "WORLD_SIZE" in env:
        nodes = _env_int(env, "WORLD_SIZE", 1) // max(1, _env_int(env, "LOCAL_WORLD_SIZE", 1))
    elif addr_var == "MASTER_ADDR":
        nodes = _env_int(env, "WORLD_SIZE", 1)
    else:
        nodes = 1
    rank = _env_int(env, rank_var, 0) if rank_var else 0
    if not in_worker:
        if nodes > 1 or "PET_RDZV_ENDPOINT" in env:
            _refuse_incomplete_torch(env, engine, nodes, nodes_var, addr_var, rank_var)
        pod_rank = _env_int(env, "RANK", rank) if addr_var == "MASTER_ADDR" else rank
        if rank_var == "PET_NODE_RANK" and pod_rank != rank:  # a PyTorchJob gives the pod's index in both
            raise ValueError(f"{engine}: {rank_var}={rank} contradicts RANK={pod_rank} (both name this node)")
    addr = env[addr_var].strip() if addr_var else "127.0.0.1"
    return _shape("torchrun", nodes, rank, rank_var or "NODE_RANK", addr, _port(env), 0)


def _torch_engine(env: Mapping[str, str]) -> str:
    """Which torchrun-style engine the variables look like, for the refusal's first words."""
    if "PET_RDZV_ENDPOINT" in env:
        return "elastic PyTorchJob (PET_RDZV_ENDPOINT)"
    if "PET_NNODES" in env and not any(k in env for k in ("MASTER_ADDR", "WORLD_SIZE", "RANK")):
        return "Kubeflow Trainer (PET_* variables)"
    return "torchrun-style variables"


def _node_count(engine: str, var: str, raw: str, in_worker: bool) -> int:
    # torchrun's elastic form MIN:MAX. Equal bounds are a static job's count. Unequal ones let the
    # job start with any number of nodes between them, each ranked by torchrun's rendezvous, while
    # this launcher's static rendezvous needs one fixed count and this node's rank.
    low, sep, high = raw.partition(":")
    count = _parse_int(var, high if sep else low)
    if sep and not in_worker and _parse_int(var, low) != count:
        raise ValueError(
            f"{engine}: {var}={raw} asks for an elastic node count; distrain-cloud's node launcher needs a "
            f"fixed one (run a PyTorchJob without elasticPolicy, as `distrain-cloud export pytorchjob` writes)"
        )
    return count


def _refuse_incomplete_torch(
    env: Mapping[str, str], engine: str, nodes: int, nodes_var: str | None, addr_var: str | None, rank_var: str | None
) -> None:
    missing = []
    if addr_var is None:
        pod = any(k in env for k in ("WORLD_SIZE", "RANK")) or "PET_NNODES" not in env  # a PyTorchJob's, torchrun's
        missing.append("MASTER_ADDR" if pod else "PET_MASTER_ADDR")
    if rank_var is None:
        missing.append("PET_NODE_RANK" if "PET_NNODES" in env else "NODE_RANK (or RANK)")
    if not missing:
        return
    says = f"{nodes_var}={env[nodes_var]}" if nodes_var else f"WORLD_SIZE={env.get('WORLD_SIZE', nodes)}"
    if "PET_RDZV_ENDPOINT" in env:
        says += f" and PET_RDZV_ENDPOINT={env['PET_RDZV_ENDPOINT']} (torchrun's c10d rendezvous ranks the nodes)"
    raise _incomplete(engine, says, missing)


def _shape(source: str, nodes: int, rank: int, rank_var: str, addr: str, port: int, gpus: int) -> dict[str, Any]:
    if nodes < 1:
        raise ValueError(f"{source} describes {nodes} nodes: the cluster needs at least one")
    if not 0 <= rank < nodes:
        raise ValueError(f"{rank_var}={rank} is not a node rank of a {nodes}-node cluster (ranks count from 0)")
    return {
        "num_nodes": nodes,
        "node_rank": rank,
        "main_addr": addr,
        "main_port": port,
        "gpus_per_node": gpus,
        "source": source,
    }


def _port(env: Mapping[str, str]) -> int:
    for key in ("MASTER_PORT", "PET_MASTER_PORT"):
        if env.get(key, "").strip():
            return _env_int(env, key, 29500)
    return _int(env, "MAIN_PORT", 29500)


def _env_int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    return default if raw is None or raw.strip() == "" else _parse_int(key, raw)


def _parse_int(key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from None


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
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
