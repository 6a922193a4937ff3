"""`--profile-steps START:END`: torch.profiler over those optimizer steps on the main process.

Writes to the output folder:
- `profile.txt`: the top kernels by device time, followed by the timeline summary;
- `trace.json.gz`: a Chrome/Perfetto trace.

It also prints one `profile_...` key=value line per run, with these figures per step:
- GPU busy time;
- collective (NCCL) time;
- the part of the collective time that no compute kernel overlaps (what a multi-GPU step pays for
  its communication);
- the kernel time of each family: GEMMs, attention, Inductor's Triton kernels (those that find
  float8 scales or cast to float8 apart, fp8_cast), the optimizer's, the loss kernel and the rest
  (KERNEL_FAMILIES, inductor_family).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals, as sorted disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(merged: list[Interval]) -> float:
    return sum(e - s for s, e in merged)


def overlap(a: list[Interval], b: list[Interval]) -> float:
    """Total length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


PHASE_PREFIX = "distrain."


def host_phases(averages: Iterable[Any], steps: int) -> dict[str, float]:
    """Per-step host milliseconds of each labelled phase (Profiler.phase), from the profiler's
    key averages (cpu_time_total in microseconds): profile_host_forward_ms=..., and so on."""
    per_step_ms = 1.0 / (1000.0 * max(steps, 1))
    return {
        f"profile_host_{e.key[len(PHASE_PREFIX) :]}_ms": e.cpu_time_total * per_step_ms
        for e in averages
        if e.key.startswith(PHASE_PREFIX)
    }


def is_collective(kernel_name: str) -> bool:
    return "nccl" in kernel_name.lower()


def device_kernels(events: Iterable[Any]) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of the GPU's kernels, copies and sets among the profiler's events.
    record_function's ranges (distrain.forward, Optimizer.step#AdamW.step) have a GPU-side copy
    too, spanning every kernel they launched: counted, they were kernel time (a 1xH200 llama-1b
    step, session 26: "other" 199.6 ms of 462, the optimizer's 24.8 of which 10.3 were its range)
    and filled the gaps between kernels as busy time."""
    return [
        (e.name, e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and "annotation" not in str(getattr(e, "activity_type", "") or "").lower()
    ]


def timeline_summary(kernels: list[tuple[str, float, float]], steps: int) -> dict[str, float]:
    """Per-step milliseconds from GPU kernel intervals (name, start_us, end_us)."""
    if not kernels:
        return {}
    comm = merge((s, e) for n, s, e in kernels if is_collective(n))
    compute = merge((s, e) for n, s, e in kernels if not is_collective(n))
    busy = merge([*comm, *compute])
    span = max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)
    per_step_ms = 1.0 / (1000.0 * max(steps, 1))
    comm_total = length(comm)
    return {
        "profile_gpu_busy_ms": length(busy) * per_step_ms,
        "profile_gpu_idle_ms": (span - length(busy)) * per_step_ms,
        "profile_comm_ms": comm_total * per_step_ms,
        "profile_exposed_comm_ms": (comm_total - overlap(comm, compute)) * per_step_ms,
    }


# Kernel families by name, first match wins (the attention kernels' names hold "gemm"-like parts).
# Session 19 summed an H200's llama-1b step this way by hand: GEMMs 69%, Inductor's kernels 13%,
# attention 11%, the optimizer 6%; the 60% MFU target's lever had to be in the last three.
KERNEL_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("comm", ("nccl",)),
    ("attention", ("sdpa", "fmha", "flash", "attention", "cudnn")),
    ("gemm", ("nvjet", "gemm", "cublas", "cutlass", "scaled_mm")),
    ("optimizer", ("multi_tensor_apply", "adam")),
    ("loss", ("cross_entropy",)),
    ("triton", ("triton",)),
)


def inductor_family(low: str) -> str:
    """The family of one of Inductor's generated kernels, named triton_<kind>_fused_<the ops fused
    into it>: its ops, not the first family mark in them, say what it is. A cast feeding a float8
    matmul is named after the matmul (triton_poi_fused__scaled_mm__to_copy_clamp_...), and a llama-1b
    fp8 step's 42 ms of such casts read as GEMM time until session 29."""
    kind = low.split("_", 2)[1] if low.count("_") >= 2 else ""
    if kind == "tem":  # a template: a matmul, or flex attention
        return "attention" if "attention" in low else "gemm"
    if "amax" in low or "scaled_mm" in low:  # the float8 scales' passes and the casts they scale
        return "fp8_cast"  # with a norm Inductor fused into its amax pass (rsqrt_..._amax): a few ms
    if kind == "for":  # a foreach kernel: a compiled optimizer step (--compile-optimizer)
        return "optimizer"
    return "triton"


def kernel_family(name: str) -> str:
    """The family of a GPU kernel (KERNEL_FAMILIES; Inductor's own by inductor_family), "other"
    if none."""
    low = name.lower()
    if low.startswith("triton_"):
        return inductor_family(low)
    return next((family for family, marks in KERNEL_FAMILIES if any(m in low for m in marks)), "other")


def kernel_families(kernels: list[tuple[str, float, float]], steps: int) -> dict[str, float]:
    """Per-step milliseconds of GPU kernel time in each family, summed over the kernels (not
    merged: overlapping kernels each count): profile_kernels_gemm_ms=..., and so on. Collectives
    are left out: timeline_summary's profile_comm_ms has them."""
    per_step_ms = 1.0 / (1000.0 * max(steps, 1))
    totals = dict.fromkeys([*(f for f, _ in KERNEL_FAMILIES), "fp8_cast", "other"], 0.0)
    for name, start, end in kernels:
        totals[kernel_family(name)] += end - start
    return {f"profile_kernels_{f}_ms": us * per_step_ms for f, us in totals.items() if us and f != "comm"}


class Profiler:
    """Profiles optimizer steps [start, end) when the training loop calls step(n) after each."""

    def __init__(self, spec: str | None, accelerator, output_dir: Path):
        self.prof: Any = None  # a torch.profiler.profile while recording
        self.start: int | None = None
        self.end: int | None = None
        if spec and accelerator.is_main_process:
            self.start, self.end = (int(x) for x in spec.split(":"))
        self.output_dir = output_dir

    def phase(self, name: str):
        """A labelled range of the step (forward, backward, ...) while recording, else nothing: the
        host-time table then says where a step's CPU time goes when the GPU waits for it."""
        if self.prof is None:
            return contextlib.nullcontext()

        return torch.profiler.record_function(PHASE_PREFIX + name)

    def step(self, step: int) -> None:
        if self.start is None:
            return

        if step == self.start and self.prof is None:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.__enter__()
        elif step == self.end and self.prof is not None:
            self.close()

    def close(self) -> None:
        if self.prof is None:
            return
        assert self.start is not None and self.end is not None  # recording starts only with both set

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        table = self.prof.key_averages().table(sort_by=key, row_limit=100, max_name_column_width=80)
        kernels = device_kernels(self.prof.events())
        averages = self.prof.key_averages()
        summary = timeline_summary(kernels, self.end - self.start)
        summary.update(kernel_families(kernels, self.end - self.start))
        summary.update(host_phases(averages, self.end - self.start))
        line = " ".join([f"profile_steps={self.start}-{self.end}"] + [f"{k}={v:.3f}" for k, v in summary.items()])
        host = averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=80)
        (self.output_dir / "profile.txt").write_text(f"{table}\n{line}\n\nTop operators by host (CPU) time:\n{host}\n")
        try:
            self.prof.export_chrome_trace(str(self.output_dir / "trace.json.gz"))
        except OSError as err:  # a diagnostic: a full disk must not end the training run
            print(f"profile_trace_error={type(err).__name__}", flush=True)
        print(
            f"profile (steps {self.start}-{self.end}), top kernels:\n" + "\n".join(table.splitlines()[:16]),
            flush=True,
        )
        print(line, flush=True)
        self.prof = None
        self.start = None
