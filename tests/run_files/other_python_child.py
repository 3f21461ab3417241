"""Run by another Python under `te-offload-shim run` (tests/hostile/test_run_other_python.py): what
that interpreter sees of the launcher's environment, printed as JSON."""

import builtins
import importlib.util
import json
import os
import sys

if __name__ == "__main__":
    marker = sys.argv[1]  # a module that only the launcher's environment holds
    print(
        json.dumps(
            {
                "version": list(sys.version_info[:2]),
                "sys_path": sys.path,
                "shim": "te_offload_shim" in sys.modules,
                "marker": importlib.util.find_spec(marker) is not None,
                "user_sitecustomize": getattr(builtins, "USER_SITECUSTOMIZE", 0),
                "pythonpath": os.environ.get("PYTHONPATH"),
            }
        )
    )
