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
    (d / "empty.jsonl").write_text("")
    (d / "header-only.csv").write_text("text,label\n")
    return {
        "train": write_jsonl(d / "train.jsonl", rows),
        # 'neutral' never occurs in training
        "validation": write_jsonl(
            d / "validation.jsonl", [{"text": "it was ok", "label": "neutral"}, {"text": "it was good", "label": "pos"}]
        ),
        "garbage": garbage,
        "csv_without_text": d / "sentences.csv",
        "missing": d / "does-not-exist.csv",
        "empty_jsonl": d / "empty.jsonl",
        "header_only_csv": d / "header-only.csv",
        # bad rows: row numbers count from 1 in the file, like the error line's
        "null_text": write_jsonl(d / "null-text.jsonl", rows[:3] + [{"text": None, "label": "pos"}] + rows[3:]),
        "number_text": write_jsonl(
            d / "number-text.jsonl",
            rows[:1] + [{"text": 7, "label": "pos"}, {"text": ["a", "list"], "label": "neg"}] + rows[1:],
        ),
        "null_label": write_jsonl(
            d / "null-label.jsonl", rows[:4] + [{"text": "the day was", "label": None}] + rows[4:]
        ),
        "null_text_validation": write_jsonl(
            d / "null-text-validation.jsonl", [{"text": "it was good", "label": "pos"}, {"text": None, "label": "neg"}]
        ),
    }


# id -> (flags, what the error line must name); {name} is a path from data_files
CASES = {
    "unknown-task": (["--task", "regression"], ["--task", "regression"]),
    "unknown-strategy": (["--strategy", "zero4"], ["--strategy", "zero4"]),
    "bad-number": (["--max-steps", "-3"], ["--max-steps"]),
    "missing-text-column": (["--text-column", "sentence"], ["--text-column", "sentence"]),
    "missing-label-column": (["--label-column", "category"], ["--label-column", "category"]),
    "csv-without-text-column": (["--train-file", "{csv_without_text}"], ["--text-column", "'text'"]),
    "unseen-validation-labels": (
        ["--train-file", "{train}", "--validation-file", "{validation}"],
        ["--label-column", "'neutral'"],
    ),
    "garbage-parquet": (["--train-file", "{garbage}"], ["{garbage_name}"]),
    "nonexistent-file": (["--train-file", "{missing}"], ["--train-file", "{missing}"]),
    "unknown-builtin": (["--dataset", "builtin:nope"], ["--dataset", "builtin:nope"]),
    "empty-jsonl": (["--train-file", "{empty_jsonl}"], ["--train-file", "{empty_jsonl} is empty"]),
    "header-only-csv": (["--train-file", "{header_only_csv}"], ["{header_only_csv} holds no rows"]),
    "null-text": (
        ["--train-file", "{null_text}"],
        ["{null_text}", "--text-column 'text'", "row 4 is null", "(1 of 19 rows"],
    ),
    "null-text-causal-lm": (
        ["--task", "causal-lm", "--train-file", "{null_text}"],
        ["{null_text}", "--text-column 'text'", "row 4 is null"],
    ),
    "number-text": (
        ["--train-file", "{number_text}"],
        ["{number_text}", "--text-column 'text'", "row 2 is a number (7)", "(2 of 20 rows"],
    ),
    "null-label": (["--train-file", "{null_label}"], ["{null_label}", "--label-column 'label'", "row 5", "(1 of 19"]),
    "null-text-in-validation": (
        ["--train-file", "{train}", "--validation-file", "{null_text_validation}"],
        ["{null_text_validation}", "--text-column 'text'", "row 2 is null"],
    ),
    "reduce-dtype-under-zero": (
        ["--strategy", "zero2", "--ddp-reduce-dtype", "bf16"],
        ["--ddp-reduce-dtype", "--strategy ddp", "zero2"],
    ),
    "compile-mode-with-no-compile": (
        ["--no-compile", "--compile-mode", "max-autotune"],
        ["--compile-mode", "contradicts --no-compile"],
    ),
    "compile-tuning-with-no-compile": (["--no-compile", "--compile-tuning"], ["--compile-tuning", "--no-compile"]),
    "zero-pad-multiple": (["--pad-to-multiple-of", "0"], ["--pad-to-multiple-of"]),
    "negative-generate-tokens": (["--generate-tokens", "-1"], ["--generate-tokens must be 0 (no sample) or more"]),
    "negative-warmup-steps": (["--warmup-steps", "-5"], ["--warmup-steps must be 0 (no warmup) or more, got -5"]),
    "ce-kernel-without-fused-ce": (["--task", "causal-lm", "--ce-kernel", "liger"], ["--ce-kernel", "--fused-ce"]),
    "unknown-config-key": (
        ["--task", "causal-lm", "--preset", "tiny-gpt2", "--config-overrides", "attn_pdropp=0"],
        ["--config-overrides attn_pdropp=0", "GPT2Config has no 'attn_pdropp'"],
    ),
    "bf16-reduce-on-cpu": (["--ddp-reduce-dtype", "bf16"], ["--ddp-reduce-dtype bf16", "GPUs"]),
    # the Hub client's chained tracebacks, and transformers' for a model with no head for the task
    # a Hub model or data set that is not cached, with the Hub out of reach: at once, and the fix
    "hub-model-offline": (
        ["--model", "gpt2"],
        ["--model gpt2 is not in this machine's Hugging Face cache", "(HF_HUB_OFFLINE is set)", "hf download gpt2"],
    ),
    "hub-dataset-offline": (
        ["--dataset", "someone/absent-data"],
        [
            "--dataset someone/absent-data is not in this machine's Hugging Face cache",
            "hf download --repo-type dataset someone/absent-data --local-dir absent-data",
        ],
    ),
    "task-without-a-head": (["--task", "masked-lm"], ["--task masked-lm with --model", "AutoModelForMaskedLM"]),
}


def fill(items: list[str], files: dict[str, Path]) -> list[str]:
    values = {k: str(v) for k, v in files.items()} | {"garbage_name": files["garbage"].name}
    return [s.format(**values) for s in items]


@pytest.fixture(scope="module")
def bad_runs(module_train, data_files):
    """Every case once, two at a time (each is a short single-process run)."""
    jobs = [
        {"flags": ["--report-to", "none", "--max-steps", "5", *fill(flags, data_files)], "name": case}
        for case, (flags, _) in CASES.items()
    ]
    return dict(zip(CASES, module_train.many(jobs), strict=True))


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
    assert run.stderr.strip() == error, run.describe()  # and no log or warning lines around it
    c = run.contract
    # The same line in the failure file, and nothing else anywhere in the contract.
    assert sorted(p.name for p in c.output_dir.iterdir()) == ["failure"]
    assert (c.output_dir / "failure").read_text() == error + "\n"
    assert not c.model_dir.exists() and not c.checkpoint_dir.exists()
    assert list(c.workdir.iterdir()) == []


# `python -m distrain_cloud.training ARGS`, saying on its way out whether torch was loaded.
_ENTRY_SAYING_IF_TORCH_LOADED = """
import runpy, sys
sys.argv[0] = "distrain_cloud.training"
try:
    runpy.run_module("distrain_cloud.training", run_name="__main__", alter_sys=True)
finally:
    print("torch loaded" if "torch" in sys.modules else "torch not loaded")
"""


def test_bad_data_is_refused_before_torch_is_imported(train):
    """torch, transformers and Accelerate cost a CPU process about four seconds to import: the
    entry point checks the data first (data.load_checked), so a misspelt column is one line in
    about one second. (Where Linux shows NVIDIA devices, the precision's GPU query loads torch.)"""
    import subprocess
    import sys

    from conftest import base_env

    c = train.contract("torch-free")
    flags = ["--report-to", "none", "--text-column", "sentence"]
    env = base_env({**train.shared_env, **c.env()})
    r = subprocess.run(
        [sys.executable, "-c", _ENTRY_SAYING_IF_TORCH_LOADED, *flags],
        cwd=c.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: --text-column 'sentence' is not in data"), r.stderr
    assert r.stdout.strip() == "torch not loaded"


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


def test_bad_rows_in_a_folder_of_files_and_missing_class_labels(tmp_path, monkeypatch):
    """In process, without a model: the row is counted through the folder's files in name order,
    and a ClassLabel of -1 (datasets' missing label) is refused like a null one."""
    import datasets

    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.contract import Contract
    from distrain_cloud.training.data import DataError, _check_rows, load_raw

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    channel = tmp_path / "train"
    channel.mkdir()
    rows = [{"text": f"the day was {w}", "label": w} for w in ["good", "bad"] * 3]
    write_jsonl(channel / "part-0.jsonl", rows)
    write_jsonl(channel / "part-1.jsonl", rows[:2] + [{"text": None, "label": "good"}])
    contract = Contract(
        model_dir=tmp_path / "model",
        output_dir=tmp_path / "output",
        checkpoint_dir=tmp_path / "checkpoints",
        channels={"train": channel},
    )
    with pytest.raises(DataError) as e:
        load_raw(parse_args(["--report-to", "none"]), contract)
    assert str(e.value).startswith(
        f"data channel {channel} (train split, 2 files read in name order): "
        "--text-column 'text' must hold text, but row 9 is null (1 of 9 rows"
    )

    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])})
    split = datasets.Dataset.from_dict({"text": ["x", "y", "z"], "label": [0, -1, 1]}, features=features)
    with pytest.raises(DataError, match=r"^data file x.jsonl: --label-column 'label' has no label in row 2 \(1 of 3"):
        _check_rows(parse_args(["--report-to", "none"]), split, "data file x.jsonl")


def test_a_trainer_of_node_launch_dies_with_it_from_before_the_data_loads(tmp_path, monkeypatch):
    """node_launch's trainers (DISTRAIN_DIE_WITH_LAUNCHER) ask Linux for SIGKILL when their
    launcher ends before the data load, which the entry point now does before the trainer (a Hub
    download may take minutes), not from the trainer's start on. In process, the calls recorded."""
    import signal

    from distrain_cloud.training import __main__ as entry
    from distrain_cloud.training import data, stopping

    calls: list[str] = []
    monkeypatch.setattr(stopping, "die_with_parent", lambda sig: calls.append(f"die {signal.Signals(sig).name}"))

    def load(args, contract):
        calls.append("load")
        raise data.DataError("the data stops it here")

    monkeypatch.setattr(data, "load_checked", load)
    monkeypatch.setenv("DISTRAIN_DIE_WITH_LAUNCHER", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # the contract sets it otherwise
    for name in ("MODEL", "OUTPUT", "CHECKPOINT"):
        monkeypatch.setenv(f"DISTRAIN_{name}_DIR", str(tmp_path / name.lower()))
    with pytest.raises(SystemExit) as e:
        entry._run(["--report-to", "none"])
    assert e.value.code == 2 and calls == ["die SIGKILL", "load"]
