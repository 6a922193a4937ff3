"""distrain-cloud: one job spec, three places to train (SageMaker, EC2, local)."""

__version__ = "0.1.0"
