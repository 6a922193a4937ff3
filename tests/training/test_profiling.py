"""The timeline arithmetic behind --profile-steps' per-step figures: GPU busy time,
collective time, and the collective time that no compute kernel hides."""

from __future__ import annotations

import pytest

from distrain_cloud.training.profiling import merge, overlap, timeline_summary


def test_merge_and_overlap():
    assert merge([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert overlap([(0, 3), (5, 8)], [(2, 6)]) == 2  # [2,3] and [5,6]
    assert overlap([(0, 1)], [(2, 3)]) == 0


def test_exposed_communication_is_what_compute_does_not_cover():
    # Two steps (µs): compute 0-800 with an all-reduce 600-1000 (200 hidden, 200 exposed),
    # then compute 1000-1800 and an all-reduce 1900-2000 alone; 100 µs of idle GPU.
    kernels = [
        ("sm90_xmma_gemm", 0, 800),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 600, 1000),
        ("triton_poi_fused_add", 1000, 1800),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1900, 2000),
    ]
    s = timeline_summary(kernels, steps=2)
    assert s["profile_comm_ms"] == pytest.approx(0.25)  # (400 + 100) / 2 µs
    assert s["profile_exposed_comm_ms"] == pytest.approx(0.15)  # (200 + 100) / 2
    assert s["profile_gpu_busy_ms"] == pytest.approx(0.95)  # 1900 / 2
    assert s["profile_gpu_idle_ms"] == pytest.approx(0.05)  # 100 / 2


def test_no_kernels_no_figures():
    assert timeline_summary([], steps=5) == {}


def test_host_time_per_step_of_each_labelled_phase():
    """A real profile of two labelled 'steps' on CPU: each phase's host time per step, named by
    its label; unlabelled operators do not appear."""
    import contextlib
    import time

    import torch

    from distrain_cloud.training.profiling import Profiler, host_phases

    class Acc:
        is_main_process = True

    prof = Profiler("1:3", Acc(), output_dir=None)  # type: ignore[arg-type]
    assert isinstance(prof.phase("forward"), contextlib.nullcontext)  # not recording yet
    prof.step(1)
    for _ in range(2):
        with prof.phase("forward"):
            time.sleep(0.01)
        with prof.phase("optimizer"):
            torch.ones(4).add_(1)
    prof.prof.__exit__(None, None, None)
    averages = prof.prof.key_averages()
    figures = host_phases(averages, steps=2)
    assert set(figures) == {"profile_host_forward_ms", "profile_host_optimizer_ms"}, figures
    assert 9.0 <= figures["profile_host_forward_ms"] < 100.0
    assert figures["profile_host_optimizer_ms"] < figures["profile_host_forward_ms"]
    with torch.profiler.profile() as other:  # nothing labelled, no figures
        torch.ones(4).add_(1)
    assert host_phases(other.key_averages(), steps=2) == {}
