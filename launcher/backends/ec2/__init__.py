"""The EC2 backend: the launcher's side (backend, request, status, user_data, boot.py) and the
node's (agent/, layout.py); docs/ec2.md describes the whole. Deliberately empty: the node imports
this package on its way to the agent, with nothing of the launcher installed."""
