"""The timeline arithmetic behind --profile-steps' per-step figures: GPU busy time,
collective time, and the collective time that no compute kernel hides."""

from __future__ import annotations

import pytest

from distrain_cloud.training.profiling import kernel_families, merge, overlap, timeline_summary


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


def test_inductor_kernels_count_by_the_ops_they_fuse():
    """Names from session 29's llama-1b fp8 profile (H200): Inductor names a kernel after every op
    fused into it, so the casts feeding _scaled_mm and the amax passes before them are float8
    casting, not GEMMs (they had been: 42 ms a step of "GEMM" that was no matmul); cuBLAS's float8
    matmul itself stays a GEMM, an Inductor matmul template too; foreach kernels are a compiled
    optimizer's."""
    kernels = [
        ("nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT", 0, 400),
        ("triton_poi_fused__scaled_mm__to_copy_clamp_clone_mul_reciprocal_silu_silu_backward_3", 400, 500),
        ("triton_red_fused_abs_amax_mul_silu_silu_backward_view_4", 500, 560),
        ("triton_red_fused__to_copy_abs_add_amax_mean_mul_pow_rsqrt_view_15", 560, 570),
        ("triton_poi_fused__to_copy_add_cat_mul_neg_slice_transpose_unsqueeze_view_11", 570, 580),
        ("triton_tem_fused_mm_7", 580, 600),
        ("triton_tem_fused_flex_attention_2", 600, 630),
        ("triton_for_fused_0", 630, 680),
        ("triton_per_fused_abs_amax_clamp_mul_reciprocal_4", 680, 681),
    ]
    assert kernel_families(kernels, steps=1) == pytest.approx(
        {
            "profile_kernels_gemm_ms": 0.42,
            "profile_kernels_fp8_cast_ms": 0.171,
            "profile_kernels_triton_ms": 0.01,
            "profile_kernels_attention_ms": 0.03,
            "profile_kernels_optimizer_ms": 0.05,
        }
    )


def test_no_kernels_no_figures():
    assert timeline_summary([], steps=5) == {}
    assert kernel_families([], steps=5) == {}


def test_each_kernel_counts_in_its_family():
    """Names as an H200's llama-1b step showed them (session 19): cuDNN's attention holds "wgmma"
    and must not count as a GEMM; cuBLAS's split-K reduction is the GEMM's; a collective is left to
    profile_comm_ms."""
    kernels = [
        ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", 0, 600),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", 600, 700),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64", 700, 1000),
        ("triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_3", 1000, 1100),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::FusedAdam>", 1100, 1150),
        ("_cross_entropy_grad_kernel", 1150, 1170),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1100, 1300),
        ("Memset (Device)", 1300, 1310),
    ]
    assert kernel_families(kernels, steps=2) == pytest.approx(
        {
            "profile_kernels_gemm_ms": 0.35,
            "profile_kernels_attention_ms": 0.15,
            "profile_kernels_triton_ms": 0.05,
            "profile_kernels_optimizer_ms": 0.025,
            "profile_kernels_loss_ms": 0.01,
            "profile_kernels_other_ms": 0.005,
        }
    )


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


def test_record_functions_gpu_ranges_are_not_kernels():
    """torch's profiler gives each record_function range a GPU-side copy spanning the kernels it
    launched (CUDA device type, a user annotation): as a kernel it was counted twice and filled the
    gaps between kernels as busy time (session 26's profile: "other" 199.6 ms a step)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from distrain_cloud.training.profiling import device_kernels

    def event(name, start, end, device=DeviceType.CUDA, annotation=False, activity="kernel"):
        return SimpleNamespace(
            name=name,
            time_range=SimpleNamespace(start=start, end=end),
            device_type=device,
            is_user_annotation=annotation,
            activity_type=activity,
        )

    events = [
        event("distrain.forward", 0, 1000, annotation=True, activity="gpu_user_annotation"),
        event("Optimizer.step#AdamW.step", 1000, 1500, activity="gpu_user_annotation"),
        event("distrain.forward", 0, 990, device=DeviceType.CPU, annotation=True, activity="user_annotation"),
        event("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", 0, 400),
        event("triton_poi_fused__unsafe_view_mul_silu_8", 600, 700),
        event("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdam>", 1000, 1400),
        event("aten::mm", 0, 400, device=DeviceType.CPU, activity="cpu_op"),
    ]
    kernels = device_kernels(events)
    assert [k[0] for k in kernels] == [e.name for e in events[3:6]]
    s = timeline_summary(kernels, steps=1)
    assert s["profile_gpu_busy_ms"] == pytest.approx(0.9)  # 400 + 100 + 400 µs; the ranges would make it 1.5
    assert kernel_families(kernels, steps=1) == pytest.approx(
        {"profile_kernels_gemm_ms": 0.4, "profile_kernels_triton_ms": 0.1, "profile_kernels_optimizer_ms": 0.4}
    )
