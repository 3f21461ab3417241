#!/usr/bin/env bash
# Builds the CPU environment the demo, the tests and the benchmarks run in: real megatron-core,
# real verl releases (one --no-deps folder each, used from fresh interpreters), wrapt 2.x in the
# venv and wrapt 1.x in a folder of its own; then one small venv (wrapt, pytest) per other
# supported CPython found (3.10, 3.12, 3.13), for the smoke pass of scripts/test.sh (tests/smoke).
# Idempotent: a second run only checks the stamps. Prints each step as "setup-env: [k/n] what".
#   scripts/setup-env.sh [--no-smoke | --demo]   --no-smoke: stop after the main environment: no smoke
#   venvs, no framework wheels or torch 2.15.0 that only the tests import (steps 13-18). --demo: only what demo/run.sh
#   imports (scripts/setup-demo.sh: the distributions of demo/requirements.txt, verl 0.8.0, TE
#   2.20.2 and what TE imports); the tests' releases, tools and frameworks are left for a later full run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.te-offload-shim-env-v5
SMOKE_MINORS=(10 12 13)
SMOKE_STAMP=.te-offload-shim-smoke-v1  # inside each .deps/py3.X
UV=.deps/uv/bin/uv
STEPS=18
SMOKE=1
DEMO=0
for arg in "$@"; do
  case $arg in
    --no-smoke) SMOKE=0 ;;
    --demo) DEMO=1 ;;
    *) echo "setup-env: unknown argument $arg (usage: scripts/setup-env.sh [--no-smoke | --demo])" >&2; exit 2 ;;
  esac
done
step() { echo "setup-env: [$1/$STEPS] $2"; }
pip() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }

if [[ $DEMO == 1 ]]; then  # the full environment holds the demo's; else the demo's alone (its own script)
  if [[ -f $STAMP ]]; then
    echo "setup-env: demo environment up to date (the full one, $STAMP)"
    exit 0
  fi
  exec scripts/setup-demo.sh
fi

# The .deps folders (--no-deps, one release each) by uv, which downloads in parallel and compiles
# their bytecode on both cores (pip: one file after another), in a lane beside the venv's own
# packages; torch 2.15.0 by pip in a third.
# Measured on the 2-core machine: 351 s one after another (pip's cache warm), 170 s in lanes (no
# package cache; before step 3 compiled its bytecode).
uv_target() {  # uv_target DIR REQUIREMENT...: bytecode compiled, as pip's --target writes it
  local dir=$1; shift
  "$UV" pip install -q --no-config --no-deps --compile-bytecode --python .venv/bin/python --target "$dir" "$@"
}
lanes=()
lane() { "$@" & lanes+=($!); }
wait_lanes() { local pid; for pid in "${lanes[@]}"; do wait "$pid"; done; lanes=(); }
trap 'kill "${lanes[@]}" 2>/dev/null || true' EXIT

# Transformer Engine's pure-Python code, one --no-deps folder per release (harness/te_releases.py PIP)
TE_SPECS=(
  1.9.0=1.9.0.post1 1.13.0 2.1.0 2.4.0 2.8.0 2.9.0 2.10.0 2.12.0 2.16.1 2.18.0 2.19.0 2.20.2
)

main_folders() {
  step 5 "verl 0.7.1, 0.8.0, 0.9.1 -> .deps/verl-X (beside the venv's packages)"
  for v in 0.7.1 0.8.0 0.9.1; do
    [[ -d .deps/verl-$v/verl ]] || uv_target ".deps/verl-$v" "verl==$v"
  done
  # a second release with _ParamAndGradBuffer.offload_to_cpu (0.16.0) and one without it (0.15.3)
  step 6 "megatron-core 0.16.0, 0.15.3 -> .deps/megatron-core-X"
  for v in 0.16.0 0.15.3; do
    [[ -d .deps/megatron-core-$v/megatron ]] || uv_target ".deps/megatron-core-$v" "megatron-core==$v"
  done
  step 7 "wrapt 1.17 -> .deps/wrapt-1"
  [[ -d .deps/wrapt-1/wrapt ]] || uv_target .deps/wrapt-1 "wrapt==1.17.*"
  step 8 "Transformer Engine, ${#TE_SPECS[@]} releases -> .deps/te-X"
  local spec v pinned
  for spec in "${TE_SPECS[@]}"; do
    v=${spec%%=*}; pinned=${spec#*=}
    [[ -f .deps/te-$v/transformer_engine/pytorch/__init__.py ]] || uv_target ".deps/te-$v" "transformer-engine==$pinned"
  done
  # what TE's modules import at their top besides torch (harness/te_releases.py PYDEPS); triton is
  # only imported (TE defines its Triton kernels at import), never run
  step 9 "onnx, onnxscript, einops -> .deps/te-pydeps"
  [[ -d .deps/te-pydeps/onnxscript ]] || uv_target .deps/te-pydeps onnx==1.23.2 onnxscript==0.7.2 \
      onnx-ir==1.1.0 ml-dtypes==0.6.0 einops==0.8.2
  step 10 "triton 3.9.0 (~290 MB) -> .deps/triton"
  [[ -d .deps/triton/triton ]] || uv_target .deps/triton triton==3.9.0
  # ms-swift 4.6.0 with what its Megatron trainers need to import, each --no-deps in one folder (TE is
  # served by harness/te_import_only.py: those modules import it, the offload never calls it). triton,
  # which mcore_bridge imports, is the shared .deps/triton above.
  step 11 "ms-swift 4.6.0 and its import dependencies -> .deps/ms-swift-4.6.0"
  [[ -d .deps/ms-swift-4.6.0/swift ]] || uv_target .deps/ms-swift-4.6.0 ms-swift==4.6.0 modelscope==1.40.2 \
      modelscope-hub==0.5.1 mcore-bridge==1.6.5 cryptography==50.0.2 cffi==2.1.1 json-repair==0.64.6 \
      einops==0.8.2 dacite==1.9.2 msgspec==0.23.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 \
      propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
}

# python3.X from PATH, else the newest pyenv 3.X, if it really is 3.X
find_python() {
  local minor=$1 exe
  for exe in "$(command -v "python3.$minor" || true)" \
      $(ls -d "$HOME"/.pyenv/versions/3."$minor".*/bin/python3."$minor" 2>/dev/null | sort -V -r); do
    [[ -n $exe && -x $exe ]] || continue
    [[ $("$exe" -c 'import sys; print(sys.version_info[1])' 2>/dev/null) == "$minor" ]] && { echo "$exe"; return 0; }
  done
  return 0
}

tests_folders() {
  step 13 "smoke venvs (wrapt 2.x, pytest) for CPython ${SMOKE_MINORS[*]/#/3.} -> .deps/py3.X"
  local minor dir exe v
  for minor in "${SMOKE_MINORS[@]}"; do
    dir=.deps/py3.$minor
    [[ -f $dir/$SMOKE_STAMP ]] && continue
    exe=$(find_python "$minor")
    if [[ -z $exe ]]; then
      echo "setup-env:   no python3.$minor on PATH or in ~/.pyenv: its smoke pass will not run"
      continue
    fi
    echo "setup-env:   $("$exe" -V) ($exe) -> $dir"
    "$exe" -m venv --clear "$dir"
    "$UV" pip install -q --no-config --compile-bytecode --python "$dir/bin/python" "wrapt>=2,<3" pytest
    touch "$dir/$SMOKE_STAMP"
  done
  # siiRL and Trinity-RFT, the real wheels, each --no-deps in a folder of its own (tests/integrations),
  # and in one shared folder each what their modules need to import here. flash_attn (siiRL's workers)
  # and vllm (Trinity-RFT's) have no wheel that imports on a CPU machine: harness/te_import_only.py
  # serves them.
  step 14 "siiRL 0.2.0 and 0.1.0.post1, Trinity-RFT 0.6.0 and 0.5.2, and their import dependencies"
  for v in 0.2.0 0.1.0.post1; do
    [[ -d .deps/siirl-$v/siirl ]] && continue
    uv_target ".deps/siirl-$v" "siirl==$v"
    rm -rf ".deps/siirl-$v/tests" ".deps/siirl-$v/docs" ".deps/siirl-$v/examples"  # top-level folders of the repo, not siirl
  done
  [[ -d .deps/siirl-pydeps/hydra ]] || uv_target .deps/siirl-pydeps loguru==0.7.3 hydra-core==1.3.2 \
      antlr4-python3-runtime==4.9.3
  for v in 0.6.0 0.5.2; do
    [[ -d .deps/trinity-rft-$v/trinity ]] || uv_target ".deps/trinity-rft-$v" "trinity-rft==$v"
  done
  [[ -d .deps/trinity-pydeps/tensorboard ]] || uv_target .deps/trinity-pydeps tensorboard==2.21.0 \
      absl-py==2.5.1 torchdata==0.11.0
  # The verl releases beside the three of step 5: 0.9.0 (the table's fixed_in), 0.4.0 (its floor) and
  # 0.6.1; the two older ones import transformers 4.x (0.6.1's AutoModelForVision2Seq, gone in 5) and
  # pkg_resources (setuptools < 81), served to their test processes from one folder placed first on
  # their path (tests/conftest.py LEGACY_VERL). No bytecode for transformers 4.57 (most of the
  # folder's time): a test process compiles what it imports, once.
  step 15 "verl 0.9.0, 0.6.1, 0.4.0 -> .deps/verl-X; transformers 4.57 for the older two -> .deps/verl-legacy-pydeps"
  for v in 0.9.0 0.6.1 0.4.0; do
    [[ -d .deps/verl-$v/verl ]] || uv_target ".deps/verl-$v" "verl==$v"
  done
  [[ -d .deps/verl-legacy-pydeps/transformers ]] || "$UV" pip install -q --no-config --no-deps \
      --python .venv/bin/python --target .deps/verl-legacy-pydeps transformers==4.57.6 huggingface-hub==0.36.2 \
      setuptools==80.10.2
  # PyPI's roll, slime and chatlearn: other projects under the frameworks' names, for the test that
  # status does not take them for the frameworks (tests/cli/test_status_distributions.py). chatlearn
  # 0.0.1 is an sdist whose setup.py declares python_requires='>=3.6.*', which setuptools 60 on
  # refuses: built by pip with an older one.
  step 16 "PyPI's roll 0.13.4, slime 0.0.0, chatlearn 0.0.1 (unrelated namesakes) -> .deps/namesakes"
  if [[ ! -d .deps/namesakes/chatlearn ]]; then
    printf 'setuptools<60\n' > .deps/namesakes-build-constraint.txt
    PIP_CONSTRAINT=$PWD/.deps/namesakes-build-constraint.txt pip --no-deps --target .deps/namesakes \
        roll==0.13.4 slime==0.0.0 chatlearn==0.0.1
  fi
  step 17 "wrapt 1.14 -> .deps/wrapt-1.14; DeepSpeed 0.19.8 and what it imports -> .deps/deepspeed-0.19.8"
  [[ -d .deps/wrapt-1.14/wrapt ]] || uv_target .deps/wrapt-1.14 "wrapt==1.14.*"
  # ZeRO-3's partitioning on the CPU (tests/twin/test_twin_net.py): the sdist built against the
  # venv's torch, no ops compiled (22 s here)
  [[ -d .deps/deepspeed-0.19.8/deepspeed ]] || DS_BUILD_OPS=0 pip --no-deps --no-build-isolation \
      --target .deps/deepspeed-0.19.8 deepspeed==0.19.8 hjson==3.1.0 py-cpuinfo==9.0.0 einops==0.8.2 ninja==1.13.2
}

# The newest torch the registry serves, in a folder put first on the path of one pass of
# scripts/test.sh: a CUDA build with its CUDA libraries (about 5.3 GB, from PyPI: 2.5 minutes here),
# run on the CPU. The longest item of the set-up: its own lane, from the start. This machine's pip
# caps torch at the releases on its disk (/etc/xdg/pip/constraints.txt, torch<=2.14.1): not for
# this folder.
torch_next() {
  echo "setup-env: [18/$STEPS] torch 2.15.0 and its dependencies -> .deps/torch-2.15.0 (beside the rest)"
  PIP_CONSTRAINT=/dev/null pip --target .deps/torch-2.15.0 torch==2.15.0
}

UV_PIN=$(grep -o 'uv==[0-9.]*' scripts/setup-demo.sh | head -n 1)  # one uv for both set-ups
step 1 "venv, uv ${UV_PIN#uv==} -> .deps/uv"
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
[[ -x $UV ]] || pip --no-deps --target .deps/uv "$UV_PIN"
if [[ $SMOKE == 1 && ! -d .deps/torch-2.15.0/torch ]]; then lane torch_next; fi

if [[ -f $STAMP ]]; then
  echo "setup-env: [2-11/$STEPS] main environment up to date ($STAMP)"
else
  lane main_folders
  step 2 "torch 2.13.0 (CPU), megatron-core 0.16.1"
  pip torch==2.13.0                       # the local CPU wheel; plain 'torch' would fetch a CUDA build
  pip megatron-core==0.16.1
  # by uv: it picked the very versions pip picks (pip freeze compared); torch stays the CPU build
  # step 2 installed, which satisfies every requirement on torch. Bytecode compiled: where
  # PYTHONDONTWRITEBYTECODE is set (this project's machines) every test interpreter would otherwise
  # compile what it imports (`import ray, transformers, datasets`: 5.1 s uncompiled, 2.8 s compiled).
  # pytest 9.1: pytest-xdist 3.8's --dist loadgroup sets `item._nodeid`, which pytest 9.2 no longer
  # reads, so 9.2 silently sends a group's tests to both workers, one of them waiting on the other's
  # twin process (tests/tools/test_xdist_groups.py)
  step 3 "verl's and the tools' dependencies (transformers, ray, wrapt 2.x, pytest, ruff, mypy...) by uv"
  "$UV" pip install -q --no-config --compile-bytecode --python .venv/bin/python tensordict==0.10.0 \
      "transformers>=5.5.3,<5.11,!=5.6.0" omegaconf codetiming orjson ray "wrapt>=2,<3" cloudpickle peft \
      datasets pillow pytest==9.1.1 pytest-xdist==3.8.0 ruff mypy
  step 4 "te-offload-shim itself (editable)"
  pip --no-deps -e .
  wait_lanes  # main_folders (and torch 2.15.0, which the stamp does not cover, is waited for below too)
  touch "$STAMP"
fi

# Its own step, checked by its own file: an environment built before it was added gains it without
# rebuilding the steps above.
if [[ -x .venv/bin/lint-imports ]]; then
  step 12 "import-linter: present"
else
  step 12 "import-linter (lint-imports: the layer contracts in pyproject.toml)"
  pip import-linter==2.17
fi

if [[ $SMOKE == 0 ]]; then
  step 13-$STEPS "smoke venvs and the tests' framework wheels: skipped (--no-smoke)"
  exit 0
fi
lane tests_folders
wait_lanes
echo "setup-env: done in ${SECONDS} s"
