"""Put this folder first on PYTHONPATH (with the repository): each measuring process that
`te-offload-shim selftest` starts (`python -m te_offload_shim.selftest ...`) runs on the CPU twin.

`TE_TWIN_SITE` says what the process gets:
- `2.20.2` (or `2.20.2:100` for sm100): the shim imported first (as the `.pth` or `run` give a job),
  then TE of that release on the twin (harness/te_twin), and the selftest's offload run under the
  twin's host scope (host.py), so what it moves to the CPU answers as a host tensor does on a GPU;
- `device`: only the twin's device answers (a GPU, sm90), and no TE: what a GPU machine without
  Transformer Engine gives.
Every other process (the command itself among them) is left as it is.
"""

from __future__ import annotations

import os
import sys

if "te_offload_shim.selftest" in sys.orig_argv:
    _what = os.environ.get("TE_TWIN_SITE", "2.20.2")
    import te_offload_shim  # noqa: F401  (before TE, as its start-up hook would be)

    if _what == "device":
        from harness.te_twin import device

        device.install(90)
    else:
        from harness import te_twin
        from te_offload_shim.selftest import measure

        _release, _, _sm = _what.partition(":")
        te_twin.load(_release, sm=int(_sm or 90))
        _offload = measure.offload

        def _hosted(models: list) -> None:
            with te_twin.host.offloading():
                _offload(models)

        measure.offload = _hosted
