"""Every task trains on the offline defaults: the loss falls, evaluation reports its metrics,
the model folder is complete, and W&B (no API key) writes an offline run under the output."""

from __future__ import annotations

import gzip
import json
import math

import pytest

pytestmark = pytest.mark.slow

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MODEL_FILES = ("config.json", "model.safetensors", "training_args.json", *TOKENIZER_FILES)

# (flags, eval metrics that must be there); 10 logged windows each, a few seconds on 2 cores.
TASKS = {
    "classification-tiny-gpt2": (
        ["--task", "classification", "--preset", "tiny-gpt2", "--max-steps", "150"],
        ("eval_accuracy", "eval_f1_macro"),
    ),
    "classification-tiny-bert": (
        ["--task", "classification", "--preset", "tiny-bert", "--max-steps", "150"],
        ("eval_accuracy", "eval_f1_macro"),
    ),
    "causal-lm": (["--task", "causal-lm", "--max-steps", "60"], ("eval_perplexity",)),
    "masked-lm": (["--task", "masked-lm", "--preset", "tiny-bert", "--max-steps", "60"], ("eval_perplexity",)),
}


def log_every(flags: list[str]) -> int:
    return int(flags[flags.index("--max-steps") + 1]) // 10


@pytest.fixture(scope="module")
def task_runs(module_train):
    """One run per task, two at a time (each is a single process, on one core)."""
    jobs = [
        {"flags": [*flags, "--lr", "2e-3", "--log-every", str(log_every(flags)), "--report-to", "none"], "name": case}
        for case, (flags, _) in TASKS.items()
    ]
    return dict(zip(TASKS, module_train.many(jobs), strict=True))


@pytest.mark.parametrize("case", list(TASKS))
def test_task_trains_and_saves_a_complete_model(task_runs, case):
    flags, eval_keys = TASKS[case]
    steps = int(flags[flags.index("--max-steps") + 1])
    every = log_every(flags)
    run = task_runs[case]
    assert run.returncode == 0, run.describe()

    # The loss falls: the first logged window against the last.
    losses = run.train_losses
    assert sorted(losses) == list(range(every, steps + 1, every)), run.describe()
    first, last = losses[every], losses[steps]
    assert all(math.isfinite(v) for v in losses.values())
    assert last < 0.9 * first, f"{case}: loss did not fall: {losses}"
    # The same numbers on stdout, as key=value lines.
    assert len(run.lines("step=")) == len(run.metrics)
    assert any(f"step={steps} train_loss=" in line for line in run.lines("step="))

    # One evaluation, at the end, with the task's metrics.
    final = run.final_eval
    assert final["step"] == steps and len(run.evals) == 1
    for key in ("eval_loss", "eval_samples", *eval_keys):
        assert math.isfinite(final[key]), (key, final)
    eval_line = [line for line in run.lines(f"step={steps} ") if "eval_loss=" in line]
    assert len(eval_line) == 1 and all(f" {k}=" in eval_line[0] for k in eval_keys), run.stdout
    if "eval_accuracy" in eval_keys:
        assert 0.0 <= final["eval_accuracy"] <= 1.0 and 0.0 <= final["eval_f1_macro"] <= 1.0
        assert final["eval_samples"] == 150  # 10% of the 1500 builtin sentiment examples
    else:
        assert final["eval_perplexity"] == pytest.approx(math.exp(final["eval_loss"]), rel=1e-9)
        assert final["eval_perplexity"] < 1000  # it learned something about a 746-token vocabulary

    # The model folder: weights, config, tokenizer and the resolved arguments.
    model_dir = run.contract.model_dir
    for name in MODEL_FILES:
        assert (model_dir / name).is_file(), f"{name} missing from {sorted(p.name for p in model_dir.iterdir())}"
    saved = json.loads((model_dir / "training_args.json").read_text())
    assert saved["task"] == flags[1] and saved["world_size"] == 1 and saved["max_steps_resolved"] == steps
    assert saved["final_metrics"] == {k: v for k, v in final.items() if k != "step"}
    assert run.lines("model_saved=") == [f"model_saved={model_dir}"]
    # Nothing but metrics.jsonl (and a causal LM's sample) in the output folder (W&B is off), nothing in the cwd.
    sample = ["sample.txt"] if case == "causal-lm" else []
    assert sorted(p.name for p in run.contract.output_dir.iterdir()) == ["metrics.jsonl", *sample]
    assert list(run.contract.workdir.iterdir()) == []

    samples = run.lines("sample=")
    if case == "causal-lm":
        assert len(samples) == 1, run.stdout
        text = json.loads(samples[0][len("sample=") :])
        assert text.startswith("The") and len(text) > len("The"), text
        assert (run.contract.output_dir / "sample.txt").read_text() == text + "\n"  # for the report
    else:
        assert samples == []


HUB_TOKEN = "hf_test_not_a_real_token_123"
WANDB_RUN_ID = "offline-job-20250101-000000-abcdef"  # the run id a launcher chose (launcher/tracking.py)


@pytest.fixture(scope="module")
def wandb_and_hub(module_train):
    """One short job on the defaults for the two tests below (each was a run of its own): --report-to
    at its default, wandb, with no API key (base_env strips WANDB_API_KEY, WANDB_MODE and WANDB_DIR),
    and the final model pushed to a local HTTP double of the Hub's API, the token taken from the
    environment at run time. Returns the run and what the Hub double holds after it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from hubdouble import HubDouble

    with HubDouble() as hub:
        run = module_train(
            "--max-steps",
            "4",
            "--log-every",
            "2",
            "--save-every",
            "4",
            "--push-to-hub",
            "me/tiny",
            "--hub-private",
            "--hub-revision",
            "exp",
            name="wandb-push",
            env={
                "DISTRAIN_WANDB_RUN_ID": WANDB_RUN_ID,
                "HF_ENDPOINT": hub.url,
                "HF_TOKEN": HUB_TOKEN,
                "HF_HUB_OFFLINE": "0",
                "HF_HUB_DISABLE_TELEMETRY": "1",
            },
        )
        assert run.returncode == 0, run.describe()
        hub_state = {
            "files": hub.files("me/tiny", branch="exp"),  # --hub-revision: the branch, made from main
            "main": hub.files("me/tiny"),
            "commit_url": f"{hub.url}/me/tiny/commit/{hub.repo('me/tiny').branches['exp'].head}",
            "private": hub.repo("me/tiny").private,
        }
    return run, hub_state


def test_wandb_without_api_key_writes_an_offline_run_under_the_output_dir(wandb_and_hub):
    run, _ = wandb_and_hub
    wandb_dir = run.contract.output_dir / "wandb"
    runs = sorted(wandb_dir.glob("offline-run-*"))
    assert len(runs) == 1, sorted(p.name for p in run.contract.output_dir.rglob("*"))
    assert list(runs[0].glob("*.wandb")), sorted(p.name for p in runs[0].iterdir())
    # The run id is kept in the checkpoint state, so a resumed job appends to the same run.
    (ckpt,) = run.contract.complete_checkpoints()
    run_id = json.loads((ckpt / "trainer_state.json").read_text())["wandb_run_id"]
    assert run_id == WANDB_RUN_ID and runs[0].name.endswith("-" + run_id), (runs[0].name, run_id)
    assert run.lines("wandb_run=") == []  # an offline run has no URL to print
    # W&B wrote nothing to the current folder or the model folder.
    assert list(run.contract.workdir.iterdir()) == []
    assert not (run.contract.model_dir / "wandb").exists()
    assert len(run.evals) == 1 and len(run.train_losses) == 2


def test_push_to_hub_through_the_entry_point(wandb_and_hub):
    """The final model reaches the Hub (a local HTTP double of its API), with the token taken
    from the environment at run time and never printed."""
    run, hub = wandb_and_hub
    files = hub["files"]
    assert hub["main"] == {}
    assert hub["private"]  # --hub-private
    model_dir = run.contract.model_dir
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training_args.json", "README.md"):
        assert files[name] == (model_dir / name).read_bytes(), name
    # The model card the Hub shows: metadata, the final evaluation and the settings.
    card = files["README.md"].decode()
    assert card.startswith("---\ntags: [distrain-cloud, classification]\n")
    assert f"| eval_accuracy | {run.final_eval['eval_accuracy']:.6g} |" in card and "| max steps | 4 |" in card
    # The one line that says where the model went (nothing else prints it).
    assert run.lines("pushed_to_hub=") == [f"pushed_to_hub=me/tiny branch=exp commit={hub['commit_url']}"], (
        run.describe()
    )
    assert HUB_TOKEN not in run.stdout + run.stderr
    assert HUB_TOKEN not in (model_dir / "training_args.json").read_text()


def test_fused_cross_entropy_matches_the_standard_loss(train):
    """--fused-ce computes the LM head and loss chunk by chunk, gradients in the forward pass:
    the same training (fp32 on CPU), step for step. --profile-steps writes its table."""
    common = ["--task", "causal-lm", "--max-steps", "6", "--log-every", "2", "--report-to", "none", "--no-save-model"]
    plain = train(*common, "--profile-steps", "2:4", name="ce-plain")
    fused = train(*common, "--fused-ce", name="ce-fused")
    assert plain.returncode == 0 and fused.returncode == 0, plain.describe() + fused.describe()
    assert list(plain.train_losses) == [2, 4, 6]
    for step, loss in plain.train_losses.items():
        assert fused.train_losses[step] == pytest.approx(loss, rel=1e-5), step
    profile = (plain.contract.output_dir / "profile.txt").read_text()
    assert "Self CPU" in profile and "profile_steps=2-4" in profile
    assert "Top operators by host (CPU) time" in profile
    # No GPU kernels on CPU: only the host time of each labelled phase of the step.
    (line,) = plain.lines("profile_steps=")
    figures = dict(kv.split("=") for kv in line.split()[1:])
    assert line.startswith("profile_steps=2-4 ") and "profile_gpu_busy_ms" not in figures
    assert {"profile_host_forward_ms", "profile_host_backward_ms", "profile_host_optimizer_ms"} <= figures.keys()
    assert all(float(v) > 0 for v in figures.values()), line
    with gzip.open(plain.contract.output_dir / "trace.json.gz", "rt") as f:
        assert json.load(f)["traceEvents"]


def test_padding_is_measured_and_follows_pad_to_multiple_of(task_runs, train):
    """Classification pads each batch to its longest example (pad_pct is measured from the
    attention masks); --pad-to-multiple-of rounds that width up, so padding grows with it."""
    plain = task_runs["classification-tiny-gpt2"]
    coarse = train(
        "--task",
        "classification",
        "--preset",
        "tiny-gpt2",
        "--max-steps",
        "30",
        "--log-every",
        "15",
        "--lr",
        "2e-3",
        "--report-to",
        "none",
        "--no-save-model",
        "--pad-to-multiple-of",
        "64",
    )
    assert coarse.returncode == 0, coarse.describe()
    tight = [m["pad_pct"] for m in plain.metrics if "pad_pct" in m]
    wide = [m["pad_pct"] for m in coarse.metrics if "pad_pct" in m]
    assert tight and wide
    # Length-grouped batches leave little padding; widths rounded to 64 tokens leave far more.
    assert max(tight) < 10 < min(wide), (tight, wide)
