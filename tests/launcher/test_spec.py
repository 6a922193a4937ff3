"""The job spec: YAML + overrides, unknown keys named, every shipped example loads."""

import json
import os
from pathlib import Path

import pytest

from distrain_cloud.infra.errors import UserError
from distrain_cloud.launcher.spec import JobSpec, load_spec, parse_duration

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_example_loads(path):
    spec = load_spec(path)
    assert spec.instance
    # The spec must also produce valid training arguments.
    spec.check_training_args("no", "x")


def test_unknown_top_level_key_is_named(tmp_path):
    with pytest.raises(UserError, match=r"unknown key 'nodez'.*known keys: .*nodes"):
        load_spec(write(tmp_path, "nodez: 2\n"))


def test_unknown_nested_key_is_named_with_its_section(tmp_path):
    with pytest.raises(
        UserError, match=r"unknown key 'sagemaker.rolee' \(did you mean 'role'\?\) in sagemaker; known keys: role"
    ):
        load_spec(write(tmp_path, "sagemaker:\n  rolee: x\n"))


def test_a_sections_unknown_keys_are_named_in_one_message(tmp_path):
    with pytest.raises(UserError) as e:
        load_spec(write(tmp_path, "nodez: 2\nsagemaker:\n  rolee: x\n  bucketz: y\n"))
    message = str(e.value)
    assert "unknown key 'nodez' (did you mean 'nodes'?); known keys: name, instance" in message
    assert (
        "unknown keys 'sagemaker.rolee' (did you mean 'role'?), 'sagemaker.bucketz' (did you mean 'bucket'?)" in message
    )
    assert message.count("known keys:") == 2  # once a section, not once a key


def test_training_flags_at_the_top_are_pointed_to_hyperparameters(tmp_path):
    with pytest.raises(UserError) as e:
        load_spec(write(tmp_path, "instance: local\npreset: llama-1b\nbatch_size: 32\nnodez: 2\n"))
    message = str(e.value)
    assert "unknown keys 'preset', 'batch_size', 'nodez' (did you mean 'nodes'?)" in message
    assert "preset, batch_size are training flags: put them under hyperparameters" in message
    # written there, the same keys load
    spec = load_spec(write(tmp_path, "instance: local\nhyperparameters:\n  preset: llama-1b\n  batch_size: 32\n"))
    assert spec.hyperparameters == {"preset": "llama-1b", "batch_size": 32}


def test_submit_names_a_specs_misplaced_flags_in_one_error_line_and_sends_nothing(cli, tmp_path):
    spec = write(tmp_path, "instance: local\nmax_steps: 5\nlr: 0.1\n")
    r = cli("submit", str(spec), "--dry-run", cwd=tmp_path)
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {spec}: unknown keys 'max_steps', 'lr'"), r.stderr
    assert "max_steps, lr are training flags: put them under hyperparameters" in lines[0]
    assert lines[0].count("known keys:") == 1
    assert not (tmp_path / "runs").exists()


def test_unknown_hyperparameter_suggests_the_right_one(tmp_path):
    path = write(tmp_path, "hyperparameters:\n  batch_sise: 4\n")
    with pytest.raises(UserError) as e:
        load_spec(path)
    assert str(e.value) == (
        f"{path}: hyperparameters: unknown training flag 'batch_sise' (did you mean 'batch_size'?); "
        "see `distrain-train --help`"
    )


def test_hyperparameter_owned_by_the_spec_is_refused(tmp_path):
    with pytest.raises(UserError, match="set strategy at the top of the spec"):
        load_spec(write(tmp_path, "hyperparameters:\n  strategy: zero2\n"))


def test_cli_overrides_win_over_yaml(tmp_path):
    spec = load_spec(
        write(tmp_path, "instance: ml.g5.xlarge\nstrategy: zero2\nnodes: 2\n"),
        {"strategy": "zero3", "nodes": None, "sagemaker.role": "r"},
    )
    assert (spec.strategy, spec.nodes, spec.sagemaker.role) == ("zero3", 2, "r")


def test_bad_strategy_and_invalid_yaml_are_one_line(tmp_path):
    with pytest.raises(UserError, match="unknown strategy 'zero4'") as e:
        load_spec(None, {"strategy": "zero4"})
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="not valid YAML at line 2"):
        load_spec(write(tmp_path, "a: 1\n b: [\n"))
    with pytest.raises(UserError, match="not found"):
        load_spec(tmp_path / "missing.yaml")


def test_durations_and_spot_rules():
    assert parse_duration("6h") == 21600 and parse_duration("90m") == 5400 and parse_duration(60) == 60
    assert JobSpec(spot=True, max_run="1h", max_wait="2h").max_wait == 7200
    with pytest.raises(UserError, match=r"max_wait \(1800s\) must be >= max_run \(3600s\)"):
        load_spec(None, {"spot": True, "max_run": "1h", "max_wait": "30m"})
    with pytest.raises(UserError, match="spot jobs only"):
        load_spec(None, {"max_wait": "2h"})


def test_secret_must_be_a_reference_and_value_is_never_echoed():
    value = "hf_" + "x" * 34
    with pytest.raises(UserError) as e:
        load_spec(None, {"secrets": {"HF_TOKEN": value}})
    assert "must be a reference" in str(e.value) and value not in str(e.value)
    ok = load_spec(
        None,
        {
            "secrets": {
                "HF_TOKEN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-AbC",
                "WANDB_API_KEY": "ssm:/team/wandb",
            }
        },
    )
    assert set(ok.secrets) == {"HF_TOKEN", "WANDB_API_KEY"}


def test_training_argv_combines_spec_and_raw_flags():
    spec = load_spec(
        None,
        {
            "hyperparameters": {"task": "causal-lm", "compile": True, "lr": 3e-4},
            "strategy": "zero2",
            "train_args": ["--max-steps", "5"],
        },
    )
    argv = spec.check_training_args("bf16", "job-1")
    assert argv[:5] == ["--task", "causal-lm", "--compile", "--lr", "0.0003"]
    assert argv[argv.index("--strategy") + 1] == "zero2" and argv[-2:] == ["--max-steps", "5"]
    with pytest.raises(UserError, match="training arguments: argument --task: invalid choice"):
        load_spec(None, {"train_args": ["--task", "nope"]}).check_training_args("no", "x")
    # Flags that only fit some strategies are checked against the spec's strategy at plan time.
    zero2_bf16 = load_spec(None, {"strategy": "zero2", "hyperparameters": {"ddp_reduce_dtype": "bf16"}})
    with pytest.raises(UserError, match="--ddp-reduce-dtype applies to --strategy ddp, not zero2"):
        zero2_bf16.check_training_args("bf16", "x")


def test_hub_push_needs_a_token_reference(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)  # a local job may take it from the environment
    with pytest.raises(UserError, match="add --secret HF_TOKEN="):
        load_spec(None, {"hub": {"repo_id": "me/model"}}).check_training_args("no", "x")


def test_instance_is_spelled_one_way():
    assert load_spec(None, {"instance": " ml.G5.xlarge "}).instance == "ml.g5.xlarge"
    assert load_spec(None, {"instance": "LOCAL"}).backend == "local"


def test_settings_the_spec_owns_have_launcher_flags_that_reach_the_training(cli, tmp_path):
    args = ["--run-name", "first", "--wandb-project", "proj", "--wandb-entity", "team", "--precision", "no"]
    r = cli("submit", "--instance", "local", "--dry-run", "--json", *args, "--", "--max-steps", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    command = json.loads(r.stdout)["request"]["command"]
    for flag, value in zip(args[::2], args[1::2], strict=True):
        assert command.count(flag) == 1 and command[command.index(flag) + 1] == value


def test_user_defaults_come_from_the_config_file_then_distrain_variables_then_flags(cli, tmp_path):
    config = tmp_path / "xdg" / "distrain-cloud" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("wandb_project: from-file\nwandb_entity: file-team\nrole: file-role\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "DISTRAIN_WANDB_ENTITY": "env-team"}

    def command(*flags: str) -> list[str]:
        r = cli("submit", "--instance", "local", "--dry-run", "--json", *flags, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["request"]["command"]

    def value(command: list[str], flag: str) -> str:
        return command[command.index(flag) + 1]

    default = command()
    assert (value(default, "--wandb-project"), value(default, "--wandb-entity")) == ("from-file", "env-team")
    assert value(command("--wandb-project", "flag"), "--wandb-project") == "flag"
    plan = cli("submit", "--instance", "ml.g5.xlarge", "--region", "us-east-1", "--dry-run", cwd=tmp_path, env=env)
    assert "role/file-role" in plan.stdout, plan.stderr
    config.write_text("regon: us-east-1\n")
    r = cli("submit", "--instance", "local", "--dry-run", cwd=tmp_path, env=env)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"error: {config}: unknown key 'regon'; known keys: region, stack, bucket, role, wandb_project, wandb_entity"
    ]


def test_the_spec_takes_the_precisions_the_training_flags_take():
    """A spec's `precision` is a Literal (pydantic and mypy read it as written); its values are
    strategies.Precision's, the one home of the names."""
    import typing

    from distrain_cloud.training.strategies import PRECISIONS

    annotation = typing.get_type_hints(JobSpec)["precision"]
    literal = next(a for a in typing.get_args(annotation) if typing.get_origin(a) is typing.Literal)
    assert typing.get_args(literal) == PRECISIONS
