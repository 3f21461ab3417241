#!/usr/bin/env bash
# First `te-offload-shim selftest` (docs/cluster.md: TE layers' FP8 caches offloaded and flushed with
# the clearing off, then on, the driver's figures around each); where it cannot run here (exit 2: no
# GPU, no TE, no FP8 on this GPU), neither can the demo, and the script stops with its status. Then
# the demo on a CUDA machine with TE's real kernels (demo mode "te", harness/demo_mode.py): no twin,
# no stand-ins; the header says which mode ran and the driver-visible memory (torch.cuda.mem_get_info)
# is printed before and after the offload. Needs an environment where torch sees the GPU and TE's
# compiled extension imports (e.g. an NVIDIA PyTorch container with transformer-engine[pytorch]),
# megatron-core 0.16.1, and verl 0.8.0 in .deps/verl-0.8.0 (scripts/setup-env.sh --demo makes it
# where the registry is reachable). Fails, saying why, when this machine cannot give mode "te".
#   scripts/device-demo.sh [demo.py arguments]      PYTHON=... picks the interpreter (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
status=0
"$PY" -m te_offload_shim selftest || status=$?
if [ "$status" -eq 2 ]; then exit 2; fi
"$PY" - <<'PY'
import torch
from harness import demo_mode
facts = demo_mode.facts("2.20.2")
print(f"device-demo: torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {facts.cuda}, "
      f"TE's extension: {'imports' if facts.te_extension is None else facts.te_extension}")
if facts.cuda:
    free, total = torch.cuda.mem_get_info()
    print(f"device-demo: {torch.cuda.get_device_name()}, driver-visible free {free / 2**30:.2f} of {total / 2**30:.2f} GiB")
PY
"$PY" demo/demo.py --mode te "$@" || status=$?
exit "$status"
