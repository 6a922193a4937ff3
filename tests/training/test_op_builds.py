"""DeepSpeed compiles native ops on a machine's first ZeRO run (about a minute each, silent): the
trainer says so before, and only while they are not built. Cheap to know: torch's extension folder."""

from __future__ import annotations

import pytest

from distrain_cloud.training.args import parse_args
from distrain_cloud.training.decisions import decide
from distrain_cloud.training.engines import engine_for
from distrain_cloud.training.trainer import _say_op_builds

pytest.importorskip("deepspeed")


def engine(strategy: str):
    args = parse_args(["--strategy", strategy, "--precision", "no", "--report-to", "none"])
    return engine_for(decide(args, world=1, cuda=False), lambda line: None)


def test_the_ops_to_build_are_named_until_they_are_built(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # a fresh machine's empty extension cache
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert engine("zero2").ops_to_build() == ["deepspeed_shm_comm"]
    assert engine("zero3-offload").ops_to_build() == ["deepspeed_shm_comm", "cpu_adam"]
    assert engine("ddp").ops_to_build() == []  # not DeepSpeed: nothing to build
    # Built by an earlier run: torch's JIT left the library in its folder, which loads in a second.
    for name in ("deepspeed_shm_comm", "cpu_adam"):
        (folder,) = [p for p in tmp_path.rglob(name) if p.is_dir()]
        (folder / f"{name}.so").write_bytes(b"")
    assert engine("zero3-offload").ops_to_build() == []


def test_the_build_is_said_once_by_the_first_process(capsys, monkeypatch):
    _say_op_builds(["deepspeed_shm_comm"])
    assert capsys.readouterr().out == (
        "setup: DeepSpeed compiles its deepspeed_shm_comm op for this machine first (a minute or more each, "
        "once: later runs load them)\n"
    )
    monkeypatch.setenv("RANK", "1")
    _say_op_builds(["deepspeed_shm_comm", "cpu_adam"])
    _say_op_builds([])
    assert capsys.readouterr().out == ""
