#!/usr/bin/env bash
# Builds the CPU environment the demo, the tests and the benchmarks run in: real megatron-core,
# real verl releases (one --no-deps folder each, used from fresh interpreters), wrapt 2.x in the
# venv and wrapt 1.x in a folder of its own. Idempotent: a second
# run only checks the stamp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.te-offload-shim-env-v4
[[ -f $STAMP ]] && exit 0
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
pip torch==2.13.0                       # the local CPU wheel; plain 'torch' would fetch a CUDA build
pip megatron-core==0.16.1
pip tensordict==0.10.0 "transformers>=5.5.3,<5.11,!=5.6.0" omegaconf codetiming orjson ray \
    "wrapt>=2,<3" cloudpickle peft datasets pillow \
    pytest pytest-xdist ruff mypy
pip --no-deps -e .
for v in 0.7.1 0.8.0 0.9.1; do
  [[ -d .deps/verl-$v/verl ]] || pip --no-deps --target ".deps/verl-$v" "verl==$v"
done
# a second release with _ParamAndGradBuffer.offload_to_cpu (0.16.0) and one without it (0.15.3)
for v in 0.16.0 0.15.3; do
  [[ -d .deps/megatron-core-$v/megatron ]] || pip --no-deps --target ".deps/megatron-core-$v" "megatron-core==$v"
done
[[ -d .deps/wrapt-1/wrapt ]] || pip --no-deps --target .deps/wrapt-1 "wrapt==1.17.*"
# Transformer Engine's pure-Python code, one --no-deps folder per release (harness/te_releases.py PIP)
for spec in 1.9.0=1.9.0.post1 1.13.0 2.1.0 2.4.0 2.8.0 2.9.0 2.10.0 2.12.0 2.16.1 2.18.0 2.19.0 2.20.2; do
  v=${spec%%=*}; pinned=${spec#*=}
  [[ -f .deps/te-$v/transformer_engine/pytorch/__init__.py ]] && continue
  echo "setup-env: transformer-engine==$pinned -> .deps/te-$v"
  pip --no-deps --target ".deps/te-$v" "transformer-engine==$pinned"
done
# what TE's modules import at their top besides torch (harness/te_releases.py PYDEPS); triton is
# only imported (TE defines its Triton kernels at import), never run
[[ -d .deps/te-pydeps/onnxscript ]] || { echo "setup-env: onnx, onnxscript, einops -> .deps/te-pydeps"
  pip --no-deps --target .deps/te-pydeps onnx==1.23.2 onnxscript==0.7.2 onnx-ir==1.1.0 ml-dtypes==0.6.0 einops==0.8.2; }
[[ -d .deps/triton/triton ]] || { echo "setup-env: triton 3.9.0 (~290 MB) -> .deps/triton"
  pip --no-deps --target .deps/triton triton==3.9.0; }
# ms-swift 4.6.0 with what its Megatron trainers need to import, each --no-deps in one folder (TE is
# served by harness/te_import_only.py: those modules import it, the offload never calls it). triton,
# which mcore_bridge imports, is the shared .deps/triton above.
if [[ ! -d .deps/ms-swift-4.6.0/swift ]]; then
  echo "setup-env: ms-swift 4.6.0 and its import dependencies -> .deps/ms-swift-4.6.0"
  pip --no-deps --target .deps/ms-swift-4.6.0 ms-swift==4.6.0 modelscope==1.40.2 modelscope-hub==0.5.1 \
      mcore-bridge==1.6.5 cryptography==50.0.2 cffi==2.1.1 json-repair==0.64.6 einops==0.8.2 \
      dacite==1.9.2 msgspec==0.23.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 \
      aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
fi
touch "$STAMP"
