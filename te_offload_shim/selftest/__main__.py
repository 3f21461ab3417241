"""`python -m te_offload_shim.selftest OUT [...]`: one measuring process of the selftest (measure.py)."""

import sys

from te_offload_shim.selftest import measure

sys.exit(measure.main())
