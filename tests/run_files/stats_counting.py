"""The stats file of a process that counted (tests/engine/test_stats.py), `TE_OFFLOAD_SHIM_STATS` set.

`python stats_counting.py WHAT`: counts one thing through engine/stats.py's functions (WHAT: `freed`, a
table clearing that freed something, then a call that freed nothing; `table`, a call that freed
nothing; `flush`, a flush seen; `failed`, a clearing failed open; `left-alone`, a call left alone;
`net-failed`, `undecided`, `te-globals`, `audit`, `nothing`: no offload nor flush counted). Prints,
as JSON, whether the stats file existed before the process exits (the exit write comes after) and
whether the file's writer (engine/stats_file.py) was loaded."""

import json
import os
import sys

from te_offload_shim.engine import stats
from te_offload_shim.te.process_globals import GivenBack
from te_offload_shim.te.report import CacheReport

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "freed":
        stats.count_table("t", CacheReport(entries=1, bytes=8))
    elif what == "table":
        stats.count_table("t", CacheReport())
    elif what == "flush":
        stats.flush_seen()
    elif what == "failed":
        stats.clearing_failed("t", "why")
    elif what == "left-alone":
        stats.left_alone("t", "why")
    elif what == "net-failed":
        stats.net_failed()
    elif what == "undecided":
        stats.undecided(["Linear.weight"])
    elif what == "te-globals":
        stats.count_te_globals(GivenBack(entries=1, bytes=8))
    elif what == "audit":
        stats.count_audit({"before": 1})
    else:
        assert what == "nothing", what
    path = os.environ.get("TE_OFFLOAD_SHIM_STATS")
    existed = path is not None and os.path.exists(path)
    if what == "freed":
        stats.count_table("t", CacheReport())  # freed nothing: written at exit only
    print(json.dumps({"existed": existed, "writer loaded": "te_offload_shim.engine.stats_file" in sys.modules}))
