"""The job entry point: `python -m distrain_cloud.training [training flags]`.

Every backend starts this, one process per device, through `accelerate launch`, or
directly where one process alone runs on one machine (see node_launch.py). Bad input exits 2
with one line on stderr and the same line in the contract's failure file; nothing else is
written. A checkpoint this run cannot resume exits 2 the same way; a save that fails on the disk
(full, read-only) exits 1, also with one line.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from . import quiet
from .contract import INTERRUPT_EXIT_CODE, STOP_EXIT_CODES

if TYPE_CHECKING:
    from .contract import Contract


def main(argv: Sequence[str] | None = None) -> None:
    # node_launch starts accelerate's launcher with SIGINT/SIGTERM ignored (it signals the
    # training processes itself); a process that ignores them inherits that: take the defaults
    # back until the trainer installs its own stop handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    quiet.install()
    try:
        _run(argv)
    except SystemExit as e:
        if e.code in STOP_EXIT_CODES:  # a stop (SIGTERM, Ctrl-C): its checkpoint is saved
            _leave(e.code)
        raise
    except KeyboardInterrupt:  # Ctrl-C before training started: nothing to save
        print("stopped: interrupted before training started (nothing to save)", file=sys.stderr, flush=True)
        sys.exit(INTERRUPT_EXIT_CODE)
    except Exception as e:  # noqa: BLE001 - anything else is still one line; its traceback goes to a file
        _fail_unexpected(e)
    _leave(0)


def _leave(code: int) -> NoReturn:
    """Exit `code` after a finished or stopped run, whose outputs or checkpoint are written, tracker
    finished and process group destroyed, without the interpreter's teardown: C++ threads of
    torch.distributed or DeepSpeed being destroyed there now and then aborted such a process
    ("terminate called without an active exception", SIGABRT), and torchrun then failed the job."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(argv: Sequence[str] | None) -> None:
    from .args import ArgumentError, parse_args
    from .contract import Contract
    from .precision import resolve_precision
    from .stopping import die_with_parent

    if os.environ.get("DISTRAIN_DIE_WITH_LAUNCHER"):  # node_launch's: no trainer outlives its launcher,
        die_with_parent(signal.SIGKILL)  # from before the data load (a Hub download may take minutes)

    try:
        contract = Contract.from_env()
    except ValueError as e:  # every node says it: RANK, which picks the one that prints, is the engine's
        _fail(e, None, every_process=True)
    try:
        args = parse_args(argv)
        chose = resolve_precision(args)  # before anything reads it; the launcher always gives it
    except (ArgumentError, ValueError) as e:  # reported in the contract's failure file too
        _fail(e, contract)
    contract.use_compile_cache()  # before the trainer's imports fix torch's default folder
    from .data import DataError, load_checked
    from .phases import slow_phase

    say = (lambda line: print(line, flush=True)) if int(os.environ.get("RANK", "0")) == 0 else (lambda line: None)
    try:  # before torch and the trainer's imports: bad data is one line in a second, not in five
        with slow_phase("loading the data (downloaded on first use)", say):
            raw = load_checked(args, contract)
    except DataError as e:
        _fail(e, contract)
    from .checkpoint import CheckpointError
    from .hub import HubPushError
    from .trainer import Trainer

    trainer = Trainer(args, contract, precision_note=chose, raw_data=raw)
    try:
        trainer.setup()
    except (ArgumentError, DataError) as e:  # a flag this machine cannot serve, or bad data
        _fail(e, contract)
    try:
        metrics = trainer.train()
        trainer.save(metrics)
    except CheckpointError as e:  # a checkpoint that cannot be resumed, or a full disk
        _fail(e, contract, code=e.exit_code, every_process=e.every_process)
    except HubPushError as e:  # the model is saved; the line says how to retry the push alone
        _fail(e, contract, code=1)
    # For node_launch (each node's, so each node's first process): the job completed, whatever
    # its launchers exit with on the way out.
    completed = os.environ.get("DISTRAIN_COMPLETED_FILE")
    if completed and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            with open(completed, "w") as f:
                f.write("completed\n")
        except OSError:  # a full disk: the launchers' exit code decides alone
            pass


def _fail_unexpected(error: Exception) -> NoReturn:
    """A failure no check foresaw (a library's error, a bug): one line naming it, on every
    process (it may be this one's alone), exit 1. The traceback goes to output/traceback.txt
    (printed instead with DISTRAIN_DEBUG=1)."""
    import traceback

    from .contract import Contract

    if os.environ.get("DISTRAIN_DEBUG"):
        raise error
    contract, where = None, ""
    try:
        contract = Contract.from_env()
        rank = os.environ.get("RANK", "0")
        path = contract.output_dir / ("traceback.txt" if rank == "0" else f"traceback-rank{rank}.txt")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(error)))
        where = f" (traceback in {path}; DISTRAIN_DEBUG=1 prints it)"
    except (OSError, ValueError):
        where = " (DISTRAIN_DEBUG=1 prints the traceback)"
    reason = str(error).strip().splitlines()[0] if str(error).strip() else "(no message)"
    _fail(RuntimeError(f"{type(error).__name__}: {reason}{where}"), contract, code=1, every_process=True)


def _fail(error: Exception, contract: Contract | None, code: int = 2, every_process: bool = False) -> NoReturn:
    """One `error:` line on stderr and in the failure file, then exit `code`; the traceback
    only with DISTRAIN_DEBUG=1. Printed by the main process, or by whichever process hit it
    (`every_process`: a failed write on one process that the others may never see)."""
    if os.environ.get("DISTRAIN_DEBUG"):
        raise error
    message = f"error: {error}"
    if every_process or int(os.environ.get("RANK", "0")) == 0:
        print(message, file=sys.stderr, flush=True)
        if contract is not None:
            try:
                contract.failure_file.parent.mkdir(parents=True, exist_ok=True)
                contract.failure_file.write_text(message + "\n")
            except OSError:  # the disk that is full may hold the failure file too: stderr has the line
                pass
    sys.exit(code)


if __name__ == "__main__":
    main()
