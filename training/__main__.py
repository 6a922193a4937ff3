"""The job entry point: `python -m distrain_cloud.training [training flags]`.

Every backend starts this, one process per device, through `accelerate launch`
(see node_launch.py). Bad input exits 2 with one line on stderr and the same line in the
contract's failure file; nothing else is written.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    from .args import ArgumentError, parse_args
    from .contract import Contract

    contract = None  # a bad argument is reported in the contract's failure file too
    try:
        contract = Contract.from_env()
        args = parse_args(argv)
    except (ArgumentError, ValueError) as e:
        _fail(e, contract)
    from .data import DataError
    from .trainer import Trainer

    trainer = Trainer(args, contract)
    try:
        trainer.setup()
    except DataError as e:
        _fail(e, contract)
    metrics = trainer.train()
    trainer.save(metrics)


def _fail(error: Exception, contract) -> None:
    message = f"error: {error}"
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, file=sys.stderr, flush=True)
        if contract is not None:
            contract.failure_file.parent.mkdir(parents=True, exist_ok=True)
            contract.failure_file.write_text(message + "\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
