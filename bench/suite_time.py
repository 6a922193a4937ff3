"""Time the test suite and rewrite the one place its timings are kept.

    python bench/suite_time.py                  # the full suite (what CI runs): about a quarter hour
    python bench/suite_time.py --lane fast      # the fast lane (-m "not slow")
    python bench/suite_time.py --lane gate      # ruff and mypy, mypy's cache cold
    python bench/suite_time.py --junit FILE     # a full run made elsewhere (CI's --junitxml), not rerun
    python bench/suite_time.py --junit FILE --commit abc1234   # ... naming the commit that run tested
    python bench/suite_time.py --render         # only rewrite README.md's block from the record

The record is tests/durations.json: per lane its time, test count, commit and date; per test file
the seconds its tests took in the last full run (setup, call and teardown summed), which
tests/conftest.py reads to hand the longest files to the two workers first. README.md's table of
suite timings, between its suite-timings markers, is written from that record alone, so no commit
edits a timing by hand. Time on a quiet 2-core machine (CI's size): `uptime` first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORD = REPO / "tests" / "durations.json"
README = REPO / "README.md"
BEGIN = "<!-- suite-timings: written by bench/suite_time.py from tests/durations.json; do not edit by hand -->"
END = "<!-- /suite-timings -->"
BUDGET_S = 20 * 60  # the project's limit for the full suite on a 2-core machine (CI itself allows 90 min)
LONGEST_SHOWN = 6

# lane -> (the command shown in README.md, what it is: {tests} is the test count)
LANES = {
    "fast": ('`python -m pytest -q -m "not slow"`', "the fast lane: {tests} unit and moto tests"),
    "all": ("`python -m pytest -q`", "everything, {tests} tests (what CI runs)"),
    "gate": ("`ruff check . && ruff format --check . && mypy`", "the gate CI runs before the tests, mypy's cache cold"),
}


def file_of(case: ET.Element) -> str:
    """The test file of a junit <testcase>: its `file` (junit_family=xunit1), else its dotted classname."""
    if case.get("file"):
        return case.get("file", "")
    parts = case.get("classname", "").split(".")
    for end in range(len(parts), 0, -1):  # the longest prefix that is a file: the rest is a class
        path = Path(*parts[:end]).with_suffix(".py")
        if (REPO / path).is_file():
            return path.as_posix()
    return "/".join(parts) + ".py"


def read_junit(path: Path) -> tuple[float, int, dict[str, float]]:
    """(the session's seconds, the number of tests, seconds per test file) of a junit xml file."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise SystemExit(f"error: {path}: no <testsuite> element: not pytest's --junitxml output")
    per_file: dict[str, float] = {}
    cases = suite.findall("testcase")
    for case in cases:
        per_file[file_of(case)] = per_file.get(file_of(case), 0.0) + float(case.get("time") or 0)
    return float(suite.get("time") or 0), len(cases), per_file


def run_pytest(extra: list[str]) -> tuple[float, int, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-q", f"--junitxml={xml}", "-o", "junit_family=xunit1", *extra]
        start = time.monotonic()
        code = subprocess.run(argv, cwd=REPO).returncode
        wall = time.monotonic() - start
        if code != 0:
            raise SystemExit(f"error: pytest exited {code}: timings of a failing run are not recorded")
        _, tests, per_file = read_junit(xml)
    return wall, tests, per_file


def run_gate() -> float:
    with tempfile.TemporaryDirectory() as cache:
        start = time.monotonic()
        for argv in (["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy", "--cache-dir", cache]):
            subprocess.run([sys.executable, "-m", *argv], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        return time.monotonic() - start


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True)
    return out.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def load() -> dict:
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    return {"lanes": record.get("lanes", {}), "files": record.get("files", {})}


def save(record: dict) -> None:
    record["files"] = dict(sorted(record["files"].items(), key=lambda kv: (-kv[1], kv[0])))
    RECORD.write_text(json.dumps(record, indent=1) + "\n")


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def render(record: dict) -> str:
    rows = ["| command | what | time on a 2-core machine |", "| --- | --- | --- |"]
    for lane, (shown, what) in LANES.items():
        got = record["lanes"].get(lane)
        if got is None:
            continue
        time_s = f"{duration(got['seconds'])} (at {got['commit']}, {got['date']})"
        if lane == "all" and got["seconds"] > BUDGET_S:
            time_s += f": over the {BUDGET_S // 60}-minute budget"
        what = what.format(tests=f"{got.get('tests', 0):,}")
        rows.append(f"| {shown} | {what} | {time_s} |")
    total = sum(record["files"].values())
    if total > 0:  # shares, not seconds: they hold on a machine slower or busier than CI's
        longest = ", ".join(f"`{name}` {s / total:.0%}" for name, s in list(record["files"].items())[:LONGEST_SHOWN])
        rows += ["", f"The longest test files, each a share of the full suite's test time: {longest}."]
    return "\n".join([BEGIN, *rows, END])


def rewrite_readme(record: dict) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"error: {README.name} has no suite-timings block ({BEGIN} ... {END}) to rewrite")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + render(record) + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lane", choices=list(LANES), default="all")
    parser.add_argument("--junit", type=Path, help="read a full run's junit xml instead of running the suite")
    parser.add_argument(
        "--commit",
        help="with --junit: the commit the run tested (a CI clone's; default: this checkout's HEAD, maybe newer)",
    )
    parser.add_argument("--render", action="store_true", help="only rewrite README.md from the record")
    args = parser.parse_args(argv)
    if args.commit and not args.junit:
        parser.error("--commit names the commit a --junit run tested; a run made here is this checkout's")
    record = load()
    if not args.render:
        tests, per_file = 0, None
        if args.junit:
            seconds, tests, per_file = read_junit(args.junit)
        elif args.lane == "gate":
            seconds = run_gate()
        else:
            seconds, tests, per_file = run_pytest(["-m", "not slow"] if args.lane == "fast" else [])
        lane = "all" if args.junit else args.lane
        today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        record["lanes"][lane] = {"seconds": round(seconds, 1), "commit": args.commit or commit(), "date": today}
        if tests:
            record["lanes"][lane]["tests"] = tests
        if lane == "all" and per_file:
            record["files"] = {name: round(s, 1) for name, s in per_file.items()}
        save(record)
        print(f"{lane}: {duration(seconds)}" + (f", {tests} tests" if tests else ""), file=sys.stderr)
    rewrite_readme(record)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
