"""The entry point alone (how SkyPilot, torchrun, Batch and Kubernetes start it) trains in the
precision the launcher would pick: bf16 on compute capability >= 8.0, fp16 below, fp32 on CPU.
The GPUs are faked by replacing torch's capability query."""

from __future__ import annotations

import pytest
import torch

from distrain_cloud.training.args import parse_args
from distrain_cloud.training.contract import Contract
from distrain_cloud.training.node_launch import plan_node
from distrain_cloud.training.precision import resolve_precision
from distrain_cloud.training.strategies import choose_precision

H100, A10G, V100 = (9, 0), (8, 6), (7, 0)


def contract(tmp_path, gpus: int = 0) -> Contract:
    return Contract(tmp_path / "model", tmp_path / "output", tmp_path / "checkpoints", gpus_per_node=gpus)


@pytest.fixture
def gpus(monkeypatch):
    """gpus(cap, cap, ...): CUDA devices of those compute capabilities; gpus() none."""
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)

    def fake(*caps: tuple[int, int]) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(caps))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i])

    return fake


@pytest.mark.parametrize(
    "caps, chosen, why",
    [
        ((H100,), "bf16", "default on compute capability 9.0 >= 8.0"),
        ((A10G, A10G), "bf16", "default on compute capability 8.6 >= 8.0"),
        ((V100,), "fp16", "default on compute capability 7.0 < 8.0"),
        ((H100, V100), "fp16", "default on compute capability 7.0 < 8.0"),  # the lowest decides
        ((), "no", "default on no CUDA GPU: fp32"),
    ],
)
def test_without_precision_the_entry_point_picks_what_the_launcher_would(gpus, caps, chosen, why):
    gpus(*caps)
    args = parse_args(["--task", "causal-lm"])
    line = resolve_precision(args)
    assert args.precision == chosen
    assert line == f"precision={chosen} ({why}, as the launcher picks; --precision to choose)"
    # the launcher's own rule, not a copy of it
    capability = min(caps) if caps else None
    assert choose_precision(None, len(caps), capability, "here") == chosen


@pytest.mark.parametrize("requested", ["no", "fp16", "bf16"])
def test_a_given_precision_still_decides(gpus, requested):
    gpus(V100)
    args = parse_args(["--precision", requested])
    assert resolve_precision(args) == f"precision={requested} (--precision)"
    assert args.precision == requested


def test_cpu_processes_on_a_gpu_machine_train_in_fp32(gpus, monkeypatch):
    gpus(H100)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # node_launch's CPU processes
    args = parse_args([])
    assert resolve_precision(args).startswith("precision=no (default on no CUDA GPU")


def test_node_launch_renders_the_precision_its_processes_will_pick(gpus, tmp_path):
    gpus(H100, H100)
    launch = plan_node(["--task", "causal-lm"], contract(tmp_path, 2), gpus=2)
    assert launch.config["mixed_precision"] == "bf16"
    assert "--precision" not in launch.command  # each process picks (and logs) it itself
    gpus()
    assert plan_node([], contract(tmp_path), gpus=0).config["mixed_precision"] == "no"
    assert plan_node(["--precision", "fp16"], contract(tmp_path, 2), gpus=2).config["mixed_precision"] == "fp16"
