"""Progress a person can read: step lines with where the run stands, a line for a slow setup step,
and the key=value format the SageMaker metric regexes and the bench parse unchanged."""

from __future__ import annotations

import re
import time

import pytest

from distrain_cloud.launcher.backends.sagemaker.request import METRIC_REGEX
from distrain_cloud.training.trainer import _hms, _slow_phase


def test_durations_are_one_token():
    assert [_hms(x) for x in (0.2, 7.4, 62, 3725)] == ["0s", "7s", "1m02s", "1h02m05s"]


def test_a_slow_setup_step_says_what_it_is_doing_and_a_quick_one_says_nothing():
    said: list[str] = []
    with _slow_phase("loading the model gpt2 (downloaded on first use)", said.append, after_s=0.05):
        time.sleep(0.3)
    assert said[0] == "setup: loading the model gpt2 (downloaded on first use)..."
    assert re.fullmatch(r"setup: loading the model gpt2: done in \ds", said[1]), said
    quick: list[str] = []
    with _slow_phase("loading the tokenizer", quick.append, after_s=5):
        pass
    time.sleep(0.1)
    assert quick == []


@pytest.mark.slow  # trains a tiny model
def test_step_lines_say_where_the_run_stands_and_still_parse(train):
    from bench._benchlib import parse_kv

    run = train("--max-steps", "4", "--log-every", "2", "--report-to", "none")
    assert run.returncode == 0, run.describe()
    lines = run.lines("step=")
    train_line = next(line for line in lines if line.startswith("step=4 train_loss="))
    assert re.search(r" progress=4/4 elapsed=\d+s eta=0s time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", train_line)
    assert all(re.search(r" time=\S+Z$", line) for line in lines)
    # What SageMaker's metric definitions and the bench read from the same line.
    assert re.search(METRIC_REGEX.format("train_loss"), train_line).group(1) == parse_kv(train_line)["train_loss"]
    assert float(parse_kv(train_line)["tokens_per_sec"]) > 0
    assert [m["step"] for m in run.metrics if "train_loss" in m] == [2, 4]
    # metrics.jsonl keeps its rows as they were: runs compare them whole (exact resume).
    assert all("time" not in m and "progress" not in m for m in run.metrics)
