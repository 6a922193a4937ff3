"""How node_launch reports the end of its training processes: a process a signal killed (the
out-of-memory killer) is one line naming the signal, its likely cause and the resume command;
a run that finished is completed whatever its launcher exits with. Stand-in launchers, run in
this process; the real CLI with a killed trainer: test_local_backend.py."""

from __future__ import annotations

import sys

import pytest

from distrain_cloud.training.node_launch import COMPLETED_FILE_ENV, _run_forwarding_signals

# How torchrun's agent reports a training process the out-of-memory killer ended, then exits 1
# (its traceback and ChildFailedError table, shortened), and one process that node_launch started
# directly, killed.
TORCHRUN_REPORT = """Traceback (most recent call last):
  File "torch/distributed/run.py", line 892, in main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
  exitcode  : -9 (pid: 23508)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 23508
"""
TORCHRUN_KILLED = f"import sys; sys.stderr.write({TORCHRUN_REPORT!r}); sys.exit(1)"
DIRECT_KILLED = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@pytest.mark.parametrize(("child", "direct"), [(TORCHRUN_KILLED, False), (DIRECT_KILLED, True)])
def test_a_training_process_killed_by_sigkill_is_one_line_with_its_cause_and_the_resume_command(
    tmp_path, capsys, monkeypatch, child, direct
):
    monkeypatch.setenv("DISTRAIN_JOB_NAME", "job-7")
    failure = tmp_path / "output" / "failure"
    code = _run_forwarding_signals([sys.executable, "-c", child], {}, failure, 5.0, direct=direct)
    err = capsys.readouterr().err
    line = (
        "error: a training process was killed by SIGKILL: likely the out-of-memory killer (the machine ran out of "
        "memory: a smaller --batch-size or --block-size, or fewer --processes, needs less); resume from "
        "the last checkpoint with `distrain-cloud resume job-7`"
    )
    assert (code, err) == (137, line + "\n")  # no traceback, no "exit code 1"
    assert failure.read_text() == line + "\n"  # what `status` shows


def test_a_run_that_finished_is_completed_whatever_its_launcher_exits_with(tmp_path, capsys):
    # The trainer wrote its marker; then its launcher was killed (exit 247 once, a failed job).
    # (The trainer writes it where node_launch's COMPLETED_FILE_ENV says: training/__main__.py.)
    completed = tmp_path / "launch.completed"
    launcher = f"import os; open(os.environ[{COMPLETED_FILE_ENV!r}], 'w').write('completed'); os.kill(os.getpid(), 9)"
    env = {COMPLETED_FILE_ENV: str(completed)}
    code = _run_forwarding_signals(
        [sys.executable, "-c", launcher], env, tmp_path / "failure", 5.0, completed=completed
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert err == (
        "node_launch: the run finished (every step, its model saved), then its launcher ended (killed by SIGKILL): "
        "the job completed\n"
    )
    # Without the marker, the same end is a failure that names the signal.
    completed.unlink()
    launcher = "import os; os.kill(os.getpid(), 9)"
    code = _run_forwarding_signals([sys.executable, "-c", launcher], {}, tmp_path / "failure", 5.0, completed=completed)
    assert code == 137 and "killed by SIGKILL" in capsys.readouterr().err


def test_gpus_are_counted_without_torch_where_the_machine_has_no_nvidia_device(monkeypatch):
    """torch costs node_launch seconds to import on every launch, for one number: where Linux
    shows no NVIDIA device node the count is 0 without it; where it shows one, torch counts."""
    import glob
    import types

    from distrain_cloud.training import node_launch

    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: 3))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(node_launch.os.path, "exists", lambda path: False)
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    assert node_launch._count_gpus() == 0
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/nvidia0"] if pattern.startswith("/dev/nvidia") else [])
    assert node_launch._count_gpus() == 3
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # a run told to stay on the CPU
    assert node_launch._count_gpus() == 0


def test_one_plain_process_starts_directly_with_the_variables_accelerate_launch_would_set(tmp_path):
    """accelerate launch's simple launcher (one process, one machine, no engine of its own) only
    sets variables and waits, after ~2 s of imports: node_launch starts the trainer itself, with
    exactly what that launcher's own code (accelerate's installed version) sets for the config.
    Anything else still goes through accelerate launch."""
    import os
    from pathlib import Path

    import yaml
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    from distrain_cloud.training.contract import Contract
    from distrain_cloud.training.node_launch import _threads_per_process, plan_node

    contract = Contract(model_dir=tmp_path / "m", output_dir=tmp_path / "o", checkpoint_dir=tmp_path / "c")
    for argv, gpus in [([], 0), (["--precision", "bf16"], 1), (["--precision", "fp16"], 1)]:
        launch = plan_node(argv, contract, gpus=gpus)
        assert launch.command == [sys.executable, "-m", "distrain_cloud.training", *argv]
        config = Path(tmp_path / "config.yaml")
        config.write_text(yaml.safe_dump(launch.config))
        threads = str(_threads_per_process(launch.config))
        parsed = launch_command_parser().parse_args(
            ["--config_file", str(config), "--num_cpu_threads_per_process", threads, "-m", "distrain_cloud.training"]
        )
        command, env = prepare_simple_launcher_cmd_env(_validate_launch_command(parsed)[0])
        assert {k: v for k, v in env.items() if os.environ.get(k) != v} == launch.env, argv
        assert command == launch.command[: len(command)]
    for argv, gpus in [(["--processes", "2"], 0), (["--strategy", "zero2"], 0), (["--strategy", "fsdp"], 1)]:
        processes = 2 if "--processes" in argv else None
        launch = plan_node([a for a in argv if a not in ("--processes", "2")], contract, processes=processes, gpus=gpus)
        assert "accelerate.commands.launch" in launch.command, argv
