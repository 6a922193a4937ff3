"""`python -m distrain_cloud.launcher.backends.ec2.agent`: what the user data runs on every node."""

from .run import main

main()
