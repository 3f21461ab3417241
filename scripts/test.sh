#!/usr/bin/env bash
# The test command (README, .ci/run): set-up, static checks, the suite, then the tests of the wrapper
# itself again with wrapt 1.x and with wrapt 1.14 (the declared floor) first on the path (users' images
# pin either 1.x or 2.x), a subset under torch 2.15.0, then the smoke pass on the other supported
# Pythons (scripts/smoke.sh).
# Arguments go to pytest (and skip the wrapt 1.x and smoke passes): `scripts/test.sh tests/hostile` runs one folder.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh
echo "--- ruff, ruff format, mypy, lint-imports"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # pyproject.toml [tool.mypy] files: the package, tests (less tests/mirrors), harness, benchmarks, demo
.venv/bin/lint-imports --no-cache  # the layer contracts, pyproject.toml [tool.importlinter] (docs/architecture.md)
echo "--- the suite (pytest -n 2)"
runtime_lines=$(mktemp)  # tests/tools/test_code_budget.py writes what a training process loaded there
trap 'rm -f "$runtime_lines"' EXIT
# loadgroup: the tests of one xdist_group (tests/te/test_te_real.py, which share one probe run) on one worker;
# --durations=25: the slowest 25, for the CI budget
TEST_RUNTIME_CODE_LINES="$runtime_lines" .venv/bin/python -m pytest -n 2 --dist loadgroup -q --durations=25 "$@"
echo "--- code lines: the runtime a training process loads (a gate) and the package (a ceiling), docs/testing.md"
.venv/bin/python scripts/codelines.py --report "$runtime_lines"
if [[ $# -eq 0 ]]; then
  WRAPPER_TESTS=(tests/hostile/test_wrapper_transparency.py tests/engine/test_import_order.py
    tests/integrations/test_verl.py::test_shim_imported_before_verl)
  WRAPPER_K="wrapper_transparency or pickling or reload or wrapt_in_use or torch_in_use or [patch-import] or [import-patch-unpatch-patch] or test_shim_imported_before_verl"
  echo "--- the wrapper's own tests again under wrapt 1.x ($(ls -d .deps/wrapt-1/wrapt-*.dist-info | sed 's/.*wrapt-\(.*\)\.dist-info/\1/'))"
  TEST_PYTHONPATH_PREFIX="$PWD/.deps/wrapt-1" TEST_EXPECT_WRAPT_MAJOR=1 .venv/bin/python -m pytest -n 2 -q \
    "${WRAPPER_TESTS[@]}" -k "$WRAPPER_K"
  echo "--- and under wrapt 1.14, the declared floor (.deps/wrapt-1.14)"
  TEST_PYTHONPATH_PREFIX="$PWD/.deps/wrapt-1.14" TEST_EXPECT_WRAPT=1.14 .venv/bin/python -m pytest -n 2 -q \
    "${WRAPPER_TESTS[@]}" -k "$WRAPPER_K"
  # torch 2.15.0, the newest the registry serves (a CUDA build, run on the CPU), first on every path:
  # the wrapper's tests, verl 0.8.0's offload, the flush net's tests and the twin's clearing on TE 2.20
  echo "--- under torch 2.15.0 (.deps/torch-2.15.0): the wrapper's tests, verl 0.8.0, the net, the twin on TE 2.20.2"
  TORCH_NEXT=(env PYTHONPATH="$PWD/.deps/torch-2.15.0" TEST_PYTHONPATH_PREFIX="$PWD/.deps/torch-2.15.0"
    TEST_EXPECT_TORCH=2.15.0)
  "${TORCH_NEXT[@]}" .venv/bin/python -m pytest -n 2 -q "${WRAPPER_TESTS[@]}" -k "($WRAPPER_K) and not 0.7.1"
  "${TORCH_NEXT[@]}" .venv/bin/python -m pytest -n 2 -q tests/engine/test_net.py tests/hostile/test_net_hostile.py
  # The smoke pass (small interpreters, mostly waiting on their start-up) runs beside the twin's
  # pass; its output is printed after it.
  smoke_log=$(mktemp)
  scripts/smoke.sh > "$smoke_log" 2>&1 &
  smoke_pid=$!
  # a run of its own: tests/twin has its own conftest module. Every twin cell of TE 2.20.2 (both GPUs,
  # both parameter types, the per-copy controls, the kernels); the whole stack's ids, a fresh
  # interpreter each, run under torch 2.13 only (CI's budget)
  "${TORCH_NEXT[@]}" TE_TWIN_RELEASES=2.20.2 .venv/bin/python -m pytest -n 2 --dist loadgroup -q tests/twin \
    -k "not test_verl_offload_of_megatron_gpt"
  echo "--- smoke: the standard-library parts on CPython 3.10, 3.12, 3.13 (tests/smoke, venvs in .deps/py3.X)"
  smoke_ok=0
  wait "$smoke_pid" || smoke_ok=$?
  cat "$smoke_log"
  rm -f "$smoke_log"
  [[ $smoke_ok == 0 ]]
fi
