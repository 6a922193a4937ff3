"""Checkpoints that do not lie: a manifest of sizes and sha256s written before the COMPLETE
marker and checked on resume; a save that fails on the disk ends in one line naming the folder
and the disk; a ZeRO checkpoint is not handed to DeepSpeed by a run of another world size.

The unit tests drive checkpoint.py with a stand-in for Accelerate (seconds); the slow ones run
the entry point as a backend does. Damaged checkpoints resumed by real runs: test_resume.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from distrain_cloud.training import checkpoint

STATE = {"step": 2, "epoch": 0, "batch_in_epoch": 2, "wandb_run_id": None, "world_size": 1, "strategy": "ddp"}


class FakeAccelerator:
    """What checkpoint.save needs of an Accelerator, on one process; `write` plays save_state."""

    is_main_process = True

    def __init__(self, write: Callable[[Path], None] | None = None):
        self.write = write or write_state

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, folder: str) -> None:
        self.write(Path(folder))


def write_state(folder: Path) -> None:
    """Files shaped like a ZeRO-2 save of 2 processes: shared ones, per-rank ones, a subfolder."""
    (folder / "pytorch_model").mkdir()
    (folder / "pytorch_model" / "mp_rank_00_model_states.pt").write_bytes(b"weights" * 1000)
    for rank in (0, 1):
        (folder / "pytorch_model" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"adam" * 999)
        (folder / f"random_states_{rank}.pkl").write_bytes(b"rng%d" % rank)
    (folder / "latest").write_text("pytorch_model")


def save(root: Path, step: int, accelerator: FakeAccelerator | None = None, keep: int = 5) -> Path:
    return checkpoint.save(accelerator or FakeAccelerator(), root, step, {**STATE, "step": step}, keep)


def test_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    path = save(tmp_path, 2)
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["algorithm"] == "sha256"
    assert sorted(manifest["files"]) == [
        "latest",
        "pytorch_model/mp_rank_00_model_states.pt",
        "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "random_states_0.pkl",
        "random_states_1.pkl",
        "trainer_state.json",
    ]  # everything but the manifest and the marker, which comes after it
    shard = path / "pytorch_model" / "mp_rank_00_model_states.pt"
    assert manifest["files"]["pytorch_model/mp_rank_00_model_states.pt"] == {
        "size": 7000,
        "sha256": hashlib.sha256(shard.read_bytes()).hexdigest(),
    }
    assert (path / "COMPLETE").read_text() == "2"
    assert checkpoint.verify(path) is None
    assert checkpoint.latest(tmp_path, warn=pytest.fail) == (path, {**STATE, "step": 2})


def missing(f: Path) -> None:
    f.unlink()


def truncated(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:-1])


def same_size_other_bytes(f: Path) -> None:
    f.write_bytes(b"X" + f.read_bytes()[1:])


@pytest.mark.parametrize(
    "damage, problem",
    [
        (missing, "random_states_1.pkl is missing"),
        (truncated, "random_states_1.pkl has 3 bytes, its manifest says 4"),
        (same_size_other_bytes, "random_states_1.pkl does not match its sha256 in MANIFEST.json"),
    ],
)
def test_verify_names_the_damaged_file(tmp_path, damage, problem):
    path = save(tmp_path, 2)
    damage(path / "random_states_1.pkl")
    assert checkpoint.verify(path) == problem


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"files": {"latest": ', "MANIFEST.json is unreadable (JSONDecodeError: "),
        ('{"files": {"latest": {"size": 13}}}', "MANIFEST.json is unreadable (KeyError: 'sha256')"),
        ('{"files": ["latest"]}', "MANIFEST.json is unreadable (AttributeError: "),
        (
            '{"files": {"../../etc/hostname": {"size": 1, "sha256": "0"}}}',
            "MANIFEST.json names '../../etc/hostname', outside the checkpoint",
        ),
    ],
)
def test_unreadable_or_hostile_manifest_fails_verification(tmp_path, text, problem):
    path = save(tmp_path, 2)
    (path / "MANIFEST.json").write_text(text)
    assert checkpoint.verify(path).startswith(problem)


def test_latest_skips_damaged_checkpoints_with_one_line_each(tmp_path):
    older, middle, newest = save(tmp_path, 2), save(tmp_path, 4), save(tmp_path, 6)
    truncated(newest / "pytorch_model" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    same_size_other_bytes(middle / "trainer_state.json")
    lines: list[str] = []
    assert checkpoint.latest(tmp_path, warn=lines.append) == (older, {**STATE, "step": 2})
    assert lines == [
        (
            f"warning: skipping checkpoint-00000006 in {tmp_path}: "
            "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt has 3995 bytes, its manifest says 3996; "
            "resuming from checkpoint-00000002 instead"
        ),
        (
            f"warning: skipping checkpoint-00000004 in {tmp_path}: trainer_state.json does not match its sha256 in "
            "MANIFEST.json; resuming from checkpoint-00000002 instead"
        ),
    ]

    missing(older / "latest")
    lines.clear()
    assert checkpoint.latest(tmp_path, warn=lines.append) is None
    assert len(lines) == 3 and all(line.endswith("; no earlier checkpoint: starting from step 0") for line in lines)


def test_checkpoint_without_manifest_loads_unverified_with_a_note(tmp_path):
    path = save(tmp_path, 2)
    (path / "MANIFEST.json").unlink()
    truncated(path / "latest")  # nothing to check it against
    lines: list[str] = []
    assert checkpoint.latest(tmp_path, warn=lines.append) == (path, {**STATE, "step": 2})
    assert lines == [
        ("note: checkpoint-00000002 has no MANIFEST.json (saved before checksums existed): loading it unverified")
    ]


def fail_half_way(error: BaseException) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"half")
        raise error

    return write


# torch.save reports a full disk as a RuntimeError without an errno: the free space tells.
TORCH_FULL_DISK = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 6976 vs 6868")


@pytest.mark.parametrize(
    "error", [TORCH_FULL_DISK, OSError(errno.ENOSPC, "No space left on device")], ids=["torch-runtime-error", "enospc"]
)
def test_save_on_a_full_disk_raises_one_line_naming_folder_and_disk(tmp_path, monkeypatch, error):
    monkeypatch.setattr(checkpoint, "_disk_space", lambda folder: (5 * 1024, 1000, Path("/mnt/scratch")))
    save(tmp_path, 2)
    with pytest.raises(checkpoint.SaveError) as raised:
        save(tmp_path, 4, FakeAccelerator(fail_half_way(error)), keep=3)
    assert str(raised.value) == (
        f"no space left on device while saving checkpoint-00000004 to {tmp_path} (5.0 KiB free on the disk mounted at "
        "/mnt/scratch); checkpoint-00000004 is not marked complete and will not be loaded: free space there or keep "
        "fewer checkpoints (--keep-checkpoints, now 3)"
    )
    assert raised.value.exit_code == 1
    assert [p.name for _, p in checkpoint.complete_checkpoints(tmp_path)] == ["checkpoint-00000002"]


def test_save_with_no_free_inodes_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "_disk_space", lambda folder: (10 << 30, 0, Path("/")))
    with pytest.raises(checkpoint.SaveError, match=r"\(no free inodes on the disk mounted at /\)"):
        save(tmp_path, 2, FakeAccelerator(fail_half_way(OSError(errno.ENOSPC, "No space left on device"))))


def test_other_disk_errors_are_one_line_too(tmp_path):
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "checkpoint-00000002" / "optimizer.bin"))
    with pytest.raises(checkpoint.SaveError) as raised:
        save(tmp_path, 2, FakeAccelerator(fail_half_way(denied)))
    assert str(raised.value) == (
        f"could not save checkpoint-00000002 to {tmp_path}: Permission denied "
        f"({tmp_path}/checkpoint-00000002/optimizer.bin); checkpoint-00000002 is not marked complete and will not be "
        "loaded"
    )


def test_errors_that_are_not_the_disk_pass_through(tmp_path):
    # Plenty of space here: a RuntimeError is a bug to show with its traceback, not a full disk.
    with pytest.raises(RuntimeError, match="unexpected pos"):
        save(tmp_path, 2, FakeAccelerator(fail_half_way(TORCH_FULL_DISK)))


ZERO2_OF_2 = {**STATE, "world_size": 2, "strategy": "zero2"}


@pytest.mark.parametrize(
    "saved, world, strategy, says",
    [
        (
            ZERO2_OF_2,
            1,
            "zero2",
            (
                "was saved by 2 processes with --strategy zero2, which splits its state across processes, "
                "but this run has 1: run it with 2 processes to resume"
            ),
        ),
        (
            {**ZERO2_OF_2, "world_size": 1},
            4,
            "zero2-offload",
            (
                "saved by 1 process with --strategy zero2, which splits its state across processes, "
                "but this run has 4: run it with 1 process to resume"
            ),
        ),
        (
            {**ZERO2_OF_2, "strategy": "zero3"},
            2,
            "zero2",
            (
                "was saved with --strategy zero3, which stores its state differently from --strategy zero2: "
                "resume with --strategy zero3"
            ),
        ),
        ({**STATE, "strategy": "ddp"}, 1, "zero2", "resume with --strategy ddp"),
    ],
)
def test_checkpoints_a_run_cannot_resume_are_refused(tmp_path, saved, world, strategy, says):
    with pytest.raises(checkpoint.CheckpointError, match=f"^checkpoint-00000002 in {tmp_path} ") as raised:
        checkpoint.check_resumable(tmp_path / "checkpoint-00000002", saved, world, strategy)
    assert says in str(raised.value)
    assert raised.value.exit_code == 2


@pytest.mark.parametrize(
    "saved, world, strategy",
    [
        ({**STATE, "world_size": 2, "strategy": "ddp"}, 1, "ddp"),  # DDP state does not depend on the world size
        ({**STATE, "world_size": 1, "strategy": "ddp"}, 1, "single"),
        (ZERO2_OF_2, 2, "zero2"),
        (ZERO2_OF_2, 2, "zero2-offload"),
        ({k: v for k, v in ZERO2_OF_2.items() if k not in ("world_size", "strategy")}, 1, "zero2"),  # not recorded
    ],
)
def test_checkpoints_a_run_can_resume_pass(tmp_path, saved, world, strategy):
    checkpoint.check_resumable(tmp_path / "checkpoint-00000002", saved, world, strategy)


@pytest.mark.parametrize(
    ("saved", "world", "batch", "accum", "kept"),
    [
        # the same processes and flags: nothing changes
        ({"world_size": 2, "batch_size": 8, "grad_accum": 1, "batch_in_epoch": 4}, 2, 8, 1, (1, 4, None)),
        # 2 processes' checkpoint on 1, the job's own flags: twice the micro-batches, the place in samples
        (
            {"world_size": 2, "batch_size": 8, "grad_accum": 1, "batch_in_epoch": 4},
            1,
            8,
            1,
            (
                2,
                8,
                "resumed on 1 process from a checkpoint of 2: --grad-accum 2 keeps its global batch of 16 (8 x 2 x 1)",
            ),
        ),
        ({"world_size": 1, "batch_size": 8, "grad_accum": 4, "batch_in_epoch": 8}, 4, 8, 4, (1, 2, mock.ANY)),
        # flags the user gave that keep the global batch: taken as they are
        ({"world_size": 2, "batch_size": 8, "grad_accum": 1, "batch_in_epoch": 4}, 1, 16, 1, (1, 4, None)),
        # saved before the batch was recorded: the job's flags are taken as the checkpoint's
        ({"world_size": 2, "batch_in_epoch": 4}, 1, 8, 1, (2, 8, mock.ANY)),
        ({"batch_in_epoch": 3}, 1, 8, 1, (1, 3, None)),
    ],
)
def test_a_resume_on_another_number_of_processes_keeps_the_global_batch_and_the_place(saved, world, batch, accum, kept):
    batches = checkpoint.resume_batches(Path("checkpoint-00000004"), saved, world, batch, accum)
    assert (batches.grad_accum, batches.batch_in_epoch, batches.note) == kept
    # the loader's batches (micro-batch x processes) change size where the processes do
    assert batches.regrouped is (batch * world != saved.get("batch_size", batch) * saved.get("world_size", world))


@pytest.mark.parametrize(
    ("world", "says"),
    [
        (
            2,
            "which no --grad-accum gives with --batch-size 8 on 2 processes: resume with --batch-size 4 --grad-accum 1",
        ),
        (3, "on 3 processes: resume on a number of processes that divides 8"),
    ],
)
def test_a_resume_that_cannot_keep_the_global_batch_is_refused_with_flags_that_do(tmp_path, world, says):
    saved = {"world_size": 1, "batch_size": 8, "grad_accum": 1, "batch_in_epoch": 2}
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.resume_batches(tmp_path / "checkpoint-00000002", saved, world, 8, 1)
    was = "was trained with a global batch of 8 (--batch-size 8 x --grad-accum 1 x 1 process)"
    assert str(raised.value).startswith(f"checkpoint-00000002 in {tmp_path} {was}")
    assert says in str(raised.value) and str(raised.value).endswith("or move the checkpoints away to start over")


# ------------------------------------------------------------------ the entry point

FLAGS = ["--max-steps", "4", "--save-every", "2", "--log-every", "1", "--report-to", "none"]


def assert_one_error_line(run, code: int, must_name: list[str]) -> str:
    assert run.returncode == code, run.describe()
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.describe()
    assert "Traceback" not in run.stderr, run.describe()
    for name in must_name:
        assert name in errors[0], f"{name!r} not named in {errors[0]!r}"
    assert (run.contract.output_dir / "failure").read_text() == errors[0] + "\n"
    return errors[0]


@pytest.mark.slow
def test_full_disk_during_saves_is_one_line_and_a_failure_file(train):
    """DISTRAIN_TEST_NO_SPACE_IN makes the write fail as a full disk does (OSError ENOSPC):
    in a checkpoint right after Accelerate wrote its files, or in the final model."""
    ckpt, model = train.many(
        [
            {"flags": FLAGS, "name": "full-ckpt", "env": {"DISTRAIN_TEST_NO_SPACE_IN": "save"}},
            {"flags": FLAGS, "name": "full-model", "env": {"DISTRAIN_TEST_NO_SPACE_IN": "model"}},
        ]
    )
    c = ckpt.contract
    assert_one_error_line(
        ckpt,
        1,
        [
            (f"no space left on device while saving checkpoint-00000002 to {c.checkpoint_dir} ("),
            "free on the disk mounted at ",
            "checkpoint-00000002 is not marked complete",
            "--keep-checkpoints",
        ],
    )
    (half,) = c.checkpoints()
    assert any(half.iterdir()) and not (half / "COMPLETE").exists()

    assert_one_error_line(model, 1, [f"no space left on device while saving the model to {model.contract.model_dir} ("])
    assert [p.name for p in model.contract.complete_checkpoints()] == ["checkpoint-00000002", "checkpoint-00000004"]
    assert not model.lines("model_saved=")


@pytest.fixture(scope="module")
def zero2_of_two(module_train):
    """A ZeRO-2 checkpoint saved by 2 processes (each writes its own optimizer shard)."""
    run = module_train(
        "--strategy",
        "zero2",
        "--max-steps",
        "2",
        "--save-every",
        "2",
        "--batch-size",
        "8",
        "--report-to",
        "none",
        "--no-save-model",
        name="zero2-of-two",
        processes=2,
    )
    assert run.returncode == 0, run.describe()
    (path,) = run.contract.complete_checkpoints()
    assert len(list((path / "pytorch_model").glob("zero_pp_rank_*_optim_states.pt"))) == 2
    assert {
        k: v
        for k, v in json.loads((path / "trainer_state.json").read_text()).items()
        if k in ("world_size", "strategy")
    } == {"world_size": 2, "strategy": "zero2"}
    return run.contract


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.deepspeed
def test_zero2_checkpoint_of_2_processes_is_refused_by_1(module_train, zero2_of_two):
    # Started as every backend starts it (node_launch), before DeepSpeed would fail on it.
    run = module_train(
        "--strategy",
        "zero2",
        "--max-steps",
        "4",
        "--batch-size",
        "8",
        "--report-to",
        "none",
        "--no-save-model",
        name="zero2-of-two",
        processes=1,
    )
    assert_one_error_line(
        run,
        2,
        [
            (f"checkpoint-00000002 in {zero2_of_two.checkpoint_dir} was saved by 2 processes with --strategy zero2"),
            "but this run has 1: run it with 2 processes",
        ],
    )
    assert not run.lines("resumed_from=")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.deepspeed
def test_zero2_checkpoint_is_refused_by_ddp(module_train, zero2_of_two):
    run = module_train("--max-steps", "4", "--report-to", "none", name="zero2-of-two")
    assert_one_error_line(
        run, 2, ["was saved with --strategy zero2", "from --strategy ddp", "resume with --strategy zero2"]
    )
