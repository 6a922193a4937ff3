"""Library notes that tell a user nothing are turned off by the libraries' own means
(training/quiet.py), never by reading output lines: a line the user's code prints always shows."""

from __future__ import annotations

import logging
import sys
import warnings

from distrain_cloud.training import quiet
from distrain_cloud.training.node_launch import _run_forwarding_signals


def test_install_drops_the_library_notes_and_keeps_the_rest(caplog):
    quiet.install()
    quiet.install()  # idempotent: the entry point may run twice in one process (tests)
    deepspeed = logging.getLogger("DeepSpeed")
    assert len(deepspeed.filters) == 1
    with caplog.at_level(logging.WARNING):
        deepspeed.warning("Setting accelerator to CPU. If you have GPU or other accelerator, ...")
        deepspeed.warning("a real problem")
        logging.getLogger("user.code").warning("Setting accelerator to CPU, says my own code")
    assert [r.getMessage() for r in caplog.records] == [
        "a real problem",
        "Setting accelerator to CPU, says my own code",
    ]
    with warnings.catch_warnings(record=True) as seen:
        quiet.install()  # catch_warnings reset the filters
        warnings.warn(
            "`torch.distributed.all_gather_into_tensor` is deprecated. Please use ...", FutureWarning, stacklevel=1
        )
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else is deprecated"]


def test_node_launch_relays_every_line_the_training_processes_print(capfd, tmp_path):
    """The notes the launchers printed were once dropped by line patterns, which also dropped a
    user's own line that matched one. Now node_launch answers the launchers' notes by passing the
    values they note, and relays every line as it came."""
    user_lines = [
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 (my own note)",
        "*****************************************",
        "The following values were not passed to `accelerate launch`: my data loader's, that is",
    ]
    script = "import sys\n" + "".join(f"print({line!r}, file=sys.stderr)\n" for line in user_lines)
    code = _run_forwarding_signals([sys.executable, "-c", script], {}, tmp_path / "failure", 30.0)
    assert code == 0
    assert capfd.readouterr().err.splitlines() == user_lines


def test_tied_weights_are_saved_as_transformers_saves_them_without_accelerates_warning(caplog):
    """Accelerate drops the second name of a tied weight at each checkpoint and warns "Removed
    shared tensor" every time (through its own logger, as `[RANK 0] Removed ...`). The trainer's
    save_state hook drops the same names first: the same files, and nothing to warn about."""
    import torch
    from accelerate.state import PartialState
    from accelerate.utils.other import clean_state_dict_for_safetensors

    from distrain_cloud.training.trainer import _drop_tied_copies

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(10, 4)
            self.norm = torch.nn.LayerNorm(4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            self.lm_head.weight = self.wte.weight

    PartialState()  # accelerate's logger needs its state
    model = Tied()
    with caplog.at_level(logging.WARNING):
        accelerates = clean_state_dict_for_safetensors(model.state_dict())
    assert any("Removed shared tensor" in r.getMessage() for r in caplog.records)  # what the user saw
    caplog.clear()
    weights = [model.state_dict()]
    _drop_tied_copies([model], weights, "unused")
    with caplog.at_level(logging.WARNING):
        ours = clean_state_dict_for_safetensors(weights[0])
    assert caplog.records == []
    assert list(ours) == list(accelerates) == ["wte.weight", "norm.weight", "norm.bias"]
