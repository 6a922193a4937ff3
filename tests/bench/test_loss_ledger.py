"""bench/loss_ledger.py: the recorded eval losses pooled by protocol and recipe, each run once, and
a results file from another machine that is not the bench's passed over."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ledger():
    spec = importlib.util.spec_from_file_location("loss_ledger", REPO / "bench" / "loss_ledger.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["loss_ledger"] = module  # its dataclasses look their module up while they are built
    spec.loader.exec_module(module)
    return module


# fp8's default recipe since session 33, as the ledger names it
DEFAULT_FP8 = "fp8 --fp8-head --fp8-head-backward bf16 --fp8-fast-accum grad-input --residual-dtype bf16 --rope-tables"
LOSS_400 = ("llama-1b", 2048, 8, 400, 0.0005)  # sessions 19-24's loss protocol, less corpus and eval


def _session(source: str) -> int:
    found = re.search(r"session(\d+)", source)
    return int(found.group(1)) if found else 0


def _pool(ledger, recipe: str, corpus: str):
    # the runs recorded up to session 24, whose figures its records quote: later runs join the pools
    runs = [r for r in ledger.read_runs() if _session(r.source) <= 24]
    for protocol, pools in ledger.pools(runs).items():
        if protocol[:5] == LOSS_400 and protocol[5].startswith(corpus):
            return next((p for p in pools if p.recipe == recipe), None)
    return None


def test_the_400_step_pools_hold_each_run_of_the_full_text_once(ledger):
    bf16 = _pool(ledger, "bf16", "c1f27e9535e1")
    head = _pool(ledger, "fp8 --fp8-head", "c1f27e9535e1")
    tensorwise = _pool(ledger, "fp8", "c1f27e9535e1")
    assert bf16 and head and tensorwise
    # session 20's bf16 run (1.4317) trained and evaluated on the first 4.1 M characters: not here
    assert sorted(bf16.losses) == pytest.approx([1.4164, 1.4264, 1.4538, 1.4590, 1.4721], abs=5e-5)
    assert _pool(ledger, "bf16", "8da41bb5af7f").losses == pytest.approx((1.4317,), abs=5e-5)
    # session 21's first call reported its one head run under two ids: counted once
    assert len(head.losses) == 8 and len(tensorwise.losses) == 5
    diff, err = ledger.compare(head, bf16)
    assert diff == pytest.approx(0.0139, abs=5e-4) and err == pytest.approx(0.0191, abs=5e-4)
    diff, _ = ledger.compare(tensorwise, bf16)
    assert diff == pytest.approx(-0.0060, abs=5e-4)


def _results(tmp_path: Path, name: str, runs: list, sha: str = "abc") -> None:
    meta = {"lm_corpus": {"sha256": sha}}
    (tmp_path / f"{name}.json").write_text(json.dumps({"meta": meta, "suites": {"llama": {"runs": runs}}}))


def _run(loss, flags: str = "", **extra) -> dict:
    cmd = (
        "python -m distrain_cloud.training.node_launch --processes 1 -- --task causal-lm --preset llama-1b "
        f"--block-size 2048 --batch-size 8 --max-steps 400 --lr 0.0005 --max-eval-samples 100 {flags}"
    )
    run = {"id": f"r{loss}", "impl": "ours", "model": "llama-1b", "complete": True, "cmd": cmd}
    return {**run, "final_eval_loss": loss, "final_train_loss": loss, "tokens_per_sec": 1.0, **extra}


def test_hostile_and_incomplete_results_are_passed_over(ledger, tmp_path):
    _results(tmp_path, "good", [_run(1.5), _run(1.6), _run(1.7, "--precision fp8")])
    _results(
        tmp_path,
        "odd",
        [
            _run(float("nan")),
            _run("1.2"),
            _run(1.1, complete=False),  # its timed windows did not finish
            _run(1.0, cmd=None),
            _run(1.0, cmd="no separator"),
            _run(1.0, "--precision nope"),  # a command that no longer parses
            _run(1.0, impl="hf_trainer"),
            _run(1.0, model="llama-1b\x1b[2J"),  # a terminal escape in the table's heading
            _run(1.0, model=["llama-1b"]),
            "not a run",
        ],
    )
    # unhashable figures and a hostile id and corpus: counted, the id shown as ?, the corpus unknown
    _results(tmp_path, "shapes", [_run(1.3, final_train_loss=[1], tokens_per_sec={}, id="r\n| x |")], sha="\x1b]0;")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{not json")
    _results(tmp_path, "other-text", [_run(1.9)], sha="def")
    runs = ledger.read_runs(tmp_path)
    odd = [r for r in runs if r.source == "shapes"]
    assert [(r.run, r.protocol[5], r.eval_loss) for r in odd] == [("?", "unknown", 1.3)]
    runs = [r for r in runs if r.source != "shapes"]
    assert sorted((r.recipe, r.eval_loss) for r in runs) == [("bf16", 1.5), ("bf16", 1.6), ("bf16", 1.9), ("fp8", 1.7)]
    text = ledger.render(runs)
    assert "| fp8 | 1 | 1.7000 | 1.7000 | – | +9.68% | – |" in text
    assert "corpus abc, eval on at most 100 samples (--max-eval-samples" in text
    assert "corpus def" not in text  # one recipe: no comparison


def test_a_run_joins_the_pool_of_the_stream_it_cast(ledger, tmp_path):
    """--residual-dtype auto (the default since session 25) casts Llama's stream to bf16 with no
    flag: the bench records what the trainer cast, and a run joins that recipe's pool. Files from
    before the field ran the flag's stream (fp32 unless told)."""
    _results(
        tmp_path,
        "runs",
        [
            _run(1.50),  # before session 25: no field, no flag
            _run(1.51, "--precision bf16 --residual-dtype bf16"),
            _run(1.52, residual_dtype="bf16"),  # auto's pick, as the trainer said
            _run(1.53, "--residual-dtype fp32", residual_dtype="fp32"),
            _run(1.54, residual_dtype="\x1b[2J"),  # not a dtype: passed over
        ],
    )
    got = sorted((r.recipe, r.eval_loss) for r in ledger.read_runs(tmp_path))
    assert got == [
        ("bf16", 1.50),
        ("bf16", 1.53),
        ("bf16 --residual-dtype bf16", 1.51),
        ("bf16 --residual-dtype bf16", 1.52),
    ]


def test_a_run_joins_the_pool_of_the_rope_it_read(ledger, tmp_path):
    """--rope-tables' default (session 27) tables a compiled model with no flag: the trainer's line,
    recorded by the bench, says which pool a run joins; older files ran the flag's (off unless given)."""
    _results(
        tmp_path,
        "runs",
        [
            _run(1.50, residual_dtype="bf16"),  # before session 27: no field, no flag
            _run(1.51, "--rope-tables", residual_dtype="bf16"),
            _run(1.52, residual_dtype="bf16", rope_tables="on"),  # auto's pick, as the trainer said
            _run(1.53, "--no-rope-tables", residual_dtype="bf16", rope_tables="off"),
            _run(1.54, residual_dtype="bf16", rope_tables="\x1b[2J"),  # not on or off: passed over
        ],
    )
    got = sorted((r.recipe, r.eval_loss) for r in ledger.read_runs(tmp_path))
    stream = "bf16 --residual-dtype bf16"
    assert got == [(stream, 1.50), (stream, 1.53), (f"{stream} --rope-tables", 1.51), (f"{stream} --rope-tables", 1.52)]


def test_an_fp8_run_joins_the_pool_of_the_recipe_it_resolved(ledger, tmp_path):
    """--precision fp8's auto recipe (session 33): the trainer's fp8 line, recorded by the bench,
    says which head and fast accumulation a run trained with; older files ran their flags, where
    nothing given meant the head bf16 and no fast accumulation."""
    new = "fp8 --fp8-head --fp8-head-backward bf16 --fp8-fast-accum grad-input --residual-dtype bf16"
    _results(
        tmp_path,
        "runs",
        [
            _run(1.40, "--precision fp8", residual_dtype="bf16"),  # before session 33: no field
            _run(1.41, "--precision fp8 --fp8-head", residual_dtype="bf16"),  # --fp8-head's backward was fp8
            _run(
                1.42,
                "--precision fp8",
                residual_dtype="bf16",
                fp8_fast_accum="grad-input",
                fp8_head="fp8+bf16-backward",
            ),
            _run(1.43, "--precision fp8 --fp8-head", residual_dtype="bf16", fp8_fast_accum="none", fp8_head="fp8"),
            _run(1.44, "--precision fp8", residual_dtype="bf16", fp8_fast_accum="grad-input", fp8_head="bf16"),
            _run(1.45, "--precision fp8", residual_dtype="bf16", fp8_fast_accum="none", fp8_head="fp8+bf16-x"),
            _run(1.46, "--precision fp8", residual_dtype="bf16", fp8_fast_accum="\x1b[2J", fp8_head="fp8"),
            _run(1.47, "--precision fp8", residual_dtype="bf16", fp8_head="bf16+bf16-forward"),
        ],
    )
    got = sorted((r.recipe, r.eval_loss) for r in ledger.read_runs(tmp_path))
    head = "fp8 --fp8-head --residual-dtype bf16"
    assert got == [
        ("fp8 --fp8-fast-accum grad-input --residual-dtype bf16", 1.44),
        (new, 1.42),
        (head, 1.41),
        (head, 1.43),
        ("fp8 --residual-dtype bf16", 1.40),
    ]


def test_an_fp8_run_joins_the_pool_of_the_layers_it_resolved(ledger, tmp_path):
    """Session 36's auto (e4m3 gradients, the query and key projections bf16): the trainer's line
    says what the layers ran; a run from before it, by its flags, ran e5m2 and every layer float8
    where they were not given; the same recipe by flags or by auto is one pool."""
    auto = dict(residual_dtype="bf16", fp8_fast_accum="grad-input", fp8_head="fp8+bf16-backward")
    _results(
        tmp_path,
        "runs",
        [
            _run(1.40, "--precision fp8", **auto),  # sessions 33-35: no layer fields
            _run(1.41, "--precision fp8", **auto, fp8_grad_dtype="e4m3", fp8_bf16_layers="q_proj,k_proj"),
            _run(1.42, "--precision fp8 --fp8-grad-dtype e4m3 --fp8-bf16-layers q_proj,k_proj", **auto),  # session 36
            _run(1.43, "--precision fp8", **auto, fp8_grad_dtype="e5m2", fp8_bf16_layers="none"),
            _run(
                1.44,
                "--precision fp8 --fp8-recipe rowwise",
                residual_dtype="bf16",
                fp8_fast_accum="none",
                fp8_head="bf16",
                fp8_grad_dtype="torchao",
                fp8_bf16_layers="none",
            ),  # fmt: skip
            _run(1.45, "--precision fp8", **auto, fp8_grad_dtype="e3m4", fp8_bf16_layers="none"),  # passed over
            _run(1.46, "--precision fp8", **auto, fp8_grad_dtype="e4m3", fp8_bf16_layers="\x1b[2J"),  # passed over
        ],
    )
    got = sorted((r.recipe, r.eval_loss) for r in ledger.read_runs(tmp_path))
    before = "fp8 --fp8-head --fp8-head-backward bf16 --fp8-fast-accum grad-input --residual-dtype bf16"
    now = (
        "fp8 --fp8-head --fp8-head-backward bf16 --fp8-grad-dtype e4m3 --fp8-fast-accum grad-input "
        "--fp8-bf16-layers q_proj,k_proj --residual-dtype bf16"
    )
    assert got == [
        (before, 1.40),
        (before, 1.43),
        (now, 1.41),
        (now, 1.42),
        ("fp8 --fp8-recipe rowwise --residual-dtype bf16", 1.44),
    ]


def test_the_command_prints_the_tables(ledger, capsys):
    assert ledger.main(["--model", "llama-1b"]) == 0
    out = capsys.readouterr().out
    assert "## llama-1b, sequence 2048, batch 8, 400 steps, lr 0.0005, corpus c1f27e9535e1" in out
    assert "| fp8 --fp8-head | " in out


def test_a_protocol_without_plain_bf16_is_compared_with_the_bf16_default(ledger):
    """The 200 steps at micro-batch 16 (sessions 34-35) ran the bf16 default and fp8's recipes only;
    a run that accumulates the same 16 sequences a step, or clips no gradient, is a recipe of its own."""
    out = ledger.render(ledger.read_runs(), "llama-1b")
    table = out.split("## llama-1b, sequence 2048, batch 16, 200 steps")[1].split("Runs:")[0]
    fp8 = next(line for line in table.splitlines() if line.startswith(f"| {DEFAULT_FP8} |"))
    # sessions 34-36: five runs against (2.0068 + 2.0169 + 2.0359 + 2.1022) / 4 (sessions 34, 36, 37)
    assert "| 5 | 2.0855, 2.1251, 2.1752, 2.1771, 2.2433 |" in fp8 and "| +5.92% |" in fp8
    # session 36's auto recipe, by its flags (sessions 36) and by `--precision fp8` alone (session 37):
    # one recipe as resolved, e4m3 gradients and the query and key projections bf16
    auto = next(line for line in table.splitlines() if "--fp8-bf16-layers q_proj,k_proj --residual" in line
                and "--fp8-grad-dtype e4m3" in line)  # fmt: skip
    assert "| 6 | 2.0025, 2.0431, 2.0534, 2.0541, 2.0956, 2.1152 |" in auto and "| +0.99% |" in auto
    accumulated = next(line for line in table.splitlines() if "--batch-size 8 --grad-accum 2 |" in line)
    assert "| 2.1134 |" in accumulated
    assert sum("--max-grad-norm 0.0 |" in line for line in table.splitlines()) == 2
    assert f"`{ledger.BF16_DEFAULT}` (the bf16 default" in table
    # where plain bf16 ran, it stays the reference
    micro8 = out.split("batch 8, 400 steps, lr 0.0005, corpus c1f27e9535e1")[1].split("Runs:")[0]
    assert "the bf16 default; this protocol" not in micro8
