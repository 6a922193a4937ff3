"""Errors meant for users: one line that names what they wrote and how to fix it.

It lives in infra/ because both infra and the launcher raise it, and imports run
launcher -> infra only.
"""


class UserError(Exception):
    """Bad input or an environment problem the user can fix. The CLI prints it as one line
    and exits non-zero; tracebacks only with DISTRAIN_DEBUG=1."""

    exit_code = 2
