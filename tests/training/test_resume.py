"""Checkpoints and resume: a job killed at any step and started again ends exactly where an
uninterrupted one does; a checkpoint whose save was killed, or whose files no longer match
its manifest, is never loaded; SIGTERM saves and exits 143."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow

# Checkpoints every 2 steps, a loss per step, evaluations at steps 5, 10 and 12 (the end).
FLAGS = ["--max-steps", "12", "--save-every", "2", "--log-every", "1", "--eval-every", "5", "--report-to", "none"]
KILLED = (-9, 137)  # SIGKILL, seen directly or through a shell
# Resumed from checkpoints 2 and 8: a step past a save, before and after an evaluation. A kill right
# after a save (resumed from the kill step itself) is test_checkpoint_killed_mid_save_is_never_loaded's
# run killed after step 8, resumed from checkpoint 8 to the baseline's numbers.
KILL_STEPS = (3, 9)
# The last kill's batches come from 2 worker processes (--num-workers 2): resume skips batches there
# too. It stands for the same kill without workers as well, which the one before it shows in kind.
WORKERS_AT = 9


def last_per_step(records: list[dict], key: str) -> dict[int, dict]:
    """step -> the last record with `key` at that step (a resumed run logs some steps twice)."""
    out: dict[int, dict] = {}
    for r in records:
        if key in r:
            out[r["step"]] = {k: v for k, v in r.items() if k not in ("tokens_per_sec", "step_time", "data_wait_pct")}
    return out


def assert_same_result(run, baseline) -> None:
    """Bit-for-bit the same training: every step's loss, every evaluation, the final weights."""
    assert run.returncode == 0, run.describe()
    assert run.train_losses == baseline.train_losses  # exact, not approximate
    assert sorted(run.train_losses) == list(range(1, 13))
    assert last_per_step(run.metrics, "eval_loss") == last_per_step(baseline.metrics, "eval_loss")
    weights = "model.safetensors"
    assert (run.contract.model_dir / weights).read_bytes() == (baseline.contract.model_dir / weights).read_bytes()


def resumed_line(step: int) -> str:
    return f"resumed_from=checkpoint-{step:08d} step={step}"


@pytest.fixture(scope="module")
def baseline(module_train):
    run = module_train(*FLAGS, name="baseline")
    assert run.returncode == 0, run.describe()
    assert sorted(run.train_losses) == list(range(1, 13))
    assert [e["step"] for e in run.evals] == [5, 10, 12]
    assert run.lines("resumed_from=") == []
    # keep 2 by default: the last two checkpoints survive
    assert [p.name for p in run.contract.complete_checkpoints()] == ["checkpoint-00000010", "checkpoint-00000012"]
    return run


@pytest.fixture(scope="module")
def kill_and_resume(module_train, baseline):
    """For each kill step: (the killed run, the rerun), each in its own contract. Runs two at a time."""
    jobs = [
        {
            "flags": [*FLAGS, "--num-workers", "2"] if s == WORKERS_AT else FLAGS,
            "name": f"kill-{s}",
            "env": {"DISTRAIN_TEST_KILL_AT_STEP": str(s)},
        }
        for s in KILL_STEPS
    ]
    killed = module_train.many(jobs)
    # The same contract folders are reused by the rerun: note what the kill left behind.
    left = [[p.name for p in k.contract.complete_checkpoints()] for k in killed]
    resumed = module_train.many([{"flags": job["flags"], "name": job["name"]} for job in jobs])
    return {job["name"]: (k, ckpts, r) for job, k, ckpts, r in zip(jobs, killed, left, resumed, strict=True)}


# kill-9 (WORKERS_AT): worker processes change where batches are built, not what they hold.
@pytest.mark.parametrize("job, kill_step", [(f"kill-{s}", s) for s in KILL_STEPS])
def test_killed_run_resumes_exactly(kill_and_resume, baseline, job, kill_step):
    killed, left, resumed = kill_and_resume[job]
    assert killed.returncode in KILLED, killed.describe()
    # It died right after step `kill_step`, with the checkpoints of the steps before (keep 2).
    assert max(killed.train_losses) == kill_step
    last_saved = kill_step // 2 * 2
    assert left == [f"checkpoint-{s:08d}" for s in (last_saved - 2, last_saved) if s > 0]
    assert [e["step"] for e in killed.evals] == ([5] if kill_step >= 5 else [])
    # Started again, the same command resumes from the latest complete checkpoint ...
    assert resumed.lines("resumed_from=") == [resumed_line(last_saved)], resumed.describe()
    # ... and finishes exactly as the run that was never interrupted.
    assert_same_result(resumed, baseline)


KEEP_5 = [*FLAGS, "--keep-checkpoints", "5"]  # keeping more checkpoints does not change training


@pytest.fixture(scope="module")
def killed_after_8(module_train):
    """A run killed right after step 8's save, with checkpoints 2, 4, 6 and 8 complete. Each test
    that starts it again (or damages it first) starts from a copy of its folder (train.copy), so
    the run is made once."""
    first = module_train(*KEEP_5, name="killed-after-8", env={"DISTRAIN_TEST_KILL_AT_STEP": "8"})
    assert first.returncode in KILLED, first.describe()
    assert [p.name for p in first.contract.complete_checkpoints()] == [f"checkpoint-{s:08d}" for s in (2, 4, 6, 8)]
    return first


def test_checkpoint_killed_mid_save_is_never_loaded(train, baseline, killed_after_8):
    # Started again, it resumes from checkpoint 8 (the step it was killed at), and its next save
    # (step 10) dies after accelerate wrote its state, before the COMPLETE marker: a real half save,
    # the latest checkpoint, which the next start passes over for the previous, complete one.
    c = train.copy("crash", killed_after_8)
    crashed = train(*KEEP_5, name="crash", env={"DISTRAIN_TEST_CRASH_IN": "save"})
    assert crashed.returncode in KILLED, crashed.describe()
    assert crashed.lines("resumed_from=") == [resumed_line(8)], crashed.describe()
    half = c.checkpoints()[-1]
    assert half.name == "checkpoint-00000010" and not (half / "COMPLETE").exists()
    assert any(half.iterdir())  # state files were written: only the marker is missing
    assert c.complete_checkpoints()[-1].name == "checkpoint-00000008"

    rerun = train(*KEEP_5, name="crash")
    assert rerun.returncode == 0, rerun.describe()
    assert rerun.lines("resumed_from=") == [resumed_line(8)], (
        "resumed from a half-written checkpoint\n" + rerun.describe()
    )
    assert_same_result(rerun, baseline)
    # The half-written folder was replaced by a real checkpoint-10 when step 10 came round again.
    assert (half / "COMPLETE").read_text() == "10"


def truncate(path) -> str:
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    return f"{path.name} has {size // 2} bytes, its manifest says {size}"


def flip_one_byte(path) -> str:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    path.write_bytes(bytes(data))
    return f"{path.name} does not match its sha256 in MANIFEST.json"


@pytest.fixture(scope="module")
def damaged_and_legacy(module_train, killed_after_8):
    """killed_after_8 started again after damage to the checkpoints marked complete (a full disk, a
    bad copy or sync), which their manifests show: one kind of damage on each of the three newest
    (each was a run of its own). The oldest, checkpoint 2, which the job resumes from, was saved
    before manifests existed. One run for the two tests below (the unverified checkpoint was a run
    of its own, resumed from checkpoint 8). Returns the contract, its four checkpoints (before the
    rerun), the damage and the rerun."""
    c = module_train.copy("damaged", killed_after_8)
    two, four, six, eight = c.complete_checkpoints()
    problems = [
        (eight, flip_one_byte(eight / "model.safetensors")),
        (six, truncate(six / "optimizer.bin")),
        (four, truncate(four / "model.safetensors")),
    ]
    assert all((ckpt / "MANIFEST.json").is_file() for ckpt, _ in problems)
    (two / "MANIFEST.json").unlink()
    state = json.loads((two / "trainer_state.json").read_text())
    for key in ("world_size", "strategy"):  # not recorded then either
        del state[key]
    (two / "trainer_state.json").write_text(json.dumps(state))
    return c, (two, four, six, eight), problems, module_train(*KEEP_5, name="damaged")


def test_damaged_complete_checkpoints_are_skipped_for_the_previous_one(baseline, damaged_and_legacy):
    """Each damaged checkpoint is skipped with one line, newest first, and the job resumes from the
    oldest, checkpoint 2, to the uninterrupted numbers."""
    c, (two, four, six, eight), problems, rerun = damaged_and_legacy
    skipped = [line for line in rerun.stderr.splitlines() if "skipping" in line]
    assert skipped == [
        (f"warning: skipping {ckpt.name} in {c.checkpoint_dir}: {problem}; resuming from {two.name} instead")
        for ckpt, problem in problems
    ], rerun.describe()
    assert "Traceback" not in rerun.stderr
    assert rerun.lines("resumed_from=") == [resumed_line(2)], rerun.describe()
    assert_same_result(rerun, baseline)
    for step, ckpt in ((4, four), (6, six), (8, eight)):  # saved again, whole, when its step came round
        assert (ckpt / "COMPLETE").read_text() == str(step)


def test_checkpoint_without_manifest_still_resumes(baseline, damaged_and_legacy):
    """Checkpoints saved before manifests existed (damaged_and_legacy's checkpoint 2) load as
    before, unverified, with one note, to the uninterrupted numbers."""
    *_, rerun = damaged_and_legacy
    assert rerun.lines("resumed_from=") == [resumed_line(2)], rerun.describe()
    notes = [line for line in rerun.stderr.splitlines() if "MANIFEST.json" in line and not line.startswith("warning:")]
    assert notes == [
        ("note: checkpoint-00000002 has no MANIFEST.json (saved before checksums existed): loading it unverified")
    ], rerun.describe()
    assert_same_result(rerun, baseline)


# A stop. Ctrl-C (SIGINT: 130, the same stop otherwise) is test_local_backend.py's
# test_ctrl_c_in_the_terminal_checkpoints_and_the_job_is_stopped[ctrl-c-2], through the CLI and
# node_launch to the trainer: its stopped= line, its one checkpoint of that step, no model.
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143)])
def test_sigterm_saves_a_checkpoint_and_exits_143(train, sig, code):
    flags = ["--max-steps", "100000", "--save-every", "1000", "--log-every", "1", "--report-to", "none"]
    proc, c, argv = train.popen(*flags, name=f"stop-{sig.name}")
    metrics = c.output_dir / "metrics.jsonl"

    def steps_logged() -> int:
        if not metrics.is_file():
            return 0
        return sum(1 for line in metrics.read_text().splitlines() if line.endswith("}"))

    try:
        deadline = time.monotonic() + 120
        while steps_logged() < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it was signalled"
        proc.send_signal(sig)
        run = train.finish(proc, c, argv, timeout=120)
    finally:
        train.kill(proc)  # only if a failed assertion left it running

    assert run.returncode == code, run.describe()
    step = max(run.train_losses)
    assert step >= 5
    assert run.lines("stopped=") == [f"stopped={sig.name} step={step} checkpoint_saved=1"], run.describe()
    assert "Traceback" not in run.stderr, run.describe()
    (ckpt,) = c.complete_checkpoints()
    assert ckpt.name == f"checkpoint-{step:08d}"
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == step
    # Stopped is not finished: no evaluation, no model.
    assert run.evals == [] and not c.model_dir.exists()

    # The same command again resumes from it (and is killed two steps later to end the test).
    again = train(*flags, name=f"stop-{sig.name}", env={"DISTRAIN_TEST_KILL_AT_STEP": str(step + 2)})
    assert again.returncode in KILLED, again.describe()
    assert again.lines("resumed_from=") == [resumed_line(step)], again.describe()
    assert max(again.train_losses) == step + 2
    assert [m["step"] for m in again.metrics if "train_loss" in m][-2:] == [step + 1, step + 2]


# 2: the default on GPUs, data loader processes beside the trainer. Without workers, a SIGTERM to
# node_launch of one process is test_local_backend.py's `cancel` of a local job (cancel-0) and the
# SIGTERM its node launcher gets when its CLI is killed (test_a_job_whose_cli_is_killed_does_not_run_on).
@pytest.mark.parametrize("workers", [2])
def test_sigterm_to_node_launch_reaches_a_single_process(train, workers):
    """accelerate's launcher for one process forwards no signal (and died of SIGTERM, leaving the
    trainer running to the end); node_launch signals the training process itself, and not its data
    loader workers: they are forks with the trainer's command line, and torch's handler in them
    dies of a SIGTERM that is not their parent's, which failed the trainer's step (a spot notice
    on a GPU ended in a traceback, no checkpoint)."""
    flags = ["--max-steps", "100000", "--save-every", "1000", "--log-every", "1", "--report-to", "none"]
    flags += ["--num-workers", str(workers)]
    proc, c, argv = train.popen(*flags, name=f"sigterm-1-{workers}", processes=1)
    metrics = c.output_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 120
        while (not metrics.is_file() or metrics.read_text().count("\n") < 3) and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it was signalled"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)
        run = train.finish(proc, c, argv, timeout=120)
    finally:
        train.kill(proc)
    step = max(run.train_losses)
    assert run.lines("stopped=") == [f"stopped=SIGTERM step={step} checkpoint_saved=1"], run.describe()
    assert [p.name for p in c.complete_checkpoints()] == [f"checkpoint-{step:08d}"]
    assert run.returncode == 143, run.describe()
    assert "Traceback" not in run.stderr, run.describe()


@pytest.mark.multiprocess
# processes agree to stop at log steps only; with data loader workers (the GPU default), torchrun's
# training processes get the stop and their workers do not (node_launch._training_processes). One
# run shows both (they were three: (1, 0), (3, 0), (1, 2)); a step between log steps is where a
# stop must wait, and workers are where a stray SIGTERM would fail the step.
@pytest.mark.parametrize("log_every, workers", [(3, 2)])
def test_sigterm_through_node_launch_exits_143(train, log_every, workers):
    flags = ["--max-steps", "100000", "--save-every", "1000", "--log-every", str(log_every), "--report-to", "none"]
    flags += ["--num-workers", str(workers)]
    proc, c, argv = train.popen(*flags, name=f"sigterm-2-{log_every}-{workers}", processes=2)
    metrics = c.output_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 180
        while (
            (not metrics.is_file() or metrics.read_text().count("\n") < 3)
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before it was signalled"
        os.kill(proc.pid, signal.SIGTERM)  # what a backend stopping the job sends to the command it ran
        run = train.finish(proc, c, argv, timeout=120)
    finally:
        train.kill(proc)
    # The workers agreed to stop (at a log step), saved, and the launcher reports 143.
    step = max(run.train_losses)
    assert step % log_every == 0, run.describe()
    assert run.lines("stopped=") == [f"stopped=SIGTERM step={step} checkpoint_saved=1"], run.describe()
    assert [p.name for p in c.complete_checkpoints()] == [f"checkpoint-{step:08d}"]
    assert run.returncode == 143, run.describe()
    assert "Traceback" not in run.stderr and "error:" not in run.stderr, run.describe()


@pytest.mark.multiprocess
def test_two_process_run_killed_and_resumed_matches_the_uninterrupted_one(train):
    """Each process keeps its own RNG state in the checkpoint (dropout differs per rank), and
    the global batch order is the sampler's: so a 2-process job resumes exactly too."""
    flags = [*FLAGS, "--batch-size", "8"]
    whole = train(*flags, name="two-whole", processes=2)
    assert whole.returncode == 0, whole.describe()
    killed = train(*flags, name="two-killed", processes=2, env={"DISTRAIN_TEST_KILL_AT_STEP": "5"})
    assert killed.returncode != 0 and max(killed.train_losses) == 5, killed.describe()
    again = train(*flags, name="two-killed", processes=2)
    assert again.lines("resumed_from=") == [resumed_line(4)], again.describe()
    assert_same_result(again, whole)

    # Back on 1 process (numbers: the next test), padded classification batches are grouped by
    # length in pools of whole batches, which halve here: the rest of the epoch is grouped anew.
    train.with_checkpoint("on-one", whole, 12)  # the run's last step: it trains one more (13)
    alone = train(*flags, "--max-steps", "13", name="on-one")
    assert alone.returncode == 0 and alone.lines("resumed_from=") == [resumed_line(12)], alone.describe()
    assert alone.lines("note: batches of another size group this epoch's examples by length anew") != []


@pytest.mark.multiprocess
def test_two_process_checkpoint_resumed_on_one_process_trains_on_as_the_two_did(train, no_dropout_config):
    """A spot job back on an instance with fewer GPUs: step 4's checkpoint of 2 processes resumes
    on 1 with twice the micro-batches a step, so the global batch and the data order are the
    checkpoint's, and the losses are the uninterrupted 2-process run's (no dropout, whose masks
    are drawn per process; only the order of the reductions differs)."""
    flags = ["--task", "causal-lm", "--model-config", str(no_dropout_config), "--block-size", "64"]
    flags += [*FLAGS, "--batch-size", "8", "--keep-checkpoints", "6"]
    whole = train(*flags, name="two-whole", processes=2)
    assert whole.returncode == 0, whole.describe()
    train.with_checkpoint("on-one", whole, 4)
    again = train(*flags, name="on-one")
    assert again.returncode == 0, again.describe()
    assert again.lines("resumed_from=") == [resumed_line(4)], again.describe()
    assert again.lines("resumed on") == [
        "resumed on 1 process from a checkpoint of 2: --grad-accum 2 keeps its global batch of 16 (8 x 2 x 1)"
    ]
    assert sorted(again.train_losses) == [s for s in whole.train_losses if s > 4]
    for step, loss in again.train_losses.items():
        assert loss == pytest.approx(whole.train_losses[step], rel=1e-5), (step, again.train_losses, whole.train_losses)
    assert again.final_eval["eval_loss"] == pytest.approx(whole.final_eval["eval_loss"], rel=1e-5)
