"""The precision a job trains in when `--precision` is not given: the launcher's rule
(strategies.choose_precision) applied to the GPUs this process sees.

The launcher always passes `--precision`; engines that start the entry point themselves
(SkyPilot, torchrun, AWS Batch, Kubernetes: docs/portability.md) do not, and used to get fp32.
"""

from __future__ import annotations

import glob
import os
import sys

from .args import fp8_linear_of
from .fp8 import fp8_problem
from .strategies import choose_precision

# bf16 needs this compute capability (Ampere); strategies.choose_precision applies it.
BF16_CAPABILITY = (8, 0)


def told_to_use_the_cpu() -> bool:
    """node_launch's CPU processes are (ACCELERATE_USE_CPU, as accelerate launch sets it)."""
    return os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")


def no_gpu_here() -> bool:
    """True where this process will find no CUDA GPU, known without torch (seconds to import): it
    is told to stay on the CPU, or Linux shows no NVIDIA device node (/dev/nvidia0 and up; WSL 2
    passes GPUs through /dev/dxg instead)."""
    if told_to_use_the_cpu():
        return True
    return sys.platform.startswith("linux") and not (glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/dxg"))


def visible_gpus() -> tuple[int, tuple[int, int] | None]:
    """(CUDA GPUs this process may use, their lowest compute capability), or (0, None) without
    CUDA or where the run is told to stay on the CPU. Torch-free where there is no GPU: the entry
    point checks the arguments and the data before it imports torch (where torch is loaded
    already, asking it costs nothing)."""
    if told_to_use_the_cpu() or ("torch" not in sys.modules and no_gpu_here()):
        return 0, None
    import torch

    if not torch.cuda.is_available():
        return 0, None
    count = torch.cuda.device_count()
    if count == 0:
        return 0, None
    major, minor = min(torch.cuda.get_device_capability(i) for i in range(count))
    return count, (major, minor)


def pick_precision(requested: str | None, gpus: int, capability: tuple[int, int] | None) -> tuple[str, str]:
    """(precision, why): `requested` where given, else the launcher's pick for these GPUs."""
    if requested is not None:
        return requested, "--precision"
    chosen = choose_precision(None, gpus, capability, "this machine")
    if gpus == 0:
        why = "no CUDA GPU: fp32"
    elif capability is None:
        why = "compute capability unknown"
    else:
        cap = f"{capability[0]}.{capability[1]}"
        op = ">=" if capability >= BF16_CAPABILITY else "<"
        why = f"compute capability {cap} {op} {BF16_CAPABILITY[0]}.{BF16_CAPABILITY[1]}"
    return chosen, f"default on {why}, as the launcher picks; --precision to choose"


def resolve_precision(args) -> str:
    """Set args.precision (a TrainArgs) where it was not given; the log line saying what and why.
    --precision fp8 is checked against these GPUs here, before anything loads (ValueError)."""
    if args.precision == "fp8":
        problem = fp8_problem(*visible_gpus(), torchao=fp8_linear_of(args) == "torchao")
        if problem:
            raise ValueError(problem)
        return "precision=fp8 (--precision: bf16 autocast, the linear layers' matmuls in float8)"
    gpus, capability = visible_gpus() if args.precision is None else (0, None)
    args.precision, why = pick_precision(args.precision, gpus, capability)
    return f"precision={args.precision} ({why})"
