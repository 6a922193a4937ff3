"""`distrain-cloud report JOB`: one self-contained HTML page with SVG plots, from a job's folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from distrain_cloud.launcher.report import write_report


def fake_job(root: Path) -> Path:
    """A local job's folder as the trainer and the local backend leave it (a resumed step repeated)."""
    (root / "output").mkdir(parents=True)
    (root / "model").mkdir()
    rows = [
        {"step": 10, "train_loss": 2.0, "lr": 1e-3, "tokens_per_sec": 15620.0, "peak_mem_gb": 1.5, "time": 1.0},
        {"step": 20, "train_loss": 1.5, "lr": 8e-4, "tokens_per_sec": 16000.0, "peak_mem_gb": 1.6, "time": 2.0},
        {"step": 20, "eval_loss": 1.6, "eval_accuracy": 0.5, "eval_samples": 150.0, "time": 2.1},
        {"step": 20, "train_loss": 1.4, "lr": 8e-4, "tokens_per_sec": 15000.0, "peak_mem_gb": 1.6, "time": 3.0},
        {"step": 30, "train_loss": 1.0, "lr": 4e-4, "tokens_per_sec": 15500.0, "peak_mem_gb": 1.6, "time": 4.0},
        {"step": 30, "eval_loss": 1.1, "eval_accuracy": 0.75, "eval_samples": 150.0, "time": 4.1},
    ]
    (root / "output" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4')
    (root / "output" / "sample.txt").write_text("Once upon a <b>time</b> & then\n")
    plan = {
        "summary": {"instance": "local", "strategy": "ddp"},
        "request": {"command": ["python", "--", "--lr", "1e-3"]},
    }
    (root / "job.json").write_text(json.dumps(plan))
    (root / "status.json").write_text(json.dumps({"status": "Completed", "exit_code": 0}))
    (root / "model" / "training_args.json").write_text(json.dumps({"task": "classification", "num_parameters": 1234}))
    return root


def test_the_page_holds_every_plot_the_final_metrics_the_sample_and_the_settings(tmp_path):
    page = write_report(fake_job(tmp_path / "job-1"))
    assert page == tmp_path / "job-1" / "report" / "report.html"
    text = page.read_text()
    for name in ("loss", "lr", "tokens_per_sec", "peak_mem_gb", "eval_accuracy"):
        assert f'id="plot-{name}"' in text
        assert (page.parent / "plots" / f"{name}.svg").read_text().startswith("<svg")
    # Self-contained: nothing fetched from anywhere.
    assert not re.search(r'(src|href)="', text)
    assert "Once upon a &lt;b&gt;time&lt;/b&gt; &amp; then" in text  # escaped, not markup
    assert "<th>eval_accuracy</th><td>0.75</td>" in text and "<th>tokens_per_sec</th><td>15,500</td>" in text
    assert "<th>training flags</th><td>--lr 1e-3</td>" in text and "<b>Completed</b>" in text
    # The resumed run's step 20 (1.4) replaces the first one's (1.5), as W&B would show it.
    loss = (page.parent / "plots" / "loss.svg").read_text()
    assert loss.count("<circle") == 3 + 2  # three train points, two eval points


def test_cli_report_finds_a_local_job_and_refuses_an_unknown_one_in_one_line(cli, tmp_path):
    fake_job(tmp_path / "runs" / "job-2")
    r = cli("report", "job-2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # The page's path (relative to where the CLI ran, when the work folder is).
    assert (tmp_path / r.stdout.strip()).resolve() == (tmp_path / "runs" / "job-2" / "report" / "report.html").resolve()
    # A job with no record and no folder is looked for on SageMaker where AWS is set up, as `status`
    # does: here, with no credentials, it is not, and the name is the problem (exit 2, one line;
    # tests/launcher/test_typos.py has the others, test_cloud_report.py fetches cloud jobs' metrics).
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_CONFIG_FILE": str(empty), "AWS_SHARED_CREDENTIALS_FILE": str(empty)}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    r = cli("report", "no-such-job", cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: no job named no-such-job is known here (no record on this machine and no folder "
        "runs/no-such-job); a job submitted from another machine: add --region REGION (no AWS credentials "
        "are configured), and --backend ec2 for an EC2 job"
    ]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="no Chromium here (Debian: apt-get install chromium)")
def test_a_real_jobs_report_renders_in_headless_chromium(cli, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "", "WANDB_API_KEY": ""}
    flags = [
        "--task",
        "causal-lm",
        "--max-steps",
        "40",
        "--log-every",
        "5",
        "--eval-every",
        "20",
        "--report-to",
        "none",
    ]
    r = cli("submit", "--instance", "local", "--", *flags, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(
        r"^done: 40 steps in \S+ of training, after \S+ of setup; train_loss \S+ -> \S+; eval_loss ",
        r.stderr + r.stdout,
        re.M,
    )
    (root,) = (tmp_path / "runs").iterdir()
    r = cli("report", root.name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    page = Path(r.stdout.strip())
    page = page if page.is_absolute() else tmp_path / page
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    # The DOM after Chromium parsed it: every chart is there as SVG the browser understood.
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<svg") == 4  # loss, learning rate, tokens/s, perplexity (no GPU: no memory plot)
    assert (root / "output" / "sample.txt").read_text().strip() in dom.replace("&amp;", "&")
    # The screenshot, kept beside the test's other files (not committed): look at it.
    shot = tmp_path / "report.png"
    subprocess.run([*browser, "--window-size=1240,1500", f"--screenshot={shot}", page.as_uri()], timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000, "Chromium wrote no (or an empty) screenshot"
    print(f"screenshot: {shot}")


# ---------------------------------------------------------------- a resumed job's lineage


def attempt(runs: Path, name: str, steps: list[int], resumes: str | None = None) -> Path:
    """A local job folder with a train row per step (loss = 10 / step) and an eval at its end; a
    resume's plan names the job it resumed, as the local backend's summary does."""
    root = runs / name
    (root / "output").mkdir(parents=True)
    rows = [{"step": s, "train_loss": 10.0 / s, "lr": 1e-3} for s in steps]
    rows.append({"step": steps[-1], "eval_loss": 9.0 / steps[-1]})
    (root / "output" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"instance": "local"} | (
        {"resumes": f"{resumes} (lineage a-job: {runs}/a-job/checkpoints)"} if resumes else {}
    )
    (root / "job.json").write_text(json.dumps({"summary": summary}))
    (root / "status.json").write_text(json.dumps({"status": "Completed" if name == "c-job" else "Stopped"}))
    return root


def plotted_losses(page: Path) -> int:
    svg = (page.parent / "plots" / "loss.svg").read_text()
    return svg.count("<circle")


def test_a_resumed_jobs_report_plots_its_lineage_from_step_1(tmp_path, capsys, job_records, monkeypatch):
    from clirun import run_cli

    runs = tmp_path / "runs"
    attempt(runs, "a-job", [1, 2, 3])
    attempt(runs, "b-job", [3, 4, 5], resumes="a-job")  # step 3 again: its checkpoint was at 2
    attempt(runs, "c-job", [6, 7], resumes="b-job")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "report", "c-job")
    assert code == 0, err
    page = Path(out.strip())
    text = page.read_text()
    assert "lineage, oldest first: a-job (steps 1-3) &rarr; b-job (steps 3-5) &rarr; c-job (steps 6-7)" in text
    assert plotted_losses(page) == 7 + 3  # train steps 1-7 (step 3 once: the later attempt's) and 3 evals
    assert "<th>train_loss</th><td>1.429</td>" in text  # the final metrics are the last attempt's
    # A job folder given by path finds its lineage the same way.
    code, out, err = run_cli(capsys, "report", str(runs / "b-job"))
    assert code == 0 and "a-job (steps 1-3) &rarr; b-job (steps 3-5)</p>" in Path(out.strip()).read_text(), err


def test_an_attempt_whose_metrics_are_gone_is_named_and_the_rest_plotted(tmp_path, job_records):
    from distrain_cloud.launcher.plan import JobRef
    from distrain_cloud.launcher.report import lineage_folders

    runs = tmp_path / "runs"
    attempt(runs, "b-job", [3, 4], resumes="a-job")  # a-job's folder was deleted
    earlier, missing = lineage_folders(JobRef("b-job", "local", workdir=runs))
    assert earlier == [] and missing == [f"a-job: no metrics at {runs / 'a-job' / 'output' / 'metrics.jsonl'}"]
    page = write_report(runs / "b-job", earlier=earlier, missing=missing)
    assert "b-job (steps 3-4); not plotted: a-job: no metrics at " in page.read_text()


def test_a_loop_in_the_records_ends_the_lineage(tmp_path, job_records):
    from distrain_cloud.launcher.report import earlier_attempts

    job_records.mkdir(parents=True)
    for name, resumed in (("a-job", "b-job"), ("b-job", "a-job")):  # hand-edited: each resumes the other
        record = {"name": name, "backend": "local", "spec": {"resume_from": resumed}}
        (job_records / f"{name}.json").write_text(json.dumps(record))
    assert earlier_attempts("b-job", tmp_path) == ["a-job"]
    assert earlier_attempts("x-job", tmp_path) == []  # no record, no plan: its own lineage
