"""Run under `te-offload-shim run` (tests/activation/test_cli_run.py): prints [PYTHONPATH, shim loaded] as JSON."""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    print(json.dumps([os.environ["PYTHONPATH"], "te_offload_shim" in sys.modules]))
