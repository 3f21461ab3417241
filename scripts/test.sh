#!/usr/bin/env bash
# The test command (README, .ci/run): set-up, static checks, then the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
.venv/bin/ruff check .
.venv/bin/mypy te_offload_shim
.venv/bin/python -m pytest -n 2 -q "$@"
