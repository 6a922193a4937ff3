"""Started with every process of a test run whose PYTHONPATH names this folder (the `auto_as_on_gpus`
fixture): --strategy auto decides as on CUDA GPUs of one node, with the thresholds the run's
environment gives, so that CPU processes take the path a GPU job takes (strategies.resolve_auto)."""

import os

from distrain_cloud.training import strategies

_resolve = strategies.resolve_auto


def _as_on_gpus(args, *, cuda, **kwargs):
    return _resolve(args, cuda=True, **kwargs)


strategies.resolve_auto = _as_on_gpus
strategies.AUTO_IN_GRAPH_MIN_STEPS = int(os.environ["DISTRAIN_TEST_AUTO_MIN_STEPS"])
strategies.AUTO_IN_GRAPH_MAX_PARAMS = int(os.environ["DISTRAIN_TEST_AUTO_MAX_PARAMS"])
