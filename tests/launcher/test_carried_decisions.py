"""A plan makes the run's decisions once and carries them: every part of a cloud plan (its configs,
the DDP buckets line, the memory check, the summary) reads `TrainingPlan.decisions`, and the
training flags are parsed once for it. Counted by wrapping the two functions, so a part that
decides or parses again on its own fails here."""

from __future__ import annotations

import collections

import pytest

from distrain_cloud.launcher.api import plan_job
from distrain_cloud.launcher.backends import cloud
from distrain_cloud.launcher.catalog import lookup
from distrain_cloud.launcher.spec import load_spec
from distrain_cloud.training import args as training_args
from distrain_cloud.training import decisions


@pytest.fixture
def counted(monkeypatch):
    """How often decide() ran (by world size) and the training flags were parsed (by argparse)."""
    calls: collections.Counter = collections.Counter()
    decide, parse = decisions.decide, training_args._parse

    def counted_decide(*a, **k):
        calls[("decide", k["world"])] += 1
        return decide(*a, **k)

    def counted_parse(*a, **k):
        calls["parse"] += 1
        return parse(*a, **k)

    monkeypatch.setattr(decisions, "decide", counted_decide)
    monkeypatch.setattr(training_args, "_parse", counted_parse)
    return calls


CLOUD = [
    ({"instance": "g5.12xlarge"}, 4),
    ({"instance": "ml.g5.12xlarge"}, 4),
    ({"instance": "p4d.24xlarge", "nodes": 2, "train_args": ["--task", "causal-lm", "--max-steps", "40000"]}, 16),
    ({"instance": "p4d.24xlarge", "train_args": ["--task", "causal-lm", "--max-steps", "40000"]}, 8),
    ({"instance": "ml.p4d.24xlarge", "strategy": "zero2"}, 8),
    ({"instance": "g5.12xlarge", "strategy": "fsdp", "train_args": ["--max-steps", "9000"]}, 4),
]


@pytest.mark.parametrize("overrides, world", CLOUD, ids=lambda v: v["instance"] if isinstance(v, dict) else None)
def test_a_cloud_plan_decides_once_and_parses_the_flags_once(no_aws_config, counted, overrides, world):
    spec = load_spec(None, {"region": "us-east-1", **overrides})
    training = cloud.plan_training(spec, lookup(spec.instance), main_addr="x")
    assert dict(counted) == {("decide", world): 1, "parse": 1}
    assert training.fit.ok is True  # a job that fits: no fixes were weighed
    # What the plan shows is the carried value's own words.
    assert training.decisions.args.strategy != "auto" and training.args.strategy == spec.strategy
    if "ddp_buckets" in training.configs:
        assert training.configs["ddp_buckets"] == training.decisions.ddp_buckets_words
    if "fsdp_sharding" in training.configs:  # the engine's reason as the job logs it (auto's, where auto chose)
        assert training.configs["fsdp_sharding"].endswith(f"({training.decisions.engine_why})")


def test_auto_in_the_graph_is_shown_with_autos_reason(no_aws_config):
    """The plan's fsdp_sharding line gives the reason the job logs (graph_fsdp.py: engine_why),
    not that of the arguments auto rewrote (it once said --compile-unit model, a flag nobody gave)."""
    spec = load_spec(None, {"instance": "p4d.24xlarge", "train_args": ["--task", "causal-lm", "--max-steps", "40000"]})
    training = cloud.plan_training(spec, lookup(spec.instance), main_addr="x")
    assert training.configs["fsdp_sharding"].startswith("in the compiled graph, every weight a flat shard (auto: ")


@pytest.mark.parametrize("overrides, world", CLOUD[:2], ids=["ec2", "sagemaker"])
def test_a_whole_dry_run_decides_once_and_parses_the_flags_once(no_aws_config, counted, overrides, world):
    """The whole `submit --dry-run`: the plan's one decide() and one parse of the training flags,
    and nobody else's (the offline checks, the W&B line and SageMaker's hyperparameters read the
    plan's `training`)."""
    plan = plan_job(load_spec(None, {"region": "us-east-1", **overrides}), dry_run=True)
    assert dict(counted) == {("decide", world): 1, "parse": 1}
    assert plan.training is not None and plan.training.args.strategy == "auto"


def test_a_whole_local_dry_run_parses_the_flags_once(no_aws_config, counted, tmp_path):
    """Local too: its node's launch (training/node_launch.plan_node), the checks and the W&B line
    read the plan's parse."""
    spec = load_spec(None, {"local.workdir": str(tmp_path), "train_args": ["--max-steps", "3"]})
    plan = plan_job(spec, dry_run=True)
    assert counted["parse"] == 1
    assert plan.training is not None and plan.training.args.max_steps == 3


def test_sagemakers_hyperparameters_come_from_the_plans_parse(no_aws_config):
    """The request's map is the flags that differ from the defaults, as argv_to_hyperparameters
    gives them from the same argv: a default --lr the flag check fills in stays the job's."""
    from distrain_cloud.training.args import argv_to_hyperparameters

    spec = load_spec(None, {"instance": "ml.g5.12xlarge", "region": "us-east-1", "train_args": ["--batch-size", "8"]})
    plan = plan_job(spec, dry_run=True)
    assert plan.training is not None
    assert plan.request["HyperParameters"] == argv_to_hyperparameters(plan.training.argv)
    assert plan.request["HyperParameters"]["batch_size"] == "8" and "lr" not in plan.request["HyperParameters"]
    assert plan.training.args.lr is not None  # filled in by the check, not carried in the request


def test_a_dry_run_reads_each_service_model_once(no_aws_config, monkeypatch):
    """Each request a plan would send is checked against botocore's model of its service; the
    model is read once per service, not once per operation (EC2's takes 50 ms: read for each of an
    EC2 plan's requests, it was most of a dry run's time)."""
    from botocore import loaders

    from distrain_cloud.launcher import apimodel

    read: collections.Counter = collections.Counter()
    load = loaders.Loader.load_service_model

    def counted(self, service_name, type_name, api_version=None):
        read[(service_name, type_name)] += 1
        return load(self, service_name, type_name, api_version)

    monkeypatch.setattr(loaders.Loader, "load_service_model", counted)
    apimodel._service.cache_clear()
    apimodel._operation.cache_clear()
    plan_job(load_spec(None, {"region": "us-east-1", "instance": "g5.12xlarge"}), dry_run=True)
    assert read and set(read.values()) == {1}, read
