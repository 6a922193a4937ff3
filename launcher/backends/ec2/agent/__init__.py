"""The EC2 node agent, split by its own sections; `python -m` on this package runs it (run.py's
`main`; the agent itself: node.py).

It ships in the code bundle (launcher/bundle.py) and runs before the training requirements matter:
stdlib and boto3 only (through infra.aws), and nothing of the launcher but this folder, the S3
key layout beside it and the light package files above them.
"""
