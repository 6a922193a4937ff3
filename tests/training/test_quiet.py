"""Library notes that tell a user nothing are dropped in one place (training/quiet.py)."""

from __future__ import annotations

import logging
import warnings

from distrain_cloud.training import quiet


def test_install_drops_the_library_notes_and_keeps_the_rest(caplog):
    quiet.install()
    quiet.install()  # idempotent: the entry point may run twice in one process (tests)
    deepspeed = logging.getLogger("DeepSpeed")
    assert len(deepspeed.filters) == 1
    with caplog.at_level(logging.WARNING):
        deepspeed.warning("Setting accelerator to CPU. If you have GPU or other accelerator, ...")
        logging.getLogger("accelerate.utils.other").warning("Removed shared tensor {'lm_head.weight'} while saving.")
        deepspeed.warning("a real problem")
    assert [r.getMessage() for r in caplog.records] == ["a real problem"]
    with warnings.catch_warnings(record=True) as seen:
        quiet.install()  # catch_warnings reset the filters
        warnings.warn(
            "`torch.distributed.all_gather_into_tensor` is deprecated. Please use ...", FutureWarning, stacklevel=1
        )
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else is deprecated"]


def test_launcher_notes_are_noise_and_our_lines_are_not():
    noise = [
        "The following values were not passed to `accelerate launch` and had defaults used instead:",
        "\t`--num_cpu_threads_per_process` was set to `2` to improve out-of-box performance when training on CPUs",
        "To avoid this warning pass in values for each of the problematic parameters or run `accelerate config`.",
        "W1126 14:00:00.000000 123 site-packages/torch/distributed/run.py:774] ",
        "*****************************************",
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid ...",
    ]
    assert all(quiet.is_noise(line) for line in noise)
    kept = ["error: --model gpt2: cannot load it", "step=3 train_loss=1.2", "Traceback (most recent call last):"]
    assert not any(quiet.is_noise(line) for line in kept)
