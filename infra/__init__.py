"""The AWS side: one CloudFormation stack (stack.py, stack.yaml), job roles, the boto3 adaptor."""

# The stack a command uses when named none. Here, not in stack.py, so that the CLI's option defaults
# cost `--help` no import of stack.py (its dataclasses and patterns: 7-9 ms of about 100, measured
# with python -X importtime; bench/cli_startup.py times the whole).
DEFAULT_STACK = "distrain-cloud"
