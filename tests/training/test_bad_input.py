"""Bad input: exit 2, one `error: ...` line on stderr that names the flag or file, the same
line in the contract's failure file, and nothing else written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad-data")
    words = ["good", "bad", "fine", "awful", "great", "poor"]
    rows = [{"text": f"the day was {w}", "label": "pos" if i % 2 == 0 else "neg"} for i, w in enumerate(words * 3)]
    garbage = d / "train.parquet"
    garbage.write_bytes(bytes(range(256)) * 4)  # not parquet: no magic bytes
    (d / "sentences.csv").write_text("sentence,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in rows))
    return {
        "train": write_jsonl(d / "train.jsonl", rows),
        # 'neutral' never occurs in training
        "validation": write_jsonl(d / "validation.jsonl", [{"text": "it was ok", "label": "neutral"},
                                                             {"text": "it was good", "label": "pos"}]),
        "garbage": garbage,
        "csv_without_text": d / "sentences.csv",
        "missing": d / "does-not-exist.csv",
    }


# id -> (flags, what the error line must name); {name} is a path from data_files
CASES = {
    "unknown-task": (["--task", "regression"], ["--task", "regression"]),
    "unknown-strategy": (["--strategy", "zero4"], ["--strategy", "zero4"]),
    "bad-number": (["--max-steps", "-3"], ["--max-steps"]),
    "missing-text-column": (["--text-column", "sentence"], ["--text-column", "sentence"]),
    "missing-label-column": (["--label-column", "category"], ["--label-column", "category"]),
    "csv-without-text-column": (["--train-file", "{csv_without_text}"], ["--text-column", "'text'"]),
    "unseen-validation-labels": (["--train-file", "{train}", "--validation-file", "{validation}"],
                                 ["--label-column", "'neutral'"]),
    "garbage-parquet": (["--train-file", "{garbage}"], ["{garbage_name}"]),
    "nonexistent-file": (["--train-file", "{missing}"], ["--train-file", "{missing}"]),
    "unknown-builtin": (["--dataset", "builtin:nope"], ["--dataset", "builtin:nope"]),
    "reduce-dtype-under-zero": (["--strategy", "zero2", "--ddp-reduce-dtype", "bf16"],
                                ["--ddp-reduce-dtype", "--strategy ddp", "zero2"]),
    "compile-mode-without-compile": (["--compile-mode", "max-autotune"], ["--compile-mode", "--compile"]),
    "compile-tuning-without-compile": (["--compile-tuning"], ["--compile-tuning", "--compile"]),
    "zero-pad-multiple": (["--pad-to-multiple-of", "0"], ["--pad-to-multiple-of"]),
    "ce-kernel-without-fused-ce": (["--task", "causal-lm", "--ce-kernel", "liger"], ["--ce-kernel", "--fused-ce"]),
    "bf16-reduce-on-cpu": (["--ddp-reduce-dtype", "bf16"], ["--ddp-reduce-dtype bf16", "GPUs"]),
}


def fill(items: list[str], files: dict[str, Path]) -> list[str]:
    values = {k: str(v) for k, v in files.items()} | {"garbage_name": files["garbage"].name}
    return [s.format(**values) for s in items]


@pytest.fixture(scope="module")
def bad_runs(module_train, data_files):
    """Every case once, two at a time (each is a short single-process run)."""
    jobs = [{"flags": ["--report-to", "none", "--max-steps", "5", *fill(flags, data_files)], "name": case}
            for case, (flags, _) in CASES.items()]
    return dict(zip(CASES, module_train.many(jobs)))


def assert_one_error_line(run, must_name: list[str], quiet_stdout: bool = True) -> str:
    assert run.returncode == 2, run.describe()
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, run.describe()
    assert not any("Traceback" in line for line in lines), run.describe()
    for name in must_name:
        assert name in errors[0], f"{name!r} not named in {errors[0]!r}"
    if quiet_stdout:
        assert run.stdout.strip() == "", run.describe()
    return errors[0]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(bad_runs, data_files, case):
    run = bad_runs[case]
    error = assert_one_error_line(run, fill(CASES[case][1], data_files))
    c = run.contract
    # The same line in the failure file, and nothing else anywhere in the contract.
    assert sorted(p.name for p in c.output_dir.iterdir()) == ["failure"]
    assert (c.output_dir / "failure").read_text() == error + "\n"
    assert not c.model_dir.exists() and not c.checkpoint_dir.exists()
    assert list(c.workdir.iterdir()) == []


def test_bad_contract_is_reported_without_a_failure_file(train):
    # The contract itself is unreadable: there is no output folder to write to.
    run = train("--max-steps", "5", env={"DISTRAIN_NUM_NODES": "two"})
    error = assert_one_error_line(run, ["DISTRAIN_NUM_NODES", "'two'"])
    assert error == "error: DISTRAIN_NUM_NODES must be an integer, got 'two'"
    assert not run.contract.output_dir.exists()


def test_node_launch_reports_a_bad_argument_before_starting_processes(train):
    run = train("--task", "regression", processes=2)
    error = assert_one_error_line(run, ["--task", "regression"])
    assert (run.contract.output_dir / "failure").read_text() == error + "\n"


@pytest.mark.multiprocess
def test_bad_data_through_node_launch_exits_2_with_one_line(train):
    run = train("--text-column", "sentence", "--report-to", "none", processes=2)
    failure = run.contract.output_dir / "failure"
    # What works: the main process wrote the failure file, and nothing else was written.
    assert failure.read_text().startswith("error: --text-column 'sentence' is not in data")
    assert sorted(p.name for p in run.contract.output_dir.iterdir()) == ["failure"]
    assert_one_error_line(run, ["--text-column", "sentence"], quiet_stdout=False)  # node_launch's line
