#!/usr/bin/env bash
# The demo on a fresh machine: installs once what the demo imports and nothing else (scripts/setup-env.sh
# --demo runs scripts/setup-demo.sh: demo/requirements.txt, verl 0.8.0, TE 2.20.2 and what TE imports,
# pinned, --no-deps; not the tests' other releases, tools and frameworks), then runs verl's real offload
# on a real megatron-core model built from TE's own layers (on a CPU machine, TE on its CPU twin),
# without and with the shim. On a fresh clone here the first line came after a median of 108 s with no
# package cache, 73 s with pip's and uv's (3 runs each, the 2 cores shared with other work; 228 s before, one run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-env.sh --demo
exec .venv/bin/python demo/demo.py "$@"
