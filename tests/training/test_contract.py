"""The container contract read from other engines' variables (training/contract.py): SkyPilot, AWS
Batch multi-node jobs and torchrun-style launchers give the cluster shape when DISTRAIN_* does not."""

from __future__ import annotations

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
    # Explicit node variables win; NNODES may be torchrun's elastic MIN:MAX.
    assert shape({**pod, "NODE_RANK": "0", "NNODES": "1:4"})[1:3] == (4, 0)
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
