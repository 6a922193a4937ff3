"""launcher/throughput.py: the measured rates `instances --fit` prices with, and the roofline
estimate for the cards never measured, fitted to the measured H100/H200 runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distrain_cloud.launcher import throughput
from distrain_cloud.launcher.catalog import GPU_COMPUTE_CAPABILITY
from distrain_cloud.launcher.shape import shape_from_config
from distrain_cloud.training.modeling import PRESETS

MEASUREMENTS = Path(__file__).resolve().parents[2] / "bench" / "measurements"


def _recorded(source: str, run: str) -> list[float]:
    """The tokens/s a measurement file records for a run: its JSON id, or its Markdown table label."""
    json_file = MEASUREMENTS / f"{source}.json"
    if json_file.exists():
        suites = json.loads(json_file.read_text())["suites"].values()
        return [r["tokens_per_sec"] for suite in suites for r in suite["runs"] if r["id"] == run]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in (MEASUREMENTS / f"{source}.md").open()]
    return [float(cells[5].replace(",", "")) for cells in rows if cells[0] == run and len(cells) == 13]


@pytest.mark.parametrize("t", throughput.THROUGHPUT, ids=lambda t: f"{t.card}-{t.model}-{t.strategy}-{t.compiled}")
def test_every_rate_is_what_its_measurement_file_records(t):
    for (source, run), rate in zip(t.runs, t.tokens_per_sec, strict=True):
        recorded = [r / t.gpus for r in _recorded(source, run)]  # per GPU
        assert any(r == pytest.approx(rate, abs=0.6) for r in recorded), (source, run, rate, recorded)


def test_the_committed_roofline_is_the_fit_of_the_measured_runs():
    fitted, committed = throughput.fit(), throughput.ROOFLINE
    assert committed.d0 == fitted.d0
    for name in ("u_max", "kappa_compiled", "kappa_eager"):
        assert getattr(committed, name) == pytest.approx(getattr(fitted, name), rel=0.01), name


def test_the_estimate_is_within_3_percent_of_every_run_it_was_fitted_to():
    errors = throughput.fit_errors()
    assert {t.card for t, _, _ in errors} == {"H100", "H200"} and len(errors) == len(throughput.MEASURED)
    assert throughput.largest_error() == max(abs(e) for _, _, e in errors) <= 0.03


def test_every_catalog_gpu_has_published_rates_and_faster_cards_estimate_faster():
    assert set(GPU_COMPUTE_CAPABILITY) <= set(throughput.GPU_SPECS)
    shape = shape_from_config("llama-1b", PRESETS["llama-1b"])
    assert shape is not None

    def rate(gpu: str, compiled: bool = True, gib: int | None = None) -> float:
        card = throughput.spec(gpu, gib)
        assert card is not None
        return throughput.estimate_tokens_per_sec(shape, 2048, compiled, card)

    assert rate("T4") < rate("A10G") < rate("A100") < rate("H100") < rate("H200") < rate("B200")
    assert rate("A100", gib=80) > rate("A100", gib=40)  # the 80 GB part's faster memory
    assert rate("H100", compiled=False) < rate("H100")  # eager moves more bytes
    # llama-1b on an H200: the estimate lands near its measured 66,921 tokens/s (2.3% under)
    assert rate("H200") == pytest.approx(66921, rel=0.03)


# the block linears before session 36's auto: every one float8, e5m2 output gradients
LAYERS35 = ["--fp8-grad-dtype", "e5m2", "--fp8-bf16-layers", "none"]
FORWARD_HEAD = ["--precision", "fp8", "--fp8-head", "--fp8-head-backward", "bf16", *LAYERS35]
# fp8's recipe before session 33's auto one: the head bf16, or (OLD_HEAD) all of it float8, and every
# backward matmul exact
OLD = ["--precision", "fp8", "--no-fp8-head", "--fp8-fast-accum", "none", *LAYERS35]
OLD_HEAD = ["--precision", "fp8", "--fp8-head", "--fp8-head-backward", "fp8", "--fp8-fast-accum", "none", *LAYERS35]
EXACT = ["--fp8-fast-accum", "none", *LAYERS35]
TORCHAO = ["--fp8-linear", "torchao", "--fp8-grad-dtype", "auto"]  # torchao's recipes pick their gradients


@pytest.mark.parametrize(
    "flags, rate",
    [
        # --residual-dtype auto: bf16 for a Llama on GPUs (session 25); --rope-tables: on for a
        # compiled model (session 27); the runs before either had neither
        ([], 70845),  # bf16: the micro-batch-16 runs with the tables (sessions 27-37)
        (["--rope-tables"], 70845),
        (["--batch-size", "8"], 67790),
        (["--batch-size", "32"], 71677),  # sessions 27, 30-34, 37 and 38
        # --precision fp8's auto recipe: the forward head, fast input gradients (sessions 32-33), e4m3
        # gradients and the query and key projections bf16 (session 36 at 16, sessions 37-38 at 32 and 8,
        # session 38 at 48, where bf16 does not fit)
        (["--precision", "fp8"], 88087),
        (["--precision", "fp8", "--batch-size", "32"], 91892),
        (["--precision", "fp8", "--batch-size", "48"], 92979),
        (["--precision", "fp8", "--batch-size", "8"], 83656),
        # eager (session 38): fp8 0.74x bf16 there, and the plan prices a short fp8 job by it
        (["--no-compile", "--batch-size", "8"], 49088),
        (["--no-compile"], 51490),
        (["--no-compile", "--precision", "fp8", "--batch-size", "8"], 36354),
        (["--no-compile", "--precision", "fp8"], 38273),
        (["--precision", "fp8", "--fp8-head"], 88087),  # --fp8-head's backward: auto's bf16
        (["--precision", "fp8", "--fp8-grad-dtype", "e4m3", "--fp8-bf16-layers", "q_proj,k_proj"], 88087),  # by name
        (["--precision", "fp8", "--fp8-grad-dtype", "e5m2"], 88392),  # each half of it alone (session 36)
        (["--precision", "fp8", "--fp8-bf16-layers", "none"], 89798),
        (["--precision", "fp8", "--fp8-bf16-layers", "k_proj"], 89843),  # session 37
        (["--precision", "fp8", "--fp8-bf16-layers", "k_proj", "--batch-size", "32"], None),  # ran at 16 only
        # the auto recipe of sessions 33-35, asked by its flags
        (["--precision", "fp8", *LAYERS35], 90897),
        (["--precision", "fp8", *LAYERS35, "--batch-size", "32"], 94619),
        (["--precision", "fp8", *LAYERS35, "--batch-size", "8"], 85469),
        ([*FORWARD_HEAD, "--fp8-fast-accum", "grad-input"], 90897),  # the same recipe, asked by name
        ([*FORWARD_HEAD, "--fp8-fast-accum", "all", "--batch-size", "32"], None),
        (["--precision", "fp8", "--no-fp8-head", "--batch-size", "32"], None),  # fast accumulation, no head
        # the recipes before it, asked by their flags
        (OLD, 88052),
        ([*OLD, "--batch-size", "32"], 91850),  # session 30
        ([*OLD, "--batch-size", "8"], None),  # never measured with the tables
        (["--precision", "fp8", "--fp8-head", "--fp8-head-forward", "bf16", *EXACT], 92939),  # session 28
        (["--precision", "fp8", "--fp8-head", "--fp8-head-forward", "bf16", *EXACT, "--batch-size", "8"], 85330),
        (["--precision", "fp8", "--fp8-head-forward", "bf16", "--fp8-head-grad-input", "bf16", *EXACT], None),
        ([*FORWARD_HEAD, *EXACT], None),  # not the float8 head's figure
        ([*FORWARD_HEAD, *EXACT, "--batch-size", "32"], 92296),  # session 31
        ([*FORWARD_HEAD, *EXACT, "--batch-size", "8"], 82789),
        (["--fuse-projections"], None),
        *[
            ([*flags, "--no-rope-tables"], rate)
            for flags, rate in [
                ([], 70127),  # the micro-batch-16 row (sessions 24-27)
                (["--batch-size", "8"], 66900),
                (["--batch-size", "32"], 71081),  # session 26
                (["--fuse-projections"], 68261),
                (["--precision", "fp8"], None),  # auto's recipe: measured with the tables only
                (OLD, 86851),  # fp8's recipe before it, with the bf16 stream (sessions 26-27)
                ([*OLD, "--batch-size", "8"], 80829),
                ([*OLD, "--batch-size", "32"], 89847),
                ([*OLD, "--fuse-projections"], 82157),
                (OLD_HEAD, 93174),  # with the bf16 stream (session 24)
                ([*OLD_HEAD, "--batch-size", "8"], 86593),  # session 25's loss runs
                (
                    ["--precision", "fp8", "--fp8-head", "--fp8-head-forward", "bf16", *EXACT],
                    None,
                ),  # not without the tables
            ]
        ],
        *[
            ([*flags, "--residual-dtype", "fp32", "--no-rope-tables"], rate)
            for flags, rate in [
                ([], 69100),
                (["--batch-size", "32"], 69358),
                (OLD, 85785),  # the recipe before auto's on the native layers (--fp8-linear auto)
                (["--precision", "fp8", "--fp8-linear", "torchao"], 84193),  # auto on torchao's: their recipe
                (OLD_HEAD, 93712),  # the native layers' own run (session 23)
                ([*OLD_HEAD, *TORCHAO], 91196),
                ([*OLD, "--batch-size", "8"], 79964),
                ([*OLD[:3], "--fp8-fast-accum", "all"], None),  # never measured: not priced as fp8's
                (["--precision", "fp8", "--fp8-recipe", "rowwise"], None),
                ([*OLD_HEAD, "--batch-size", "8"], 84183),  # the native layers' (session 24)
            ]
        ],
    ],
)
def test_a_llama_1b_job_on_an_h200_is_priced_by_the_run_that_multiplied_as_it_will(flags, rate):
    from distrain_cloud.launcher.memory import measured_tokens_per_sec, model_shape
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.decisions import decide

    args = parse_args(
        [
            "--task",
            "causal-lm",
            "--preset",
            "llama-1b",
            "--block-size",
            "2048",
            "--compile",
            "--strategy",
            "ddp",
            *flags,
        ]
    )
    shape = model_shape(args)
    assert shape is not None
    measured = measured_tokens_per_sec(decide(args, world=1, cuda=True), shape, "H200")
    assert (measured and round(measured[0])) == rate, measured


def test_an_fp8_job_priced_by_the_other_layers_run_says_so():
    """The native layers and torchao's run one recipe: a job is priced by a run of its own layers
    where there is one, else by the other's, named."""
    from distrain_cloud.launcher.memory import measured_tokens_per_sec, model_shape
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.decisions import decide

    def priced(*flags: str) -> str:
        train = ["--task", "causal-lm", "--preset", "llama-1b", "--block-size", "2048", "--compile"]
        fp8 = [*OLD, "--residual-dtype", "fp32", "--no-rope-tables"]  # a later --fp8-head wins
        args = parse_args([*train, "--strategy", "ddp", *fp8, *flags])
        shape = model_shape(args)
        assert shape is not None
        measured = measured_tokens_per_sec(decide(args, world=1, cuda=True), shape, "H200")
        assert measured is not None
        return measured[1]

    assert priced().endswith("2026-11-29-h200x1-session23-c3")
    assert priced("--fp8-head", "--fp8-head-backward", "fp8").endswith("2026-11-29-h200x1-session23-c3")
    # micro-batch 32 ran on torchao's layers only (session 22)
    assert priced("--batch-size", "32").endswith(
        "2026-11-29-h200x1-session22-c1 (torchao's float8 layers, the same recipe)"
    )
    assert "the same recipe" not in priced(*TORCHAO, "--fp8-head", "--fp8-head-backward", "fp8")
    assert "the same recipe" not in priced(*TORCHAO, "--batch-size", "32")


def _decided_llama(*flags: str):
    from distrain_cloud.launcher.memory import model_shape
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.decisions import decide

    train = ["--task", "causal-lm", "--preset", "llama-1b", "--block-size", "2048", "--compile", "--strategy", "ddp"]
    args = parse_args([*train, *flags])
    shape = model_shape(args)
    assert shape is not None
    return decide(args, world=1, cuda=True), shape


@pytest.mark.parametrize(
    "flags, rate, ratio",
    [
        # e4m3 alone at 32 and the key projection alone at 8: the recipe before them ran there (94,619;
        # 85,469), and each ran beside it at 16 (89,798 and 89,843 against 90,897)
        (["--precision", "fp8", "--fp8-bf16-layers", "none", "--batch-size", "32"], 93475, "x 0.988"),
        (["--precision", "fp8", "--fp8-bf16-layers", "k_proj", "--batch-size", "8"], 84478, "x 0.988"),
        # auto's recipe ran at all three (sessions 36-37): its own runs, not scaled; session 36's
        # scaling had said 91,211 at 32 and 82,539 at 8, 1.3% under what session 37 then measured
        (["--precision", "fp8"], None, None),
        (["--precision", "fp8", "--batch-size", "32"], None, None),
        (["--precision", "fp8", "--batch-size", "8"], None, None),
        (["--precision", "fp8", "--batch-size", "4"], None, None),  # the recipe before never ran at 4
        (["--precision", "fp8", *LAYERS35, "--batch-size", "32"], None, None),  # that recipe: measured, not scaled
        (["--precision", "fp8", "--fp8-recipe", "rowwise", "--batch-size", "32"], None, None),  # torchao's own
        (["--batch-size", "32"], None, None),  # bf16
    ],
)
def test_an_fp8_layer_recipe_unmeasured_at_its_micro_batch_is_scaled_from_the_one_before(flags, rate, ratio):
    """A layer recipe measured at micro-batch 16 only (e4m3 alone; the key projection alone): at 8
    and 32 the recipe before it ran. Without the scaling such a job fell to the roofline at bf16's
    rate, a quarter under either."""
    from distrain_cloud.launcher.memory import fp8_layers_scaled_tokens_per_sec, measured_tokens_per_sec

    job, shape = _decided_llama(*flags)
    scaled = fp8_layers_scaled_tokens_per_sec(job, shape, "H200")
    assert (scaled and round(scaled[0])) == rate, scaled
    if scaled:
        assert measured_tokens_per_sec(job, shape, "H200") is None
        assert scaled[1].startswith(f"est. {rate:,} tokens/s/GPU: {ratio}, this recipe's rate over that of ")
        assert "at micro-batch 16, on the latter's " in scaled[1] and "measured on 1 H200" in scaled[1]
    assert fp8_layers_scaled_tokens_per_sec(job, shape, "H100") is None  # no fp8 rows there


@pytest.mark.parametrize(
    "extra, priced",
    [
        ("", "(91,892 tokens/s/GPU measured on 1 H200: 2026-11-30-h200x2-session37-c6-gpu0-auto32"),
        ("  fp8_bf16_layers: none\n", "(est. 93,475 tokens/s/GPU: x 0.988, this recipe's rate over that of "),
    ],
)
def test_instances_fit_prices_an_fp8_job_at_32_by_its_run_else_the_scaled_rate(tmp_path, capsys, extra, priced):
    from clirun import run_cli

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "instance: p5en.48xlarge\nprecision: fp8\nstrategy: ddp\nhyperparameters:\n  task: causal-lm\n"
        f"  preset: llama-1b\n  block_size: 2048\n  batch_size: 32\n  max_steps: 5000\n{extra}"
    )
    code, out, err = run_cli(capsys, "instances", "--fit", str(spec))
    assert code == 0, out + err
    row = next(line for line in out.splitlines() if line.split()[1:2] == ["p5en.48xlarge"])
    assert priced in row, row
