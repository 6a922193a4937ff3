"""The training flags as `distrain-train` reads them: every flag explained, numbers as numbers
(negative ones too), and a run that would train nothing refused."""

from __future__ import annotations

import argparse

import pytest

from distrain_cloud.training import __main__ as entry
from distrain_cloud.training.args import (
    ArgumentError,
    absolute_data_paths,
    argv_to_hyperparameters,
    build_parser,
    hyperparameters_to_argv,
    parse_args,
)


def test_every_flag_has_help_text(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    silent = [
        "/".join(a.option_strings)
        for a in build_parser()._actions
        if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()
    ]
    assert silent == []
    with pytest.raises(SystemExit) as e:
        entry.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert e.value.code == 0
    for flag, says in [
        ("--epochs EPOCHS", "passes over the training data"),
        ("--seed SEED", "seeds the weights"),
        ("--log-every LOG_EVERY", "optimizer steps between step lines"),
        ("--keep-checkpoints KEEP_CHECKPOINTS", "the newest checkpoints kept"),
    ]:
        assert f"{flag} {says}" in text, flag


def test_the_flags_are_the_fields_with_their_defaults():
    """build_parser makes one flag of each TrainArgs field, in its order, with its default: a flag
    cannot be added, renamed or given another default without its field (nor the reverse)."""
    from dataclasses import fields

    from distrain_cloud.training.args import TrainArgs

    parser = build_parser()
    assert [a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction)] == [
        f.name for f in fields(TrainArgs)
    ]
    assert vars(parser.parse_args([])) == TrainArgs().to_dict()


@pytest.mark.parametrize(
    "flags, field, value",
    [
        (["--lr", "-1e-4"], "lr", -1e-4),
        (["--lr", "-.5"], "lr", -0.5),
        (["--max-grad-norm", "-3", "--lr", "2e-4"], "lr", 2e-4),
        (["--max-grad-norm", "-inf"], "max_grad_norm", float("-inf")),
    ],
)
def test_a_negative_number_reaches_its_flag(flags, field, value):
    """argparse takes `-1e-4` for an option ("expected one argument"): attached to its flag,
    it is read as the number it is, and the checks say what is wrong with it."""
    ns = build_parser().parse_args  # what argparse alone does with the first case
    if flags[:2] == ["--lr", "-1e-4"]:
        with pytest.raises(ArgumentError, match="expected one argument"):
            ns(flags)
    assert getattr(parse_args([*flags, "--report-to", "none"]), field) == value
    # SageMaker's hyperparameters carry the value as text, and the job reads it back the same way.
    assert parse_args(hyperparameters_to_argv(argv_to_hyperparameters(flags))).lr == parse_args(flags).lr


def test_a_flag_without_its_number_is_still_named():
    with pytest.raises(ArgumentError, match="--lr: expected one argument"):
        parse_args(["--lr", "--max-steps", "5"])
    with pytest.raises(ArgumentError, match="--lr: invalid float value: '-x'"):
        parse_args(["--lr=-x"])


def test_max_steps_0_is_refused_naming_a_valid_value(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        entry.main(["--max-steps", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --max-steps 0 trains nothing: give at least 1 (e.g. --max-steps 100), or leave it out to train --epochs"
    ]


def test_relative_data_paths_are_made_absolute_where_the_user_typed_them(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "corpus").mkdir()
    argv = [
        "--train-file",
        "data/train.jsonl",
        "--validation-file=./val.jsonl",  # absent: made absolute all the same (the plan check names it)
        "--dataset",
        "corpus",  # a folder here, as data.resolve_sources would take it
        "--run-name",
        "data/train.jsonl",
    ]
    assert absolute_data_paths(argv, tmp_path) == [
        "--train-file",
        str(tmp_path / "data" / "train.jsonl"),
        f"--validation-file={tmp_path / 'val.jsonl'}",
        "--dataset",
        str(tmp_path / "corpus"),
        "--run-name",
        "data/train.jsonl",
    ]
    hub = ["--dataset", "dair-ai/emotion", "--dataset", "builtin:sentiment", "--train-file", "/abs/x.csv"]
    assert absolute_data_paths(hub, tmp_path) == hub
