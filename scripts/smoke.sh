#!/usr/bin/env bash
# The smoke pass of scripts/test.sh: tests/smoke (the package's standard-library parts: import
# watcher, user targets, CLI, .pth route, `run`) on each CPython that scripts/setup-env.sh made a
# venv for (.deps/py3.X). Says which interpreter passed; fails when one fails.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
for minor in 10 12 13; do
  py=.deps/py3.$minor/bin/python
  if [[ ! -x $py ]]; then
    echo "smoke: python3.$minor NOT RUN: no $py (scripts/setup-env.sh found no python3.$minor)"
    [[ ${CI:-} != true ]] || failed+=("3.$minor (no venv, and CI=true)")  # CI's set-up makes every one
    continue
  fi
  version=$("$py" -c 'import platform; print(platform.python_version())')
  if "$py" -m pytest -q -p no:cacheprovider --no-header tests/smoke; then
    echo "smoke: CPython $version passed"
  else
    echo "smoke: CPython $version FAILED"
    failed+=("$version")
  fi
done
[[ ${#failed[@]} -eq 0 ]] || { echo "smoke: failed on CPython ${failed[*]}"; exit 1; }
