#!/usr/bin/env bash
# The demo on a fresh machine: builds the environment (once; not the other Pythons' smoke venvs,
# which only the tests use), then runs verl's real offload on a real megatron-core model built from
# TE's own layers (on a CPU machine, TE on its CPU twin), without and with the shim.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh --no-smoke
exec .venv/bin/python demo/demo.py "$@"
