"""`python -m te_offload_shim ...`: the same as the `te-offload-shim` console script."""

import sys

from te_offload_shim.cli import main

sys.exit(main())
