"""bench/fp8_plateau_study.py on CPU, a few steps: every recipe from one initial model over the same
bytes, the runs written as JSON, the means against bf16's printed, a recipe it lacks refused."""

from __future__ import annotations

import json
import math

import benchscript
import pytest


@pytest.fixture(scope="module")
def study():
    return benchscript.load("fp8_plateau_study")


def test_each_recipe_trains_from_the_same_model_over_the_same_bytes(study, tmp_path, capsys):
    out = tmp_path / "runs.json"
    argv = ["--batch", "2", "--steps", "2", "--log-every", "1", "--eval-sequences", "16", "--device", "cpu"]
    runs = study.main([*argv, "--recipes", "bf16,fp8-qk", "--seeds", "0", "--json", str(out)])
    assert [(r["recipe"], r["batch"], r["seed"]) for r in runs] == [("bf16", 2, 0), ("fp8-qk", 2, 0)]
    assert all(math.isfinite(r["eval_loss"]) and set(r["curve"]) == {1, 2} for r in runs)
    # the first step's loss is the one model's on the one batch, before any update: float8's rounding apart
    assert runs[0]["curve"][1] == pytest.approx(runs[1]["curve"][1], rel=0.02)
    assert json.loads(out.read_text())["runs"][1]["recipe"] == "fp8-qk"
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("batch   2 fp8-qk    mean eval ") and lines[-1].endswith("of bf16's")


def test_the_recipes_are_the_trainers_flags(study):
    import torch

    model = study.build(study.main.__globals__["argparse"].Namespace(hidden=128, layers=1, seq=16), 0)
    study.fp8.use_fp8(model, fast_accum="grad-input", **study.RECIPES["fp8-qk"])
    kinds = {
        name.rpartition(".")[2]: type(m).__name__ for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }
    assert kinds["q_proj"] == kinds["k_proj"] == "Linear" and kinds["v_proj"] == "Float8Linear"
    assert study.RECIPES["fp8-e4m3"] == {"grad_dtype": "e4m3"}
    # fp8-qke4: the layers of --precision fp8's auto recipe since session 36
    from distrain_cloud.training.args import FP8_AUTO_BF16_LAYERS

    assert study.RECIPES["fp8-qke4"] == {"grad_dtype": "e4m3", "bf16_layers": FP8_AUTO_BF16_LAYERS}


def test_a_recipe_it_lacks_is_refused_by_name(study, capsys):
    with pytest.raises(SystemExit) as exit_:
        study.main(["--recipes", "bf16,fp8-rowwise"])
    assert exit_.value.code == 2
    assert "--recipes: fp8-rowwise not among bf16, fp8, fp8-e4m3, fp8-qk, fp8-qke4\n" in capsys.readouterr().err
