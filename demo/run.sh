#!/usr/bin/env bash
# The demo on a fresh machine: builds what the demo needs (once: scripts/setup-env.sh --demo, not the
# tests' other releases, tools and frameworks), then runs verl's real offload on a real megatron-core model built from
# TE's own layers (on a CPU machine, TE on its CPU twin), without and with the shim.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh --demo
exec .venv/bin/python demo/demo.py "$@"
