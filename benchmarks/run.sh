#!/usr/bin/env bash
# The one benchmark command: set up the environment, then every benchmark, one table (see BENCHMARKS.md).
set -euo pipefail; cd "$(dirname "$0")/.."; scripts/setup-env.sh; exec .venv/bin/python benchmarks/run.py "$@"
