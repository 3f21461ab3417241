"""`te-offload-shim` as an installed console script runs it, for a package folder given as the first
argument (tests/hostile/test_run_other_python.py: the launcher's environment is that folder)."""

import sys

if __name__ == "__main__":
    sys.path.insert(0, sys.argv.pop(1))
    from te_offload_shim.cli import main

    sys.exit(main())
