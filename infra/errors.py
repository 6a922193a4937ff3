"""Errors meant for users: one line that names what they wrote and how to fix it.

It lives in infra/ because both infra and the launcher raise it, and imports run
launcher -> infra only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# Exit codes by class (README: "Exit codes"), so a script can tell what to do without the message.
EXIT_JOB_FAILED = 1  # also: a dry run whose plan failed a check
EXIT_USAGE = 2  # a bad flag, spec or file; anything the user fixes in what they typed
EXIT_CREDENTIALS = 3  # none, expired, rejected: log in again
EXIT_PERMISSION = 4  # AWS denied an action: grant it
EXIT_CAPACITY = 5  # quota, capacity or throttling: ask for more, go elsewhere, or retry later


class UserError(Exception):
    """Bad input or an environment problem the user can fix. The CLI prints it as one line
    and exits non-zero (its class's code); tracebacks only with DISTRAIN_DEBUG=1."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str = "", *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


@contextlib.contextmanager
def value_errors_as_user_errors() -> Iterator[None]:
    """Training's torch-free helpers the launcher plans with (strategies, node_launch) refuse bad
    input with a ValueError whose message is already one line naming the flag: show it as such."""
    try:
        yield
    except ValueError as e:
        raise UserError(str(e)) from None
