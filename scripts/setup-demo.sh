#!/usr/bin/env bash
# What demo/run.sh needs and nothing else (run as scripts/setup-env.sh --demo): the distributions
# the demo's three processes import (scripts/demo-imports.py lists them), each pinned, --no-deps.
# torch 2.13.0 (CPU) by pip, which finds the machine's CPU wheel (README, Install), in the
# background; meanwhile by uv the rest of demo/requirements.txt into the venv, and verl 0.8.0,
# TE 2.20.2 and what TE imports into the .deps folders the full environment uses (uv downloads in
# parallel and compiles nothing: here about three times faster than pip). Real packages throughout,
# triton 3.9.0 included: TE defines its Triton kernels at import; the demo runs none. Idempotent;
# a later scripts/setup-env.sh (no flag) builds the rest on top and changes none of these versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEMO_STAMP=.venv/.te-offload-shim-demo-v1
UV=.deps/uv/bin/uv
if [[ -f $DEMO_STAMP ]]; then
  echo "setup-demo: demo environment up to date"
  exit 0
fi
uv_install() { "$UV" pip install -q --no-config --no-deps "$@"; }
# Python with its bytecode written, quiet unless it fails. uv compiles none (pip compiles torch, in
# the background), Python none at import where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines), and compiling every installed file would cost more than the demo's own run: the modules
# the demo imports are compiled by importing them once, so that its three processes load them.
bytecode() {
  local out
  out=$(env -u PYTHONDONTWRITEBYTECODE "$@" 2>&1) || { echo "$out" >&2; return 1; }
}

echo "setup-demo: [1/5] venv, uv 0.13.9 -> .deps/uv"
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
[[ -x $UV ]] || .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --target .deps/uv uv==0.13.9
echo "setup-demo: [2/5] torch 2.13.0 (CPU) by pip, meanwhile the rest by uv"
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps torch==2.13.0 &
torch_pid=$!
trap 'kill $torch_pid 2>/dev/null || true' ERR
echo "setup-demo: [3/5] $(grep -c '^[a-z]' demo/requirements.txt) distributions of demo/requirements.txt -> .venv"
uv_install --python .venv/bin/python -r demo/requirements.txt
echo "setup-demo: [4/5] verl 0.8.0, Transformer Engine 2.20.2, onnx, onnxscript, einops, triton 3.9.0 -> .deps"
[[ -d .deps/verl-0.8.0/verl ]] || uv_install --target .deps/verl-0.8.0 verl==0.8.0
[[ -f .deps/te-2.20.2/transformer_engine/pytorch/__init__.py ]] || \
    uv_install --target .deps/te-2.20.2 transformer-engine==2.20.2
[[ -d .deps/te-pydeps/onnxscript ]] || uv_install --target .deps/te-pydeps onnx==1.23.2 onnxscript==0.7.2 \
    onnx-ir==1.1.0 ml-dtypes==0.6.0 einops==0.8.2
[[ -d .deps/triton/triton ]] || uv_install --target .deps/triton triton==3.9.0
wait $torch_pid
echo "setup-demo: [5/5] bytecode of the modules the demo imports (a small run of one of its cases)"
bytecode PYTHONPATH="$PWD:$PWD/.deps/verl-0.8.0" .venv/bin/python demo/demo.py --case with --layers 1 --hidden 16
touch "$DEMO_STAMP"
