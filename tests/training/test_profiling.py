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
