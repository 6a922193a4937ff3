"""`distrain-cloud report JOB`: one self-contained HTML page about a finished (or stopped) run, no W&B.

Reads what every job leaves in its folder: `output/metrics.jsonl` (the trainer's step and eval
rows), `output/sample.txt`, `model/training_args.json` (resolved settings, final metrics), and for
local jobs `job.json` (the plan) and `status.json`; a cloud job's backend fetches the first three
from S3 (`fetch_outputs`) and hands over its status. Charts are inline SVG drawn here (no plotting
library: the launcher stays lean), also written as `plots/<slug>.svg` beside the page.

A resumed job's metrics file holds its own attempt only (its steps from the checkpoint on): the
report plots its lineage, every earlier attempt's rows first (`earlier`), so the loss runs from
step 1. The attempts are found back along `resume_from` (this machine's job records, else a local
job's plan), and a cloud attempt's metrics are fetched from S3 as the job's own are.

Every byte read here was written by the job (or whoever can write its S3 prefix): each text
that reaches the page is HTML-escaped, plot files are named by a slug of safe characters that
no two metrics share, and a row that is not a metric row (no numeric step, not an object, not
UTF-8) is skipped and counted, never a traceback.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distrain_cloud.infra.errors import UserError

if TYPE_CHECKING:
    from .plan import JobRef

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


# A value the charts can scale: finite, and far enough from float's limits that the spans
# and ticks computed from it stay finite too.
_PLOTTABLE = 1e300


@dataclass
class Rows:
    """A metrics file's rows, and how many of its non-blank lines were no metric row."""

    rows: list[dict[str, Any]]
    skipped: int
    lines: int


def read_rows(job_dir: Path) -> Rows:
    """The metric rows of `output/metrics.jsonl`: JSON objects with a finite numeric step. A line
    cut short by a kill, or anything else (not UTF-8, not JSON, a list, a string step), is skipped."""
    path = job_dir / "output" / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{job_dir}: no output/metrics.jsonl (the job logged no step yet, or this is not a job folder)")
    rows, lines = [], 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        lines += 1
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # ValueError: not UTF-8, not JSON, too many digits
            continue
        if isinstance(row, dict) and _number(row.get("step")) is not None:
            rows.append(row)
    if lines and not rows:
        raise UserError(
            f"{path} holds no metric rows ({lines} lines, none a JSON object with a numeric step): "
            "is it a distrain-cloud job's metrics file?"
        )
    return Rows(rows, lines - len(rows), lines)


def _number(value: Any) -> float | None:
    """`value` as a float the charts can use, or None (a bool, a string, NaN, inf, 10**400)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if abs(number) < _PLOTTABLE else None  # NaN fails this too


def slugs(names: list[str]) -> dict[str, str]:
    """A file name stem for each name: lower-case letters, digits, `_` and `-` only (no `/`, no
    `..`, the same on a case-insensitive disk), at most 80 characters, and no two alike."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        base = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")[:60] or "metric"
        if base != name:  # changed or cut: a hash of the name keeps it apart from others
            base = f"{base}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        slug, n = base, 1
        while slug in taken:  # two names may still meet (one spelt as the other's slug)
            n += 1
            slug = f"{base}-{n}"
        taken.add(slug)
        out[name] = slug
    return out


def charts(rows: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, list[tuple[float, float]]]]]:
    """name -> (title, {series: [(step, value)]}) for every metric the run logged."""

    def series(key: str) -> list[tuple[float, float]]:
        # A resumed lineage repeats steps: the last value of each step wins, as in W&B.
        last = {_number(r["step"]): _number(r.get(key)) for r in rows if _number(r.get(key)) is not None}
        return sorted((s, v) for s, v in last.items() if s is not None and v is not None)

    wanted = {
        "loss": ("Loss", {"train_loss": series("train_loss"), "eval_loss": series("eval_loss")}),
        "lr": ("Learning rate", {"lr": series("lr")}),
        "tokens_per_sec": ("Tokens per second", {"tokens_per_sec": series("tokens_per_sec")}),
        "peak_mem_gb": ("Peak GPU memory (GiB)", {"peak_mem_gb": series("peak_mem_gb")}),
    }
    evals = sorted({k for r in rows for k in r if k.startswith("eval_") and k not in ("eval_loss", "eval_samples")})
    for key in evals:
        wanted[key] = (key.removeprefix("eval_").replace("_", " ").capitalize() + " (eval)", {key: series(key)})
    return {
        name: (title, {k: v for k, v in lines.items() if v})
        for name, (title, lines) in wanted.items()
        if any(lines.values())
    }


def svg_chart(title: str, lines: dict[str, list[tuple[float, float]]], width: int = 560, height: int = 260) -> str:
    """A line chart: axes with ~5 ticks each, one polyline (and dots, when few) per series, a legend."""
    left, right, top, bottom = 64, 16, 28, 40
    xs = [x for pts in lines.values() for x, _ in pts]
    ys = [y for pts in lines.values() for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = _nice_range(min(ys), max(ys))
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]
    for y in _ticks(y0, y1):
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{_fmt(y)}</text>')
    for x in _ticks(x0, x1):
        out.append(f'<text x="{px(x):.1f}" y="{height - bottom + 16}" text-anchor="middle">{_fmt(x)}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">step</text>')
    out.append(
        f'<polyline points="{left},{top} {left},{height - bottom} {width - right},{height - bottom}" '
        'fill="none" stroke="#333"/>'
    )
    for i, (name, pts) in enumerate(lines.items()):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        if len(pts) <= 40:
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts]
        lx = width - right - 110 * (len(lines) - i)  # legends in the title row, clear of the data
        out.append(f'<rect x="{lx}" y="7" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + 14}" y="16">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _nice_range(lo: float, hi: float) -> tuple[float, float]:
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    raw = (hi - lo) / count
    if not 1e-300 < raw < math.inf:  # a span too narrow for a tick's size: its ends only
        return [lo, hi]
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if step * m >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _fmt(v: float) -> str:
    if isinstance(v, float) and 1e3 <= abs(v) < 1e9:
        return f"{v:,.0f}"  # 15,620 tokens/s, not 1.562e+04
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):  # ValueError: not UTF-8, not JSON, too many digits
        return {}
    return data if isinstance(data, dict) else {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# A lineage longer than this is a loop in hand-edited records, not a real chain of resumes.
MAX_ATTEMPTS = 200


def earlier_attempts(name: str, workdir: Path) -> list[str]:
    """The jobs `name` resumed, oldest first: each one's `resume_from`, from this machine's job
    record, else (a local job) from its plan's summary. Stops at a loop or a name that is none."""
    from .spec import JOB_NAME

    chain: list[str] = []
    seen, current = {name}, name
    while len(chain) < MAX_ATTEMPTS:
        previous = _resumed_from(current, workdir)
        if previous is None or previous in seen or not JOB_NAME.fullmatch(previous):
            break
        chain.append(previous)
        seen.add(previous)
        current = previous
    return chain[::-1]


def _resumed_from(name: str, workdir: Path) -> str | None:
    from .jobs import read_record

    try:
        record = read_record(name) or {}
    except UserError:  # a broken record: the plan may still say
        record = {}
    resumed = _dict(record.get("spec")).get("resume_from")
    if isinstance(resumed, str) and resumed:
        return resumed
    # The local plan's summary: "resumes": "<job> (lineage ...)" (a submit may add ", with ...").
    shown = _text(_dict(_read_json(workdir / name / "job.json").get("summary")).get("resumes"))
    return re.split(r"[ ,(]", shown, maxsplit=1)[0] or None


def lineage_folders(
    ref: JobRef, fetch: Callable[[JobRef, Path], Any] | None = None
) -> tuple[list[tuple[str, Path]], list[str]]:
    """(name, folder) of each earlier attempt of `ref`'s lineage whose metrics are here, oldest
    first, and a note for each that is not. `fetch` (a cloud backend's fetch_outputs) brings an
    attempt's outputs from S3 into its folder under `ref.workdir` first."""
    from dataclasses import replace

    found: list[tuple[str, Path]] = []
    notes: list[str] = []
    for name in earlier_attempts(ref.name, ref.workdir):
        folder = ref.workdir / name
        if fetch is not None:
            try:
                fetch(replace(ref, name=name), folder)
            except UserError as e:
                notes.append(f"{name}: {e}")
                continue
        if (folder / "output" / "metrics.jsonl").is_file():
            found.append((name, folder))
        else:
            notes.append(f"{name}: no metrics at {folder / 'output' / 'metrics.jsonl'}")
    return found, notes


def write_report(
    job_dir: Path,
    out_dir: Path | None = None,
    *,
    status: dict[str, Any] | None = None,
    earlier: list[tuple[str, Path]] | None = None,
    missing: list[str] | None = None,
) -> Path:
    """Write `<out_dir>/report.html` (default `<job_dir>/report/`) and its plots; return the page.
    `status` (a backend's status of the job) stands in for a local job's status.json. `earlier`:
    (name, folder) of the attempts this job resumed, oldest first, whose rows are plotted before
    its own; `missing`: a line for each attempt whose metrics could not be had."""
    read = read_rows(job_dir)
    attempts: list[tuple[str, list[dict[str, Any]]]] = []
    for name, folder in earlier or []:
        try:
            attempts.append((name, read_rows(folder).rows))
        except UserError as e:  # an attempt's unreadable file costs its rows, not the report
            missing = [*(missing or []), f"{name}: {e}"]
    attempts.append((job_dir.name, read.rows))
    rows = [row for _, attempt in attempts for row in attempt]  # in order: a later attempt's step wins
    out_dir = out_dir or job_dir / "report"
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    plan = _read_json(job_dir / "job.json")
    status = status if status is not None else _read_json(job_dir / "status.json")
    resolved = _read_json(job_dir / "model" / "training_args.json")
    sample = job_dir / "output" / "sample.txt"
    sample_text = sample.read_bytes().decode(errors="replace") if sample.is_file() else None  # any bytes

    figures = []
    plotted = charts(rows)
    for name, slug in slugs(list(plotted)).items():
        svg = svg_chart(*plotted[name])
        (out_dir / "plots" / f"{slug}.svg").write_text(svg)
        figures.append(f'<figure id="plot-{slug}">{svg}</figure>')

    trains = [r for r in rows if "train_loss" in r]
    evals = [r for r in rows if "eval_loss" in r]
    final = {**(trains[-1] if trains else {}), **(evals[-1] if evals else {})}
    final.pop("time", None)
    settings = {**_dict(plan.get("summary"))} or {k: status[k] for k in ("backend", "instance") if status.get(k)}
    command = _dict(plan.get("request")).get("command")
    if isinstance(command, list) and "--" in command:
        settings["training flags"] = " ".join(map(str, command[command.index("--") + 1 :]))
    for key in ("task", "model", "model_config", "dataset", "max_steps_resolved", "num_parameters", "world_size"):
        if resolved.get(key) is not None:
            settings[key] = resolved[key]
    name = job_dir.name
    state = _text(status.get("status")) or "unknown"
    detail = _text(status.get("detail"))
    skipped = f"; {read.skipped} of {read.lines} rows skipped (not metric rows)" if read.skipped else ""
    lineage = ""
    if len(attempts) > 1 or missing:
        spans = [f"{html.escape(n)} ({_steps(a)})" for n, a in attempts]
        lost = f"; not plotted: {html.escape('; '.join(missing))}" if missing else ""
        lineage = f'<p class="status">lineage, oldest first: {" &rarr; ".join(spans)}{lost}</p>\n'
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(name)}: report</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; max-width: 1200px; }}
h1 {{ font-size: 20px; margin-bottom: 4px; }} h2 {{ font-size: 16px; margin-top: 28px; }}
.status {{ color: #555; margin-top: 0; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }}
th {{ background: #f6f6f6; font-weight: 600; }}
.plots {{ display: flex; flex-wrap: wrap; gap: 12px; }}
figure {{ margin: 0; border: 1px solid #ddd; }}
pre {{ background: #f6f6f6; padding: 10px; white-space: pre-wrap; max-width: 900px; }}
</style></head><body>
<h1>{html.escape(name)}</h1>
<p class="status">status: <b>{html.escape(state)}</b>{" (" + html.escape(detail) + ")" if detail else ""};
{len(trains)} training log rows, {len(evals)} evaluations{skipped}</p>
{lineage}<h2>Final metrics</h2>
{_table(final) if final else "<p>none logged</p>"}
<h2>Plots</h2>
<div class="plots">
{"".join(figures) or "<p>nothing to plot</p>"}
</div>
<h2>Generated sample</h2>
{f"<pre>{html.escape(sample_text)}</pre>" if sample_text is not None else "<p>none (causal-lm runs save one)</p>"}
<h2>Run configuration</h2>
{_table(settings) if settings else "<p>no plan or resolved settings found</p>"}
</body></html>
"""
    path = out_dir / "report.html"
    path.write_text(page)
    if read.skipped:
        print(
            f"note: skipped {read.skipped} of {read.lines} rows of {job_dir / 'output' / 'metrics.jsonl'} "
            "that are not metric rows (the report shows the rest)",
            file=sys.stderr,
        )
    return path


def _steps(rows: list[dict[str, Any]]) -> str:
    steps = [n for n in (_number(r.get("step")) for r in rows) if n is not None]
    return f"steps {_fmt(min(steps))}-{_fmt(max(steps))}" if steps else "no steps"


def _table(values: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v) if isinstance(v, float) else str(v))}</td></tr>"
        for k, v in values.items()
    )
    return f"<table>{rows}</table>"
