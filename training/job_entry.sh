#!/usr/bin/env bash
# The start of every cloud job, run from the unpacked code bundle with the node launcher's
# arguments (SageMaker passes --hyperparameters FILE). It travels in the bundle, not in the
# request, so the code the plan hashed is the code that runs and the request stays within
# the API's limits (a ContainerEntrypoint item is at most 256 characters, one line).
set -euo pipefail
CODE="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # the folder the bundle was unpacked into
cd "$CODE"
export PYTHONPATH="$CODE${PYTHONPATH:+:$PYTHONPATH}"
if [ -s requirements.txt ]; then
  python -m pip install --quiet --disable-pip-version-check -r requirements.txt
fi
# Secrets are resolved here, inside the job, from the references in DISTRAIN_SECRETS.
exec python -m distrain_cloud.infra.secret_env -- python -m distrain_cloud.training.node_launch "$@"
