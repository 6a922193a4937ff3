"""Errors meant for users: one line that names what they wrote and how to fix it.

It lives in infra/ because both infra and the launcher raise it, and imports run
launcher -> infra only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class UserError(Exception):
    """Bad input or an environment problem the user can fix. The CLI prints it as one line
    and exits non-zero; tracebacks only with DISTRAIN_DEBUG=1."""

    exit_code = 2


@contextlib.contextmanager
def value_errors_as_user_errors() -> Iterator[None]:
    """Training's torch-free helpers the launcher plans with (strategies, node_launch) refuse bad
    input with a ValueError whose message is already one line naming the flag: show it as such."""
    try:
        yield
    except ValueError as e:
        raise UserError(str(e)) from None
