"""Flags mean what they say (issue 39): each refused in one line that names the flag and what to
give instead, before anything is created or paid for, through the real CLI in this process."""

from __future__ import annotations

import json

import pytest
from clirun import run_cli


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _failed(err: str) -> str:
    """The one `error:` line of a refused plan."""
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    return line


def test_a_train_file_that_is_a_directory_says_so_and_what_to_pass(here, capsys):
    (here / "data").mkdir()
    code, out, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--", "--train-file", "data")
    assert code == 1 and "no such file" not in out + err
    assert _failed(err) == (
        f"error: plan check failed, nothing was created: --train-file {here / 'data'} is a file (it is a directory: "
        f"give one data file in it (csv, json, jsonl, parquet or txt), or the folder as --dataset {here / 'data'})"
    )
    assert not (here / "runs").exists()


def test_the_job_itself_says_a_train_file_is_a_directory(here):
    # The job's own check, for a spec planned elsewhere: the same words, not "no such file".
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.contract import Contract
    from distrain_cloud.training.data import DataError, resolve_sources

    (here / "data").mkdir()
    contract = Contract(model_dir=here / "m", output_dir=here / "o", checkpoint_dir=here / "c")
    with pytest.raises(DataError, match=r"^--train-file: .*/data is a directory: give one data file in it "):
        resolve_sources(parse_args(["--train-file", str(here / "data")]), contract)


@pytest.mark.parametrize(
    "typo, hint",
    [("--max-stpes", " (did you mean --max-steps?)"), ("--lrr=3", " (did you mean --lr?)"), ("--zzzzzz", "")],
)
def test_a_mistyped_training_flag_gets_a_did_you_mean(here, capsys, typo, hint):
    code, out, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--", typo, "5")
    assert (code, out) == (2, "")
    assert err == f"error: training arguments: unrecognized arguments: {typo} 5{hint}\n"


def test_a_config_override_of_the_wrong_type_names_the_key_the_value_and_the_type(here, capsys):
    pytest.importorskip("transformers")
    flags = ["--task", "causal-lm", "--config-overrides", "n_layer=abc"]
    code, out, err = run_cli(capsys, "submit", "--instance", "local", "--dry-run", "--", *flags)
    assert code == 1 and "invalid literal" not in out + err
    assert _failed(err) == (
        "error: plan check failed, nothing was created: --config-overrides fit the model's config "
        "(--config-overrides n_layer=abc: n_layer takes an integer (now 2), not 'abc')"
    )


def _checkpoint(runs, job: str, step: int, state: bytes) -> None:
    folder = runs / job / "checkpoints" / f"checkpoint-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "COMPLETE").touch()
    (folder / "trainer_state.json").write_bytes(state)


def test_resuming_with_max_steps_at_or_below_the_checkpoints_step_is_refused_at_plan_time(here, capsys):
    _checkpoint(here / "runs", "earlier-1", 50, json.dumps({"step": 50, "strategy": "ddp"}).encode())
    for steps in ("20", "50"):
        code, out, err = run_cli(
            capsys, "submit", "--instance", "local", "--resume-from", "earlier-1", "--", "--max-steps", steps
        )
        assert code == 2, err
        assert _failed(err) == (
            "error: plan check failed, nothing was created: --max-steps is beyond the checkpoint's step (the "
            f"checkpoint is at step 50 and --max-steps {steps} trains nothing further: give more, e.g. --max-steps 100)"
        )
    assert sorted(p.name for p in (here / "runs").iterdir()) == ["earlier-1"]  # no Failed job folder
    code, out, err = run_cli(
        capsys, "submit", "--instance", "local", "--resume-from", "earlier-1", "--dry-run", "--", "--max-steps", "60"
    )
    assert code == 0 and "[ok  ] --max-steps is beyond the checkpoint's step: 50 -> 60" in out, err


@pytest.mark.parametrize(
    "state",
    [
        b"[" * 100_000,
        b'{"step": "50"}',
        b'{"step": true}',
        b"\xff\xfe",
        b'{"step": 50, "pad": "' + b"x" * (2 << 20) + b'"}',
    ],
    ids=["deep", "string-step", "bool-step", "not-utf8", "huge"],
)
def test_a_checkpoint_state_that_is_not_one_refuses_nothing_and_breaks_nothing(here, capsys, state):
    _checkpoint(here / "runs", "earlier-1", 50, state)
    code, out, err = run_cli(
        capsys, "submit", "--instance", "local", "--resume-from", "earlier-1", "--dry-run", "--", "--max-steps", "20"
    )
    assert code == 0, err
    assert "[FAIL]" not in out  # a state that is not one: the job, which verifies its checkpoint, decides
