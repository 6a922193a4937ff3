"""choose_precision (one rule for every backend) and the DDP bucket default, torch-free."""

from __future__ import annotations

import pytest

from distrain_cloud.training.strategies import choose_precision, ddp_bucket_mb, slow_gpu_link

V100, A100 = (7, 0), (8, 0)


@pytest.mark.parametrize(
    "requested, gpus, capability, chosen",
    [
        (None, 0, None, "no"),
        ("no", 0, None, "no"),
        (None, 4, V100, "fp16"),
        (None, 4, A100, "bf16"),
        (None, 1, None, "fp16"),  # unknown GPU: the safe one
        ("fp16", 4, A100, "fp16"),
        ("bf16", 1, None, "bf16"),
        ("no", 4, V100, "no"),
    ],
)
def test_the_requested_or_the_best_the_hardware_has(requested, gpus, capability, chosen):
    assert choose_precision(requested, gpus, capability, "here") == chosen


def test_impossible_requests_name_the_flag_the_hardware_and_the_fix():
    with pytest.raises(
        ValueError, match=r"--precision bf16 needs compute capability >= 8.0; a V100: use --precision fp16"
    ):
        choose_precision("bf16", 4, V100, "a V100")
    with pytest.raises(ValueError, match=r"--precision fp16 needs a GPU; this machine has none: use --precision no"):
        choose_precision("fp16", 0, None, "this machine")


@pytest.mark.parametrize(
    "requested, compiled, unit, mb",
    [
        (None, False, None, 25),
        (None, True, None, 1000),
        (None, True, "model", 1000),
        (None, True, "block", 25),  # no graph to split: the eager size
        (100, True, None, 100),
        (100, False, None, 100),
        (100, True, "block", 100),
    ],
)
def test_ddp_buckets_are_large_under_a_whole_model_compile_unless_asked_otherwise(requested, compiled, unit, mb):
    assert ddp_bucket_mb(requested, compiled, unit) == mb


def test_compiled_autograd_keeps_eager_buckets_so_all_reduces_can_start_before_the_last_gradient():
    assert ddp_bucket_mb(None, True, None, compiled_autograd=True) == 25
    assert ddp_bucket_mb(250, True, None, compiled_autograd=True) == 250


@pytest.mark.parametrize(
    "env,card,why",
    [
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, "NVIDIA H100 80GB HBM3", None),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, "Tesla V100-SXM2-16GB", None),  # p3: NVLink
        ({"WORLD_SIZE": "4"}, None, None),  # CPU, one node
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, "NVIDIA H100 80GB HBM3", "processes on 2 nodes"),
        ({"WORLD_SIZE": "4", "NCCL_P2P_DISABLE": "1"}, "NVIDIA H200", "NCCL_P2P_DISABLE is set"),
        ({"WORLD_SIZE": "4", "NCCL_P2P_DISABLE": "0"}, "NVIDIA H200", None),
        ({"WORLD_SIZE": "4"}, "NVIDIA A10G", "NVIDIA A10G GPUs, connected over PCIe"),  # g5.12xlarge
        ({"WORLD_SIZE": "4"}, "Tesla T4", "Tesla T4 GPUs, connected over PCIe"),  # g4dn.12xlarge
        ({"WORLD_SIZE": "4"}, "NVIDIA L40S", "NVIDIA L40S GPUs, connected over PCIe"),
        ({"WORLD_SIZE": "2"}, "NVIDIA H100 PCIe", "NVIDIA H100 PCIe GPUs, connected over PCIe"),
    ],
)
def test_a_slow_link_is_several_nodes_no_peer_to_peer_or_a_pcie_only_card(env, card, why):
    assert slow_gpu_link(env, card) == why
    assert slow_gpu_link(env, card, peer_access=True) == why


def test_gpus_without_peer_access_are_a_slow_link_whatever_the_card():
    both = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    card = "NVIDIA GeForce RTX 4090"
    assert slow_gpu_link(both, card, peer_access=False) == "no peer-to-peer access between the GPUs"
    assert slow_gpu_link(both, card, peer_access=None) is None  # not asked (one GPU, CPU)


def test_over_a_slow_link_the_compiled_default_keeps_small_buckets_to_overlap_the_all_reduce():
    assert ddp_bucket_mb(None, True, None, slow_link=True) == 25
    assert ddp_bucket_mb(None, True, None, slow_link=False) == 1000
    assert ddp_bucket_mb(500, True, None, slow_link=True) == 500  # asked for: as asked


def test_the_planned_buckets_are_the_size_asked_for_whatever_the_link():
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.decisions import planned

    on_g5 = {"world_size": 4, "nodes": 1, "gpu_model": "A10G", "params": None}
    asked = parse_args(["--ddp-bucket-mb", "100", "--compile"])
    assert planned(asked, **on_g5).ddp_buckets_words == "100 MB (--ddp-bucket-mb)"
    assert planned(parse_args(["--no-compile"]), **on_g5).ddp_buckets_words == "25 MB"  # eager: 25 anyway


def test_a_slow_link_is_named_only_where_it_made_the_default_small():
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.strategies import ddp_buckets_for

    slow = "NCCL_P2P_DISABLE is set"
    assert ddp_buckets_for(parse_args([]), True, slow) == (25, slow)
    assert ddp_buckets_for(parse_args([]), True, None) == (1000, None)
    assert ddp_buckets_for(parse_args([]), False, slow) == (25, None)  # eager: 25 anyway
    assert ddp_buckets_for(parse_args(["--compiled-autograd"]), True, slow) == (25, None)  # 25 anyway
    assert ddp_buckets_for(parse_args(["--ddp-bucket-mb", "100"]), True, slow) == (100, None)  # as asked


LONG = ["--task", "causal-lm", "--max-steps", "30000"]
SMALL, XL = 124_439_808, 1_557_611_200  # GPT-2 small and XL, embeddings included
IN_GRAPH = "sharded in the compiled graph: 30,000 steps of 124M parameters on 4 GPUs of one node repay its"


@pytest.mark.parametrize(
    "flags, world, cuda, link, saved, params, strategy, why",
    [
        (LONG, 4, True, None, None, SMALL, "fsdp", IN_GRAPH),
        (LONG, 4, True, None, None, XL, "ddp", "1,558M parameters: above 200M fsdp's in-graph engine is not faster"),
        (LONG, 4, True, None, None, None, "auto", None),  # left to the model's size, once it is known
        (
            ["--task", "causal-lm", "--max-steps", "29999"],
            4,
            True,
            None,
            None,
            None,
            "ddp",
            "29,999 --max-steps: below 30,000 fsdp's",
        ),
        (["--task", "causal-lm", "--epochs", "3"], 4, True, None, None, SMALL, "auto", None),  # until the data is
        (LONG, 1, True, None, None, SMALL, "ddp", "one process"),
        (LONG, 2, False, None, None, SMALL, "ddp", "no CUDA GPUs"),
        ([*LONG, "--no-compile"], 4, True, None, None, SMALL, "ddp", "--no-compile"),
        ([*LONG, "--compile-unit", "block"], 4, True, None, None, SMALL, "ddp", "--compile-unit block"),
        ([*LONG, "--grad-accum", "2"], 4, True, None, None, SMALL, "ddp", "--grad-accum 2: DDP syncs once a step"),
        (LONG, 8, True, "processes on 2 nodes", None, SMALL, "ddp", "processes on 2 nodes, where its small buckets"),
        ([*LONG, "--ddp-bucket-mb", "100"], 4, True, None, None, SMALL, "ddp", "--ddp-bucket-mb applies to ddp"),
        ([*LONG, "--task", "causal-lm", "--fused-ce"], 4, True, None, None, SMALL, "ddp", "--fused-ce: not measured"),
        ([*LONG, "--task", "masked-lm"], 4, True, None, None, SMALL, "ddp", "--task masked-lm: not measured"),
        # A resumed run keeps the checkpoint's engine, whatever its flags, processes and size now.
        (["--max-steps", "10"], 1, False, None, {"strategy": "fsdp", "sharding": "in-graph"}, XL, "fsdp", "sharded"),
        (LONG, 4, True, None, {"strategy": "ddp"}, SMALL, "ddp", "as the checkpoint it resumes was trained"),
        (LONG, 4, True, None, {"strategy": "fsdp"}, SMALL, "fsdp", IN_GRAPH),  # FSDP2's: check_resumable refuses it
    ],
)
def test_auto_picks_in_graph_fsdp_only_for_long_compiled_runs_of_small_models_on_one_nodes_gpus(
    flags, world, cuda, link, saved, params, strategy, why
):
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.strategies import resolve_auto

    args = parse_args(flags)
    assert args.strategy == "auto"  # the default
    got, reason = resolve_auto(args, world=world, cuda=cuda, slow_link=link, saved=saved, params=params)
    assert got.strategy == strategy, reason
    assert reason is None if why is None else reason.startswith("auto: " + why), reason
    assert (got.compile_unit == "model") is (strategy == "fsdp")  # fsdp's in-graph engine (fsdp_in_graph)
    assert resolve_auto(parse_args(["--strategy", "ddp", *LONG]), world=4, cuda=True, slow_link=None) == (
        parse_args(["--strategy", "ddp", *LONG]),
        None,
    )


@pytest.mark.parametrize(
    "steps, strategy, why",
    [
        (None, "auto", None),  # before the data is loaded
        (40000, "fsdp", "sharded in the compiled graph: 40,000 steps of 124M parameters on 4 GPUs"),
        (900, "ddp", "900 steps in --epochs: below 30,000 fsdp's in-graph compile does not repay itself"),
    ],
)
def test_a_run_counted_in_epochs_is_decided_once_its_steps_are_known(steps, strategy, why):
    from distrain_cloud.training.args import parse_args
    from distrain_cloud.training.strategies import resolve_auto

    args = parse_args(["--task", "causal-lm", "--epochs", "3"])
    got, reason = resolve_auto(args, world=4, cuda=True, slow_link=None, params=SMALL, steps=steps)
    assert got.strategy == strategy, reason
    assert reason is None if why is None else reason.startswith("auto: " + why), reason
