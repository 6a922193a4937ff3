"""--precision fp8's auto recipe (args.fp8_auto_recipe, decided in decisions.decide): the LM head's
forward matmul in float8 with its backward bf16, fast input-gradient accumulation, e4m3 output
gradients and the query and key projections bf16, on the native float8 layers; what each flag or
run condition leaves of it, and why."""

from __future__ import annotations

import pytest

from distrain_cloud.training.args import ArgumentError, in_bf16, parse_args, validate
from distrain_cloud.training.decisions import decide, plan_configs

LLAMA = ["--task", "causal-lm", "--preset", "llama-1b", "--block-size", "2048", "--precision", "fp8"]


def decided(*flags: str, head_why_not: str | None = None, task: list[str] = LLAMA):
    return decide(parse_args([*task, *flags]), world=1, cuda=True, fp8_head_why_not=head_why_not)


@pytest.mark.parametrize(
    "flags, head, backward, accum, why",
    [
        ([], True, "bf16", "grad-input", None),  # auto's recipe
        (["--fp8-head"], True, "bf16", "grad-input", None),  # --fp8-head's backward: auto's bf16 too
        (["--no-fp8-head"], False, "fp8", "grad-input", None),  # asked: no reason to give
        (["--fp8-fast-accum", "none"], True, "bf16", "none", None),
        (["--fp8-head-backward", "fp8"], True, "fp8", "grad-input", None),  # the head's own flag asks for it
        (["--fp8-head-forward", "bf16"], True, "fp8", "grad-input", None),  # a float8 backward: both bf16 is refused
        (["--fp8-head-grad-input", "bf16"], True, "fp8", "grad-input", None),
        (["--fp8-linear", "torchao"], False, "fp8", "none", "torchao's float8 layers"),
        (["--fp8-recipe", "rowwise"], False, "fp8", "none", "torchao's float8 layers"),
        (["--fp8-bf16-edge-blocks", "1"], False, "fp8", "grad-input", "--fp8-bf16-edge-blocks keeps"),
        (["--lm-loss", "model"], False, "fp8", "grad-input", "--lm-loss model"),
        (["--fused-ce"], False, "fp8", "grad-input", "not the causal-lm loss"),
        (["--fp8-grad-dtype", "e5m2", "--fp8-bf16-layers", "none"], True, "bf16", "grad-input", None),
    ],
)
def test_each_flag_leaves_what_it_says_of_the_auto_recipe(flags, head, backward, accum, why):
    d = decided(*flags)
    a = d.args
    assert (a.fp8_head, a.fp8_head_backward, a.fp8_fast_accum) == (head, backward, accum)
    # session 36's part, on the native layers unless named: e4m3 gradients, the query and key
    # projections bf16 once the model confirms the names; torchao's layers keep their recipe's
    torchao = "--fp8-linear" in flags or "--fp8-recipe" in flags
    named = "--fp8-grad-dtype" in flags
    assert a.fp8_grad_dtype == ("e5m2" if named else "auto" if torchao else "e4m3")
    assert a.fp8_bf16_layers == ("none" if named or torchao else "auto")
    assert (d.fp8_head_why or "").startswith(why or ""), d.fp8_head_why
    assert (d.fp8_head_why is None) == (why is None)
    # the decided arguments are arguments the job accepts, and decide the same again
    validate(a)
    assert decide(a, world=1, cuda=True).args == a


def test_a_head_the_model_cannot_multiply_in_float8_stays_bf16_and_says_why():
    d = decided(head_why_not="its hidden size (64) and vocabulary (1000) must both be multiples of 16")
    assert d.args.fp8_head is False and d.args.fp8_fast_accum == "grad-input"
    assert d.fp8_head_why == "its hidden size (64) and vocabulary (1000) must both be multiples of 16"
    shown = plan_configs(d, 1)["fp8_recipe"]
    assert shown.endswith(
        "the LM head bf16 (auto: its hidden size (64) and vocabulary (1000) must both be multiples of 16)"
    )


def test_asked_for_where_the_fast_loss_does_not_run_the_head_is_refused_naming_the_flags():
    with pytest.raises(ArgumentError, match=r"^--fp8-head-forward: the LM head multiplies in float8 inside the fast LM "
                       r"loss, which this run does not use \(--lm-loss model\): drop --fp8-head-forward$"):  # fmt: skip
        decided("--lm-loss", "model", "--fp8-head-forward", "bf16")


def test_bf16_jobs_keep_the_fp8_settings_as_given_and_in_bf16_clears_them():
    bf16 = decide(parse_args([*LLAMA[:-2], "--precision", "bf16"]), world=1, cuda=True).args
    assert (bf16.fp8_head, bf16.fp8_head_backward, bf16.fp8_fast_accum) == (None, "auto", "auto")
    fp8 = decided().args
    cleared = in_bf16(fp8)
    assert cleared.precision == "bf16" and (cleared.fp8_head, cleared.fp8_fast_accum) == (None, "auto")
    validate(cleared)  # no --fp8-* flag left to refuse


def test_the_plan_names_the_recipe_and_that_auto_picked_the_head():
    assert plan_configs(decided(), 1)["fp8_recipe"] == (
        "native float8 layers, tensorwise dynamic scaling, e4m3 output gradients, the q_proj, k_proj layers bf16 "
        "(auto; where the model has both), fast accumulation in the backward: grad-input; the LM head float8, its "
        "backward bf16 (auto; bf16 where the model's head cannot)"
    )
    assert plan_configs(decided("--fp8-grad-dtype", "e5m2", "--fp8-bf16-layers", "none"), 1)["fp8_recipe"] == (
        "native float8 layers, tensorwise dynamic scaling, fast accumulation in the backward: grad-input; the LM "
        "head float8, its backward bf16 (auto; bf16 where the model's head cannot)"
    )
    assert plan_configs(decided("--fp8-head", "--fp8-head-backward", "fp8", "--fp8-fast-accum", "none"), 1)[
        "fp8_recipe"
    ].endswith("fast accumulation in the backward: none; the LM head float8")
    # a head flag asks for the head: the job refuses it, not falls back, where the head cannot run
    assert plan_configs(decided("--fp8-head-forward", "bf16"), 1)["fp8_recipe"].endswith(
        "the LM head float8, its forward bf16"
    )
    assert "fp8_recipe" not in plan_configs(decide(parse_args(LLAMA[:-2]), world=1, cuda=True), 1)
    assert plan_configs(decided("--fp8-grad-dtype", "e4m3", "--fp8-bf16-layers", "none"), 1)["fp8_recipe"].startswith(
        "native float8 layers, tensorwise dynamic scaling, e4m3 output gradients, fast accumulation"
    )
    assert plan_configs(decided("--fp8-bf16-layers", "q_proj,k_proj,q_proj"), 1)["fp8_recipe"].startswith(
        "native float8 layers, tensorwise dynamic scaling, e4m3 output gradients, the q_proj, k_proj layers bf16, "
        "fast accumulation"
    )


def test_submit_dry_run_shows_the_recipe_the_job_will_run(capsys, no_aws_config):
    """Where a user meets the recipe first: the plan of `submit --precision fp8 --dry-run`, in JSON."""
    import json

    from distrain_cloud.launcher import cli

    argv = ["submit", "--instance", "ml.p5.48xlarge", "--precision", "fp8", "--dry-run", "--json", "--"]
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--task", "causal-lm", "--preset", "llama-1b", "--lm-loss", "model"])
    assert exit_.value.code == 0
    plan = json.loads(capsys.readouterr().out)
    shown = json.dumps(plan)
    assert "fast accumulation in the backward: grad-input; the LM head bf16 (auto: --lm-loss model)" in shown
    assert "e4m3 output gradients, the q_proj, k_proj layers bf16 (auto; where the model has both)" in shown


def test_auto_keeps_the_query_and_key_projections_bf16_only_where_the_model_names_both():
    """--fp8-bf16-layers auto is decided once the model is loaded (trainer: fp8.linear_layer_names):
    a model whose attention is one fused projection (GPT-NeoX's query_key_value) or names only one
    of them keeps every block linear float8 instead of refusing a name it does not have."""
    from distrain_cloud.training.args import fp8_bf16_layer_names

    auto = decided().args
    llama = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert fp8_bf16_layer_names(auto, llama) == ("q_proj", "k_proj")
    assert fp8_bf16_layer_names(auto) == ("q_proj", "k_proj")  # before the model: as the plan shows it
    assert fp8_bf16_layer_names(auto, {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}) == ()
    assert fp8_bf16_layer_names(auto, {"q_proj", "kv_proj"}) == ()
    # named ones are the user's: the trainer refuses a name the model lacks (test_fp8_linear.py)
    assert fp8_bf16_layer_names(decided("--fp8-bf16-layers", "k_proj").args, {"q_proj"}) == ("k_proj",)
    assert fp8_bf16_layer_names(decided("--fp8-bf16-layers", "none").args, llama) == ()
