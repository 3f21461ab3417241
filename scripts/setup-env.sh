#!/usr/bin/env bash
# Builds the CPU test environment: real megatron-core, real verl releases (one folder each), wrapt.
# Idempotent: a second run only checks what is there. Recipe: REFERENCE.md section 6.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [[ ! -x $VENV/bin/python ]]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
pip_q() { python -m pip install -q --disable-pip-version-check "$@"; }
if ! python -c 'import torch, megatron.core, ray, wrapt, pytest' 2>/dev/null; then
  pip_q torch==2.13.0
  pip_q megatron-core==0.16.1
  pip_q tensordict==0.10.0 "transformers>=5.5.3,<5.11,!=5.6.0" omegaconf codetiming orjson ray wrapt \
        pytest cloudpickle peft datasets pillow ruff mypy
fi
pip_q -e . --no-deps
for v in 0.7.1 0.8.0 0.9.1; do
  d=.deps/verl-$v
  [[ -d $d/verl ]] || python -m pip install -q --disable-pip-version-check --no-deps --target "$d" "verl==$v"
done
