#!/usr/bin/env bash
# The test command (README, .ci/run): set-up, static checks, the suite, then the suites that wrap
# functions again with wrapt 1.x first on the path (users' images pin either 1.x or 2.x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy te_offload_shim
.venv/bin/python -m pytest -n 2 -q "$@"
if [[ $# -eq 0 ]]; then
  echo "--- again under wrapt 1.x ($(ls -d .deps/wrapt-1/wrapt-*.dist-info | sed 's/.*wrapt-\(.*\)\.dist-info/\1/'))"
  TEST_PYTHONPATH_PREFIX="$PWD/.deps/wrapt-1" TEST_EXPECT_WRAPT_MAJOR=1 .venv/bin/python -m pytest -n 2 -q \
    tests/test_verl.py tests/test_import_order.py tests/test_faults.py tests/test_frameworks.py \
    tests/hostile/test_wrapper_transparency.py
fi
