"""bench/suite_time.py: a run's junit xml becomes tests/durations.json and README.md's timing block,
and nothing else in README.md changes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def suite_time(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("suite_time", REPO / "bench" / "suite_time.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RECORD", tmp_path / "durations.json")
    monkeypatch.setattr(module, "README", tmp_path / "README.md")
    return module


# pytest's default junit family names a test by its dotted module (and class), not its file
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4" time="754.321">
<testcase classname="tests.training.test_resume" name="test_a" time="200.5"/>
<testcase classname="tests.training.test_resume" name="test_b" time="70.0"/>
<testcase classname="tests.launcher.test_report.TestSomething" name="test_c" time="0.25"/>
<testcase classname="tests.launcher.test_local_backend" name="test_d" time="12.0"><skipped/></testcase>
</testsuite></testsuites>
"""


def test_a_full_runs_junit_rewrites_the_record_and_only_the_readme_block(suite_time, tmp_path):
    readme = tmp_path / "README.md"
    before, after = "# Project\n\n## Tests\n\n", "\n\nMarkers: kept as they were.\n"
    readme.write_text(before + suite_time.BEGIN + "\n| old | table |\n" + suite_time.END + after)
    suite_time.RECORD.write_text(
        json.dumps({"lanes": {"fast": {"seconds": 35, "commit": "abc", "date": "d", "tests": 1403}}})
    )
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)

    assert suite_time.main(["--junit", str(junit)]) == 0

    record = json.loads(suite_time.RECORD.read_text())
    assert record["files"] == {  # longest first: the order the workers take them in
        "tests/training/test_resume.py": 270.5,
        "tests/launcher/test_local_backend.py": 12.0,
        "tests/launcher/test_report.py": 0.2,
    }
    assert list(record["files"]) == sorted(record["files"], key=lambda f: -record["files"][f])
    assert record["lanes"]["all"]["seconds"] == 754.3 and record["lanes"]["all"]["tests"] == 4
    assert record["lanes"]["fast"] == {"seconds": 35, "commit": "abc", "date": "d", "tests": 1403}  # untouched
    text = readme.read_text()
    assert text.startswith(before + suite_time.BEGIN) and text.endswith(suite_time.END + after)
    assert "| old | table |" not in text
    assert "| `python -m pytest -q` | everything, 4 tests (what CI runs) | 12 min 34 s (at " in text
    assert (
        '| `python -m pytest -q -m "not slow"` | the fast lane: 1,403 unit and moto tests | 35 s (at abc, d) |' in text
    )
    assert "`tests/training/test_resume.py` 96%, `tests/launcher/test_local_backend.py` 4%, `tests/launcher/" in text


def test_a_junit_run_is_recorded_at_the_commit_it_tested(suite_time, tmp_path):
    """A CI clone tests one commit; the checkout that reads its junit may have moved on since."""
    suite_time.README.write_text(suite_time.BEGIN + "\n" + suite_time.END + "\n")
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    assert suite_time.main(["--junit", str(junit), "--commit", "5fd1be0"]) == 0
    assert json.loads(suite_time.RECORD.read_text())["lanes"]["all"]["commit"] == "5fd1be0"
    assert "(at 5fd1be0, " in suite_time.README.read_text()
    with pytest.raises(SystemExit):  # a run made here is this checkout's own
        suite_time.main(["--lane", "fast", "--commit", "5fd1be0"])


def test_over_the_budget_is_said(suite_time):
    record = {"lanes": {"all": {"seconds": 1249, "commit": "abc", "date": "d", "tests": 1622}}, "files": {}}
    assert "20 min 49 s (at abc, d): over the 20-minute budget" in suite_time.render(record)


def test_a_readme_without_the_block_is_refused_and_left_alone(suite_time):
    suite_time.README.write_text("# no block here\n")
    with pytest.raises(SystemExit, match="README.md has no suite-timings block"):
        suite_time.main(["--render"])
    assert suite_time.README.read_text() == "# no block here\n"


def test_the_repository_readme_has_the_block_the_record_renders():
    """README.md's block is exactly what the committed record renders: nobody edited it by hand."""
    spec = importlib.util.spec_from_file_location("suite_time_repo", REPO / "bench" / "suite_time.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render(module.load()) in (REPO / "README.md").read_text()
