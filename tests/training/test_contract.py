"""The container contract read from other engines' variables (training/contract.py): SkyPilot, dstack,
AWS Batch multi-node jobs and torchrun-style launchers (Kubeflow PyTorchJob and TrainJob, torchrun)
give the cluster shape when DISTRAIN_* does not; an engine that says several nodes without saying how
to reach them is refused in one line, through the entry points a pod starts, never run as one node.

Each engine's complete environment below is the one its source sets (docs/portability.md cites the
files and versions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distrain_cloud.training.contract import Contract

DIRS = {"DISTRAIN_MODEL_DIR": "/job/model", "DISTRAIN_OUTPUT_DIR": "/job/out", "DISTRAIN_CHECKPOINT_DIR": "/job/ckpt"}


def shape(env: dict[str, str]) -> tuple:
    c = Contract.from_env({"DISTRAIN_SAGEMAKER_ROOT": "/nonexistent", **env})
    return c.source, c.num_nodes, c.node_rank, c.main_addr, c.main_port, c.gpus_per_node


def test_skypilot():
    env = {
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "4",
    }
    assert shape(env) == ("skypilot", 2, 1, "10.0.0.5", 29500, 4)
    # Without SKYPILOT_NUM_NODES the IP list counts the nodes.
    assert shape({k: v for k, v in env.items() if k != "SKYPILOT_NUM_NODES"})[1] == 2


def test_aws_batch_multi_node():
    child = {
        "AWS_BATCH_JOB_NUM_NODES": "3",
        "AWS_BATCH_JOB_NODE_INDEX": "2",
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.1.0.9",
    }
    assert shape(child) == ("aws-batch", 3, 2, "10.1.0.9", 29500, 0)
    # Batch gives the main node no address of its own: it serves the rendezvous itself.
    main = {"AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0"}
    assert shape(main) == ("aws-batch", 3, 0, "127.0.0.1", 29500, 0)
    # A main node that is not index 0 still gets rank 0 (torchrun keeps its store there).
    moved = {**child, "AWS_BATCH_JOB_MAIN_NODE_INDEX": "2"}
    assert shape(moved)[2] == 0
    assert shape({**moved, "AWS_BATCH_JOB_NODE_INDEX": "0"})[2] == 1


def test_torchrun_style_per_node_launcher():
    # A Kubernetes PyTorchJob pod (one per node): WORLD_SIZE counts pods, RANK is the pod's index.
    pod = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
    assert shape(pod) == ("torchrun", 2, 1, "job-master-0", 23456, 0)
    # Explicit node variables win; NNODES may be torchrun's MIN:MAX form, a fixed count when equal.
    assert shape({**pod, "NODE_RANK": "0", "NNODES": "4:4"})[1:3] == (4, 0)
    assert shape({"MASTER_ADDR": "h", "PET_NNODES": "3", "PET_NODE_RANK": "2"})[1:3] == (3, 2)


def test_torchrun_workers_count_nodes_not_processes():
    # Inside torchrun's workers WORLD_SIZE and RANK count processes; GROUP_RANK is the node.
    worker = {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "RANK": "5",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
    }
    assert shape(worker) == ("torchrun", 2, 1, "10.0.0.1", 29400, 0)
    assert shape({**worker, "GROUP_WORLD_SIZE": "2"})[1] == 2


def test_our_variables_win_and_folders_combine_with_an_engines_shape():
    ours = {**DIRS, "DISTRAIN_NUM_NODES": "1", "DISTRAIN_NODE_RANK": "0", "DISTRAIN_MAIN_ADDR": "127.0.0.1"}
    sky = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6"}
    assert shape({**ours, **sky})[:3] == ("distrain", 1, 0)
    c = Contract.from_env({**DIRS, **sky})  # folders of ours, the cluster SkyPilot's
    assert (c.model_dir, c.checkpoint_dir, c.source, c.num_nodes, c.node_rank) == (
        Path("/job/model"),
        Path("/job/ckpt"),
        "skypilot",
        2,
        1,
    )
    # Nothing set: one node, folders under the current directory.
    assert shape({}) == ("default", 1, 0, "127.0.0.1", 29500, 0)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SKYPILOT_NODE_RANK": "x"}, "SKYPILOT_NODE_RANK must be an integer, got 'x'"),
        (
            {"SKYPILOT_NODE_RANK": "2", "SKYPILOT_NODE_IPS": "a\nb"},
            "SKYPILOT_NODE_RANK=2 is not a node rank of a 2-node",
        ),
        ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "5"}, "AWS_BATCH_JOB_NODE_INDEX=5 is not a node"),
        ({"MASTER_ADDR": "h", "WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 is not a node rank of a 2-node cluster"),
        ({"MASTER_ADDR": "h", "MASTER_PORT": "http"}, "MASTER_PORT must be an integer, got 'http'"),
    ],
)
def test_bad_engine_variables_are_one_line_naming_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        Contract.from_env({"DISTRAIN_SAGEMAKER_ROOT": "/nonexistent", **env})


# Kubeflow Trainer v2 (the Torch plugin): the PET_* variables alone, for torchrun to read.
TRAINJOB_POD = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "job-node-0-0.job",
    "PET_MASTER_PORT": "29500",
}
# Kubeflow training-operator 1.9 PyTorchJob, Master + 1 Worker, nprocPerNode 4: WORLD_SIZE counts
# processes there, RANK and PET_NODE_RANK the pod.
PYTORCHJOB_WORKER = {
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_ADDR": "job-master-0",
    "PET_MASTER_PORT": "23456",
    "WORLD_SIZE": "8",
    "RANK": "1",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "4",
    "PET_NNODES": "2",
}
# An elastic PyTorchJob (elasticPolicy, Worker replicas only): no MASTER_ADDR, no rank.
ELASTIC_WORKER = {
    "PET_RDZV_ENDPOINT": "job-worker-0:23456",
    "PET_RDZV_BACKEND": "c10d",
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
}
DSTACK_NODE = {
    "DSTACK_NODES_IPS": "10.0.0.5\n10.0.0.6",
    "DSTACK_MASTER_NODE_IP": "10.0.0.5",
    "DSTACK_NODE_RANK": "1",
    "DSTACK_NODES_NUM": "2",
    "DSTACK_GPUS_PER_NODE": "8",
    "DSTACK_GPUS_NUM": "16",
}
SKYPILOT_NODE = {
    "SKYPILOT_NODE_RANK": "1",
    "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NUM_GPUS_PER_NODE": "4",
}
BATCH_CHILD = {
    "AWS_BATCH_JOB_NUM_NODES": "2",
    "AWS_BATCH_JOB_NODE_INDEX": "1",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.1.0.9",
}


def without(env: dict[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in keys}


def test_complete_contracts_of_kubeflow_and_dstack():
    assert shape(TRAINJOB_POD) == ("torchrun", 2, 1, "job-node-0-0.job", 29500, 0)
    assert shape(PYTORCHJOB_WORKER) == ("torchrun", 2, 1, "job-master-0", 23456, 0)
    # An older operator (before 1.9): no PET_* twins, WORLD_SIZE counts pods.
    old = without(PYTORCHJOB_WORKER, "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NODE_RANK", "PET_NNODES")
    assert shape({**old, "WORLD_SIZE": "2"}) == ("torchrun", 2, 1, "job-master-0", 23456, 0)
    assert shape(DSTACK_NODE) == ("dstack", 2, 1, "10.0.0.5", 29500, 8)
    # One node of each: nothing to reach, nothing missing.
    assert shape({"PET_NNODES": "1", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "0"})[:3] == ("torchrun", 1, 0)
    assert shape({"DSTACK_NODES_NUM": "1", "DSTACK_NODE_RANK": "0", "DSTACK_NODES_IPS": "10.0.0.5"})[:3] == (
        "dstack",
        1,
        0,
    )


def test_inside_torchruns_workers_the_pods_variables_agree():
    # A TrainJob pod's node_launch started torchrun, which adds these to each worker: nothing refused.
    worker = {**TRAINJOB_POD, "MASTER_ADDR": "10.2.0.7", "MASTER_PORT": "29500", "LOCAL_RANK": "3"}
    worker |= {"RANK": "7", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}
    assert shape(worker)[:3] == ("torchrun", 2, 1)


PARTIAL = [
    pytest.param(
        without(TRAINJOB_POD, "PET_MASTER_ADDR", "PET_NODE_RANK"),
        "Kubeflow Trainer (PET_* variables): PET_NNODES=2, but PET_MASTER_ADDR and PET_NODE_RANK are not set",
        id="trainjob",
    ),
    pytest.param(
        without(PYTORCHJOB_WORKER, "MASTER_ADDR", "PET_MASTER_ADDR"),
        "torchrun-style variables: PET_NNODES=2, but MASTER_ADDR is not set",
        id="pytorchjob",
    ),
    pytest.param(
        ELASTIC_WORKER,
        "elastic PyTorchJob (PET_RDZV_ENDPOINT): PET_NNODES=2 and PET_RDZV_ENDPOINT=job-worker-0:23456 "
        "(torchrun's c10d rendezvous ranks the nodes), but PET_MASTER_ADDR and PET_NODE_RANK are not set",
        id="elastic-pytorchjob",
    ),
    pytest.param(
        {**ELASTIC_WORKER, "PET_NNODES": "1:4"},
        "elastic PyTorchJob (PET_RDZV_ENDPOINT): PET_NNODES=1:4 asks for an elastic node count",
        id="elastic-range",
    ),
    pytest.param(
        without(DSTACK_NODE, "DSTACK_MASTER_NODE_IP"),
        "dstack: 2 nodes (DSTACK_NODES_NUM or DSTACK_NODES_IPS), but DSTACK_MASTER_NODE_IP is not set",
        id="dstack",
    ),
    pytest.param(
        {**DSTACK_NODE, "DSTACK_NODES_NUM": "3"},
        "dstack: DSTACK_NODES_NUM=3 contradicts DSTACK_NODES_IPS, which lists 2 nodes",
        id="dstack-contradiction",
    ),
    pytest.param(
        {"SKYPILOT_NUM_NODES": "2"},
        "SkyPilot: SKYPILOT_NUM_NODES=2, but SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS are not set",
        id="skypilot",
    ),
    pytest.param(
        without(BATCH_CHILD, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
        "AWS Batch: AWS_BATCH_JOB_NUM_NODES=2 and this is not the main node, but "
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set",
        id="aws-batch",
    ),
    pytest.param(
        {**PYTORCHJOB_WORKER, "PET_NODE_RANK": "0"},
        "torchrun-style variables: PET_NODE_RANK=0 contradicts RANK=1 (both name this node)",
        id="pytorchjob-contradiction",
    ),
]


@pytest.mark.parametrize("env, message", PARTIAL)
def test_partial_or_contradictory_engine_variables_are_refused_by_the_pods_entry_points(
    env, message, monkeypatch, tmp_path, capsys
):
    """The way a pod starts it: node_launch (what `export` writes), or the training entry point
    itself. Exit 2, one line on every node (RANK, which picks the printing process elsewhere, is the
    engine's here), nothing written, nothing trained."""
    from distrain_cloud.training import node_launch
    from distrain_cloud.training.__main__ import main as train_main

    for key in [k for k in os.environ if k.startswith(STRIPPED_PREFIXES) or k in STRIPPED]:
        monkeypatch.delenv(key)
    for key, value in {"DISTRAIN_SAGEMAKER_ROOT": "/nonexistent", **env}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    for start in (lambda: node_launch.main(["--", "--not-a-flag"]), lambda: train_main(["--not-a-flag"])):
        with pytest.raises(SystemExit) as exit_:
            start()
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.splitlines() == [f"error: {err.removeprefix('error: ').strip()}"], err
        assert err.startswith(f"error: {message}"), err
    assert list(tmp_path.iterdir()) == []


STRIPPED_PREFIXES = ("DISTRAIN_", "SM_", "SKYPILOT_", "DSTACK_", "AWS_BATCH_", "PET_", "TORCHELASTIC_")
STRIPPED = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}
STRIPPED |= {"NODE_RANK", "NNODES", "GROUP_WORLD_SIZE"}
