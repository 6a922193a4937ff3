"""bench/run.py plans its runs without a GPU (--dry-run): the suites, the variants, and
the errors for a malformed --variant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dry_run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--dry-run", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def planned(r: subprocess.CompletedProcess, prefixes: tuple[str, ...] = ("# ours", "# HF")) -> dict[str, str]:
    """A dry run's plan: each run's label and the command printed under it."""
    lines = r.stdout.splitlines()
    return {
        lines[i].split("  [")[0][2:]: lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith(prefixes)
    }


def test_variants_add_runs_with_their_flags():
    r = dry_run(
        "--suite",
        "single,scaling,zero,varlen",
        "--gpus",
        "4",
        "--variant",
        "single:liger=--fused-ce --ce-kernel liger",
        "--variant",
        "scaling:bf16=--ddp-reduce-dtype bf16",
        "--variant",
        "scaling:ingraph=--strategy fsdp --compile-unit model",
        "--variant",
        "zero:layer=--no-zero3-block-fetch",
        "--variant",
        "varlen:pad1=--pad-to-multiple-of 1",
    )
    assert r.returncode == 0, r.stderr
    commands = planned(r)
    assert commands["ours +compile [liger]"].endswith("--compile --fused-ce --ce-kernel liger")
    # scaling variants: every count above 1, against the plain 1-GPU run
    assert "ours ddp x2 [bf16]" in commands and "ours ddp x4 [bf16]" in commands
    assert "ours ddp x1 [bf16]" not in commands
    assert commands["ours ddp x4 [bf16]"].endswith("--ddp-reduce-dtype bf16")
    assert "--processes 4" in commands["ours ddp x4 [bf16]"]
    fsdp = commands["ours fsdp x2 [ingraph]"]  # a variant's own strategy names its rows
    assert fsdp.endswith("--strategy fsdp --compile-unit model") and "--processes 2" in fsdp
    zero3_layer = commands["ours zero3 x4 [layer]"]
    assert "--strategy zero3" in zero3_layer and zero3_layer.endswith("--no-zero3-block-fetch")
    assert commands["ours (dynamic padding, length-grouped) [pad1]"].endswith("--pad-to-multiple-of 1")
    # the baselines are planned before the variants, so a deadline cuts variants first
    labels = list(commands)
    assert labels.index("HF Trainer compile") < labels.index("ours +compile [liger]")


def test_a_variants_name_value_words_set_its_environment_not_its_flags():
    """An A/B of an environment variable (an NCCL_ setting, say) in one invocation; the variables
    the GPU machines require cannot be changed."""
    r = dry_run(
        "--suite",
        "scaling,varlen",
        "--gpus",
        "2",
        "--variant",
        "scaling:chan=NCCL_MIN_NCHANNELS=16 --ddp-bucket-mb 1000",
        "--variant",
        "varlen:ring=NCCL_ALGO=Ring",
    )
    assert r.returncode == 0, r.stderr
    commands = planned(r)
    chan = commands["ours ddp x2 [chan]"]
    assert chan.startswith("env NCCL_MIN_NCHANNELS=16 python -m distrain_cloud.training.node_launch")
    assert chan.endswith("--ddp-bucket-mb 1000")
    assert commands["ours ddp x2"].startswith("python -m")
    assert commands["ours (dynamic padding, length-grouped) [ring]"].startswith("env NCCL_ALGO=Ring ")
    refused = dry_run("--suite", "scaling", "--gpus", "2", "--variant", "scaling:x=NCCL_NVLS_ENABLE=1")
    assert refused.returncode == 2
    assert "NCCL_NVLS_ENABLE must keep the value the GPU machines require" in refused.stderr


def test_malformed_variant_is_refused():
    r = dry_run("--suite", "single", "--gpus", "1", "--variant", "liger=--fused-ce")
    assert r.returncode == 2
    assert "--variant expects SUITE:NAME=FLAGS" in r.stderr


def test_an_only_that_matches_nothing_is_refused_before_anything_runs(tmp_path):
    """It used to run zero runs and then fail writing an empty table (a device call lost)."""
    flags = ("--suite", "single", "--gpus", "1", "--only", r"\+compile")
    planned_run = dry_run(*flags)
    real = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), *flags, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    for r in (planned_run, real):
        assert r.returncode == 2 and r.stdout == ""
        assert "bench: --only '\\+compile' matches no run id; the ids: ours-gpt2-small-ddp-g1-b16-k1," in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_suite_that_only_leaves_empty_is_not_planned():
    r = dry_run("--suite", "single,scaling", "--gpus", "2", "--only", "g2")
    assert r.returncode == 0, r.stderr
    assert "## suite single" not in r.stdout and "## suite scaling" in r.stdout
    assert list(planned(r)) == ["ours ddp x2"]


def test_bench_model_shapes_are_the_trainers_presets():
    sys.path.insert(0, str(REPO / "bench"))
    import _benchlib

    from distrain_cloud.training.modeling import PRESETS

    for name, shape in _benchlib.GPT2_SHAPES.items():
        preset = {k: v for k, v in PRESETS[name].items() if k != "model_type"}
        assert {k: v for k, v in shape.items() if v is not None} == preset, name
    for name, shape in _benchlib.LLAMA_SHAPES.items():
        assert {"model_type": "llama", **shape} == PRESETS[name], name


def test_the_entry_and_llama_suites_plan_the_entry_point_alone_and_llama_against_the_trainer():
    r = dry_run("--suite", "entry,llama", "--gpus", "1", "--variant", "llama:fp8=--precision fp8")
    assert r.returncode == 0, r.stderr
    plan = planned(r)
    entry = plan["ours, the entry point alone (no flags)"]
    assert "-m distrain_cloud.training --task" in entry and "node_launch" not in entry
    # no flag that would decide what its defaults must: precision, compile, strategy
    assert not any(f in entry.split() for f in ("--precision", "--compile", "--strategy"))
    assert "--max-steps 1000" in entry  # 1,000 steps: long enough that the default compiles
    assert "--model llama-1b --batch-size 8 --seq-len 2048" in plan["HF Trainer compile"]
    assert plan["ours llama-1b +compile [fp8]"].endswith("--compile --precision fp8")
    assert (
        "--preset llama-1b" in plan["ours llama-1b +compile"] and "--block-size 2048" in plan["ours llama-1b +compile"]
    )


def test_hf_liger_adds_the_compiled_trainer_with_ligers_kernels_as_a_second_baseline(tmp_path):
    r = dry_run("--suite", "llama,single", "--gpus", "1", "--llama-batch-size", "16", "--hf-liger")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    liger = [lines[i + 1] for i, x in enumerate(lines[:-1]) if x.startswith("# HF Trainer compile+liger")]
    # llama-1b's alone, at the suite's batch: Liger has no kernels for GPT-2 (the single suite's model),
    # where the Trainer would run without them under Liger's name
    assert len(liger) == 1 and liger[0].endswith("--compile --liger")
    assert "--model llama-1b --batch-size 16" in liger[0]
    assert planned(r)["HF Trainer compile"].endswith("--compile")  # the plain baseline stays beside it
    # and eager with Liger: its fused loss fails under torch.compile on torch 2.11 (session 34)
    eager = [lines[i + 1] for i, x in enumerate(lines[:-1]) if x.startswith("# HF Trainer defaults+liger")]
    assert len(eager) == 1 and eager[0].endswith("--liger") and "--compile" not in eager[0]
    assert "--liger" not in dry_run("--suite", "llama", "--gpus", "1").stdout  # only when asked
    bench = _bench()
    ctx = bench.Ctx(bench.parse_args(["--hf-liger"]), 1, tmp_path, tmp_path, tmp_path, tmp_path, False, 1e15)
    runs = bench.build_suites(ctx, ["llama"])["llama"]
    # a machine without liger-kernel skips that run, not the suite
    assert [x.needs for x in runs if "-compile-liger-g1-b8" in x.id] == [("transformers", "liger_kernel")]
    # the baseline itself refuses Liger where it has no kernels (the Trainer would run without them)
    baseline = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hf_trainer_baseline.py"), "--tiny", "--liger"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert baseline.returncode == 2 and "--liger applies to --model llama-1b" in baseline.stderr, baseline.stderr


def test_recorded_commands_name_no_machine_paths(tmp_path):
    """Commands are recorded (logs, results.json, this plan) relative to the repository and
    the work folder, so committed measurements carry no machine's paths."""
    r = dry_run("--suite", "single,varlen", "--gpus", "1", "--work-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    for path in (sys.executable, str(REPO), str(tmp_path)):
        assert path not in r.stdout
    assert "python bench/hf_trainer_baseline.py" in r.stdout and "$WORK/data/lm_corpus.txt" in r.stdout


def test_zero_and_xl_variants_may_name_their_strategy():
    r = dry_run(
        "--suite",
        "zero,xl",
        "--gpus",
        "2",
        "--variant",
        "zero:unit3=--strategy fsdp --compile --fsdp-blocks-per-unit 3",
        "--variant",
        "xl:accum4=--strategy ddp --grad-accum 4",
    )
    assert r.returncode == 0, r.stderr
    commands = planned(r, ("# ours",))
    unit3 = commands["ours fsdp x2 [unit3]"]
    assert "--strategy fsdp" in unit3 and "--strategy zero3" not in unit3
    assert unit3.endswith("--compile --fsdp-blocks-per-unit 3")
    accum4 = commands["ours gpt2-xl ddp x2 [accum4]"]
    assert "--strategy ddp" in accum4 and accum4.endswith("--grad-accum 4")
    # The run is named (and tabled) by the accumulation it really uses, not the suite's 1.
    flags = ("--suite", "xl", "--gpus", "2", "--variant", "xl:accum4=--strategy ddp --grad-accum 4", "--only")
    assert list(planned(dry_run(*flags, "ddp-g2-b4-k4-accum4$"), ("# ours",))) == ["ours gpt2-xl ddp x2 [accum4]"]
    assert planned(dry_run(*flags, "k1-accum4$"), ("# ours",)) == {}


def _log(*steps: int) -> str:
    """A trainer log: a step line per window (tokens/s 100 * step), a profile of steps 32-34."""
    lines = [f"step={s} train_loss=1.0 tokens_per_sec={100 * s} step_time=0.04" for s in steps]
    return "\n".join([*lines, "profile_steps=32-34 profile_gpu_busy_ms=50"])


def _bench():
    """bench/run.py as a module."""
    import importlib.util

    sys.path.insert(0, str(REPO / "bench"))  # for its _benchlib
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = bench  # dataclasses look their module up while the class is built
    spec.loader.exec_module(bench)
    return bench


def test_a_failed_runs_tracebacks_are_kept_beside_its_log(tmp_path):
    """Session 11 spent device calls on a traceback the bench deleted with the run's folder."""
    output, logs = tmp_path / "run" / "output", tmp_path / "logs"
    output.mkdir(parents=True)
    logs.mkdir()
    (output / "traceback.txt").write_text("rank 0")
    (output / "traceback-rank1.txt").write_text("rank 1")
    (output / "metrics.jsonl").write_text("{}")
    kept = _bench().keep_tracebacks(output, logs / "ours-x-ca.log")
    assert [p.name for p in kept] == ["ours-x-ca.traceback-rank1.txt", "ours-x-ca.traceback.txt"]
    assert (logs / "ours-x-ca.traceback.txt").read_text() == "rank 0"


def test_the_median_leaves_out_the_windows_the_profiler_slowed(tmp_path):
    bench = _bench()
    run = bench.Run("r", "ours", "r", [], 2, "gpt2-small", "lm", "ddp", 1024, 16, 1, 30, 10, 10, 60)
    res = bench.parse_ours(run, tmp_path / "missing.jsonl", _log(10, 20, 30, 40))
    # windows (10,20], (20,30] and (30,40]; the last holds the profiled steps 32-34
    assert res["windows"] == [[10, 20], [20, 30]] and res["tokens_per_sec"] == 2500
    assert res["profiled_windows"] == [[30, 40, 4000.0]] and res["profile"]["profile_steps"] == "32-34"
    # when every timed window was profiled, they are all that is left to report
    only = bench.parse_ours(run, tmp_path / "missing.jsonl", _log(10, 40))
    assert only["windows"] == [[10, 40]] and "profiled_windows" not in only


@pytest.mark.slow  # two short trainings of 2 processes each: about 20 s
def test_host_overhead_runs_each_strategy_and_tables_its_host_phases(tmp_path):
    """bench/host_overhead.py end to end on 2 CPU processes, short: one row per strategy with its
    step time and the trainer's profiled host phases, and the same losses for ddp and fsdp."""
    import json

    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "host_overhead.py"), "--steps", "20", "--log-every", "5"]
        + ["--profile-steps", "16:18", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "host_overhead.json").read_text())["rows"]
    assert [row["strategy"] for row in rows] == ["ddp", "fsdp"]
    for row in rows:
        assert row["step_ms"] > 0 and set(row["host_ms"]) == {"forward", "backward", "clip", "optimizer"}
        assert len(row["step_ms_windows"]) == 2  # (5,10] and (10,15]: the first warms up, (15,20] was profiled
    assert rows[0]["final_train_loss"] == pytest.approx(rows[1]["final_train_loss"], rel=1e-6)  # 6 digits, as logged
    assert "| fsdp |" in (tmp_path / "host_overhead.md").read_text()


@pytest.mark.slow  # two gloo processes building two small sharded models: about 10 s
def test_shard_adamw_times_both_optimizer_steps_and_both_clips_side_by_side():
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [str(REPO / "bench" / "shard_adamw.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| fused AdamW on DTensors (before)",
        "| shard_local_adamw (now)",
        "| clip, placements checked each step (before)",
        "| clip, sharded parameters found once (now)",
    ]
    assert all(row.endswith(" ms a step |") for row in rows)


@pytest.mark.slow  # two gloo processes compiling three small models: about 30 s
def test_graph_sharding_trains_like_ddp_with_its_collectives_in_one_graph():
    """bench/graph_sharding.py, issue 15 P4's experiment: every weight a shard that the compiled graph
    all-gathers (and, recomputing, all-gathers again for the backward) gives DDP's losses, as one
    graph with no breaks, before any GPU time is spent on its speed; so do blocks compiled alone,
    one graph serving every block."""
    sides = ("graph-bucketed-recompute", "graph-blocks-recompute")  # the whole graph; one graph for every block
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [str(REPO / "bench" / "graph_sharding.py"), "--cpu", "--sides", ",".join(("ddp", *sides))],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    table = [line.strip("| ").split(" | ") for line in r.stdout.splitlines() if line.startswith("| ")]
    header, rows = table[0], {cells[0]: dict(zip(table[0], cells, strict=True)) for cells in table[1:]}
    assert {"ddp", *sides} <= rows.keys(), header
    for side in sides:
        assert (rows[side]["graphs"], rows[side]["graph breaks"]) == ("1", "0"), rows[side]
        assert rows[side]["last losses"] == rows["ddp"]["last losses"]  # to 4 decimals


# A run that outlives its timeout: it dies of the bench's SIGTERM, but its worker moved to a session
# of its own (as torchrun's workers do) and ignores SIGTERM.
STUCK_RUN = """
import signal, subprocess, sys, time
deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
worker = subprocess.Popen([sys.executable, "-c", deaf], start_new_session=True)
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(600)
"""


def _stuck_worker_survives(pid_file: Path, stop) -> bool:
    """Whether STUCK_RUN's worker (its pid in `pid_file`) is still alive just after `stop()`, which
    times the run out; the worker is killed either way, so a failing test leaves nothing behind."""
    import time

    try:
        stop()
        worker = int(pid_file.read_text())
        time.sleep(0.2)
        return Path(f"/proc/{worker}").exists() and " Z " not in Path(f"/proc/{worker}/stat").read_text()
    finally:
        if pid_file.is_file():
            subprocess.run(["kill", "-9", pid_file.read_text()], capture_output=True, check=False)


@pytest.mark.slow  # a 2 s timeout and a 0.5 s grace
def test_a_runs_timeout_ends_its_whole_process_tree(tmp_path):
    """A timed-out run's rank stayed alive over 14 minutes holding 8.8 GiB of a GPU: the bench
    killed the run's process group, and torchrun's workers lead sessions of their own."""
    import argparse
    import time

    bench = _bench()
    pid_file = tmp_path / "worker.pid"
    ctx = bench.Ctx(
        argparse.Namespace(compile_cache="per-run"), 0, tmp_path, tmp_path, tmp_path, tmp_path, cpu=True, peak=1.0
    )
    runner = bench.Runner(ctx, tmp_path / "out", None, None)
    runner.stop_grace_s = 0.5
    cmd = [sys.executable, "-c", STUCK_RUN, str(pid_file)]
    run = bench.Run("stuck", "hf_trainer", "stuck", cmd, 1, "tiny-gpt2", "lm", "ddp", 128, 1, 1, 1, 0, 1, timeout=2)
    started = time.monotonic()
    res: dict = {}
    alive = _stuck_worker_survives(pid_file, lambda: res.update(runner.execute(run)))
    assert res["status"] == "TIMEOUT (2s)"
    assert not alive, "the run's worker outlived its timeout"
    assert time.monotonic() - started < 10


# A run that finished its work (its windows, its eval and the trainer's done: line) and then hung
# while exiting, as llama-1b's processes did for over 10 s on an H200 when a deadline's clamp came.
DONE_THEN_SLOW_EXIT = """
import sys, time
for step in (5, 10):
    print(f"step={step} train_loss={3.0 / step} tokens_per_sec=1000.0 step_time=0.1", flush=True)
print("step=10 eval_loss=0.5", flush=True)
print("done: 10 steps in 0m01s of training, after 1s of setup" if sys.argv[1] == "done" else "", flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # two 2 s timeouts
@pytest.mark.parametrize("last, status", [("done", "ok"), ("nothing", "TIMEOUT (2s)")])
def test_a_run_stopped_while_exiting_after_its_done_line_keeps_its_figures(tmp_path, last, status):
    import argparse

    bench = _bench()
    ctx = bench.Ctx(
        argparse.Namespace(compile_cache="per-run"), 0, tmp_path, tmp_path, tmp_path, tmp_path, cpu=True, peak=1.0
    )
    runner = bench.Runner(ctx, tmp_path / "out", None, None)
    runner.stop_grace_s = 0.5
    cmd = [sys.executable, "-c", DONE_THEN_SLOW_EXIT, last]
    run = bench.Run("slow-exit", "ours", "slow-exit", cmd, 1, "tiny-gpt2", "lm", "ddp", 128, 1, 1, 10, 0, 5, timeout=2)
    res = runner.execute(run)
    assert res["status"] == status
    assert res["tokens_per_sec"] == 1000.0 and res["complete"]
    if status == "ok":  # no error fields, and a note that says what happened
        assert "error" not in res and res["note"] == "stopped at its 2s limit while exiting, after its done: line"


FAKE_NVIDIA_SMI = """#!/bin/sh
# --query-compute-apps: the lines of $FAKE_APPS while it exists; any other query: nothing
case "$*" in *query-compute-apps*) [ -f "$FAKE_APPS" ] && cat "$FAKE_APPS";; esac
exit 0
"""


def _busy_runner(tmp_path, monkeypatch, *, allow: bool):
    """A GPU (not --cpu-smoke) Runner over a fake nvidia-smi whose compute apps are tmp_path/apps,
    and a run that only leaves a mark that it started."""
    import argparse

    bench = _bench()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APPS", str(tmp_path / "apps"))
    a = argparse.Namespace(allow_busy_gpus=allow, compile_cache="shared")
    ctx = bench.Ctx(a, 1, tmp_path, tmp_path, tmp_path, tmp_path, False, 1.0)
    runner = bench.Runner(ctx, tmp_path / "out", None, None)
    runner.busy_wait_s = 0.3
    mark = tmp_path / "started"
    cmd = [sys.executable, "-c", f"open({str(mark)!r}, 'w').write('x')"]
    run = bench.Run("r", "hf_trainer", "r", cmd, 1, "gpt2-small", "lm", "single", 128, 1, 1, 1, 0, 1, timeout=60)
    return runner, run, mark


def test_a_run_is_not_timed_while_another_process_holds_the_gpus(tmp_path, monkeypatch):
    """A stray rank of a timed-out run made a 2-GPU row read 46% weak scaling instead of 96.8%."""
    runner, run, mark = _busy_runner(tmp_path, monkeypatch, allow=False)
    (tmp_path / "apps").write_text("4242, 8800 MiB\n")
    res = runner.execute(run)
    assert res["status"] == "SKIPPED (GPUs busy: pid 4242 (8800 MiB))"
    assert not mark.exists(), "the run started beside the other process"


def test_allow_busy_gpus_times_the_run_and_marks_its_row(tmp_path, monkeypatch):
    runner, run, mark = _busy_runner(tmp_path, monkeypatch, allow=True)
    (tmp_path / "apps").write_text("4242, 8800 MiB\n4243, 1200 MiB\n")
    res = runner.execute(run)
    assert mark.exists()
    assert res["status"].endswith("(GPUs busy: pid 4242 (8800 MiB), pid 4243 (1200 MiB))"), res["status"]


def test_free_gpus_time_the_run_as_before(tmp_path, monkeypatch):
    runner, run, mark = _busy_runner(tmp_path, monkeypatch, allow=False)
    (tmp_path / "apps").write_text("No running processes found\n")
    res = runner.execute(run)
    assert mark.exists() and "busy" not in res["status"]


@pytest.mark.parametrize("mode", ["shared", "per-run"])
def test_the_runs_of_one_invocation_share_one_compile_cache_unless_told(tmp_path, monkeypatch, mode):
    """shared: every run reads and fills one Inductor cache in the work folder (a --repeat run then
    skips most of its compile); per-run: none is set, so each job keeps its own beside its
    checkpoints (training/contract.py), even where the bench's own environment names one."""
    bench = _bench()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "the-callers"))
    ctx = bench.Ctx(bench.parse_args(["--compile-cache", mode]), 1, tmp_path, tmp_path, tmp_path, tmp_path, True, 1.0)
    runner = bench.Runner(ctx, tmp_path / "out", None, None)
    seen = tmp_path / "seen"
    code = f"import os; open({str(seen)!r}, 'a').write(os.environ.get('TORCHINDUCTOR_CACHE_DIR', '-') + '\\n')"
    for name in ("r1", "r2"):
        run = bench.Run(name, "hf_trainer", name, [sys.executable, "-c", code], 1, "gpt2-small", "lm", "single",
                        128, 1, 1, 1, 0, 1, timeout=60)  # fmt: skip
        runner.execute(run)
    expected = str(tmp_path / "compile-cache") if mode == "shared" else "-"
    assert seen.read_text().splitlines() == [expected, expected]


def test_the_lm_text_is_the_standard_librarys_source_not_repeated(tmp_path):
    """The default LM data (--lm-data stdlib) is real text that never repeats, cut to what the runs
    need, and named exactly (files, characters, sha256) so two results can tell they trained on it."""
    import hashlib

    bench = _bench()
    lib = bench.lib
    info = lib.write_stdlib_corpus(tmp_path / "a.txt", max_chars=300_000)
    text = (tmp_path / "a.txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert info["chars"] == len(text) >= 300_000 and info["files"] >= 2
    assert info["sha256"] == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert all(line.strip() for line in lines)  # blank lines dropped: no empty documents
    # not a text repeated (corpus.txt's copies share every line): most lines are unique
    assert len(set(lines)) > 0.5 * len(lines)
    again = lib.write_stdlib_corpus(tmp_path / "b.txt", max_chars=300_000)
    assert again == info  # deterministic: the same files in the same order


def test_the_llama_suite_compares_each_variants_eval_loss(tmp_path):
    bench = _bench()
    metrics = tmp_path / "m.jsonl"
    rows = [{"step": 20, "train_loss": 2.0, "tokens_per_sec": 100.0}, {"step": 40, "train_loss": 1.5,
            "tokens_per_sec": 110.0}, {"step": 40, "eval_loss": 1.6, "eval_perplexity": 4.95}]  # fmt: skip
    metrics.write_text("\n".join(__import__("json").dumps(r) for r in rows))
    run = bench.Run("r", "ours", "r", [], 1, "llama-1b", "lm", "ddp", 2048, 8, 1, 20, 20, 20, 60)
    res = bench.parse_ours(run, metrics, "setup: ...\nfirst_step_s=101.7 compile_cache_hits=12\ncompiled_graphs=1\n")
    assert (res["final_train_loss"], res["final_eval_loss"], res["tokens_per_sec"]) == (1.5, 1.6, 110.0)
    assert res["train_loss_curve"] == [[20, 2.0], [40, 1.5]]  # a steady lag and a spike read apart
    with metrics.open("a") as f:  # rows no trainer writes: no step, a loss that is not a number
        f.write('\n{"train_loss": 1.0}\n{"step": 60, "train_loss": "1.2"}\n{"step": "x", "train_loss": 1.1}')
    assert bench.parse_ours(run, metrics, "")["train_loss_curve"] == [[20, 2.0], [40, 1.5]]
    assert (res["first_step_s"], res["compile_cache_hits"]) == (101.7, 12)
    eager = bench.parse_ours(run, metrics, "first_step_s=0.4\n")
    assert eager["first_step_s"] == 0.4 and "compile_cache_hits" not in eager
    # the residual stream as the trainer cast it (auto picks per model): no line, nothing cast
    assert res["residual_dtype"] == "fp32"
    cast = "residual_dtype=bf16 (--residual-dtype auto: a Llama-style causal LM under bf16 autocast: ...)\n"
    assert bench.parse_ours(run, metrics, cast)["residual_dtype"] == "bf16"
    # and the rope tables (auto tables a compiled model): no line, the module's own forward
    assert res["rope_tables"] == "off"
    tabled = "rope_tables=on (1 LlamaRotaryEmbedding: ...; auto: the model is compiled)\n"
    assert bench.parse_ours(run, metrics, tabled)["rope_tables"] == "on"
    kept = "rope_tables=off (auto: GPT2LMHeadModel has no rotary embedding module)\n"
    assert bench.parse_ours(run, metrics, kept)["rope_tables"] == "off"
    # and fp8's recipe as the trainer resolved it (tests/training/test_fp8_linear.py checks the line)
    assert "fp8_head" not in res and "fp8_fast_accum" not in res
    line = ("fp8=on linear_layers=112 fast_accum=grad-input head=fp8+bf16-backward (float8 on torch._scaled_mm, "
            "tensorwise scaling, fast accumulation in the input gradients too; the LM head in float8 inside the fast "
            "loss, its backward bf16)\n")  # fmt: skip
    fp8_res = bench.parse_ours(run, metrics, line)
    assert (fp8_res["fp8_head"], fp8_res["fp8_fast_accum"]) == ("fp8+bf16-backward", "grad-input")
    assert "fp8_grad_dtype" not in fp8_res and "fp8_bf16_layers" not in fp8_res  # a trainer before session 36
    line36 = ("fp8=on linear_layers=80 fast_accum=grad-input head=fp8+bf16-backward grads=e4m3 "
              "bf16_layers=q_proj,k_proj (float8 on torch._scaled_mm, ...)\n")  # fmt: skip
    res36 = bench.parse_ours(run, metrics, line36)
    assert (res36["fp8_grad_dtype"], res36["fp8_bf16_layers"], res36["fp8_head"]) == (
        "e4m3",
        "q_proj,k_proj",
        "fp8+bf16-backward",
    )
    ctx = bench.Ctx(bench.parse_args(["--suite", "llama"]), 1, tmp_path, tmp_path, tmp_path, tmp_path, False, 1e15)
    base = bench.Run("b", "ours", "ours", [], 1, "llama-1b", "lm", "ddp", 2048, 8, 1, 20, 20, 20, 60, result=res)
    fp8 = bench.Run("v", "ours", "ours", [], 1, "llama-1b", "lm", "ddp", 2048, 8, 1, 20, 20, 20, 60, variant="fp8",
                    result={**res, "tokens_per_sec": 121.0, "final_eval_loss": 1.616})  # fmt: skip
    lines, out = bench.summarize("llama", [base, fp8], ctx)
    assert out["fp8_over_ours"] == pytest.approx(1.1) and out["fp8_eval_loss_rel"] == pytest.approx(0.01)
    assert "eval loss after step 40: 1.6160 vs 1.6000 (**+1.00%**)" in lines[0]


def test_the_xl_suite_runs_the_8b_llama_at_its_sequence_length():
    r = dry_run("--suite", "xl", "--gpus", "4", "--xl-preset", "llama-8b", "--xl-strategies", "zero3,fsdp")
    assert r.returncode == 0, r.stderr
    plan = planned(r)
    assert {"ours llama-8b zero3 x4", "ours llama-8b fsdp x4"} <= set(plan)
    assert "--preset llama-8b" in plan["ours llama-8b fsdp x4"] and "--block-size 2048" in plan["ours llama-8b fsdp x4"]
    assert "= the Python standard library's source, not repeated: the first" in r.stdout  # the default text


def test_repeat_runs_each_selected_command_again_under_its_own_id():
    """--repeat 3: the run --only keeps, twice more, each a run of its own (two variants with the
    same flags are one run reported twice) and compared with the plain run as a variant."""
    r = dry_run(
        "--suite", "llama", "--gpus", "1", "--variant", "llama:fp8h=--precision fp8 --fp8-head",
        "--only", "k1-fp8h$", "--repeat", "3",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "# 3 unique runs, 3 table rows" in r.stdout and "reused" not in r.stdout
    labels = [line[2:].split("  [")[0] for line in r.stdout.splitlines() if line.startswith("# ours")]
    assert labels[:3] == [
        "ours llama-1b +compile [fp8h]",
        "ours llama-1b +compile [fp8h] (run 2)",
        "ours llama-1b +compile [fp8h] (run 3)",
    ], labels
    commands = planned(r)
    assert commands["ours llama-1b +compile [fp8h] (run 3)"] == commands["ours llama-1b +compile [fp8h]"]
    same = dry_run("--suite", "llama", "--gpus", "1", "--variant", "llama:a=--precision fp8",
                   "--variant", "llama:b=--precision fp8", "--only", "k1-a$|k1-b$")  # fmt: skip
    assert "(same run as above; reused)" in same.stdout and "# 1 unique runs, 2 table rows" in same.stdout
    refused = dry_run("--suite", "llama", "--repeat", "0")
    assert refused.returncode == 2 and "--repeat must be 1 or more, got 0" in refused.stderr


def test_the_source_sha_names_the_python_a_run_executes(tmp_path):
    """results.json's source_sha: the same for the same sources wherever they are, different when
    one byte of one file changes, blind to caches and to files outside the sources' folders."""
    run = _bench()

    def tree(root: Path, body: str) -> str:
        for d in run.SOURCE_DIRS:
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "training" / "trainer.py").write_text(body)
        (root / "bench" / "run.py").write_text("x = 1\n")
        return run.source_sha(root)

    first = tree(tmp_path / "a", "step = 1\n")
    assert first == tree(tmp_path / "b", "step = 1\n")  # where the checkout sits does not count
    (tmp_path / "b" / "training" / "__pycache__").mkdir()
    (tmp_path / "b" / "training" / "__pycache__" / "trainer.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "b" / "notes.py").write_text("outside the sources\n")
    assert run.source_sha(tmp_path / "b") == first
    assert tree(tmp_path / "c", "step = 2\n") != first
    printed = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--source-sha"], capture_output=True, text=True, check=True
    )
    assert printed.stdout.strip() == run.source_sha() and len(printed.stdout.strip()) == 16


@pytest.mark.parametrize(
    "flags, torchao",
    [
        (["--precision", "fp8"], False),  # the native layers: torch alone
        (["--precision", "fp8", "--fp8-linear", "torchao"], True),
        (["--precision", "fp8", "--fp8-recipe", "rowwise"], True),
        (["--precision", "fp8", "--fp8-linear", "torchao", "--precision", "bf16"], False),  # the last one wins
        ([], False),
    ],
)
def test_a_run_needs_torchao_only_for_torchaos_float8_layers(flags, torchao):
    needs = _bench().packages_needed(["python", "-m", "x", "--strategy", "ddp", *flags], "ddp")
    assert ("torchao" in needs) == torchao and "deepspeed" not in needs


@pytest.mark.slow  # a 2 s timeout and a 0.5 s grace
def test_host_overheads_timeout_ends_its_whole_process_tree_too(tmp_path, monkeypatch):
    """bench/host_overhead.py's runs go through the same stop: its timeout once ended node_launch
    alone, and the training processes below it went on."""
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("host_overhead", REPO / "bench" / "host_overhead.py")
    assert spec is not None and spec.loader is not None
    host_overhead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_overhead)
    # The deaf worker ignores the SIGTERM, so it used up the whole 10 s grace the script asks for
    # before its SIGKILL: the stop itself, with the grace it was asked for, on a grace of 0.5 s (as
    # the bench runner's test above), the tree killed just the same.
    real_stop, graces = host_overhead.lib.stop_process_tree, []

    def short_grace(p: subprocess.Popen, grace_s: float) -> None:
        graces.append(grace_s)
        real_stop(p, grace_s=0.5)

    monkeypatch.setattr(host_overhead.lib, "stop_process_tree", short_grace)
    pid_file = tmp_path / "worker.pid"
    started = time.monotonic()

    def stop() -> None:
        with pytest.raises(subprocess.TimeoutExpired):
            host_overhead.run_to_end([sys.executable, "-c", STUCK_RUN, str(pid_file)], dict(os.environ), timeout_s=2)

    alive = _stuck_worker_survives(pid_file, stop)
    assert not alive, "the run's worker outlived its timeout"
    assert graces == [10.0]  # the whole tree's stop, as the script calls it
    assert time.monotonic() - started < 20
