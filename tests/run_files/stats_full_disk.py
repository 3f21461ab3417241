"""The stats file written on a full disk (tests/engine/test_stats_file.py), run inside a mount
namespace whose FOLDER is a tiny tmpfs.

`python stats_full_disk.py FOLDER`: fills FOLDER until the file system has no space left, writes the
stats file there twice (each write fails), frees the space and writes once more. Prints
`{"full": [...], "said": [...], "after": [...]}`: what FOLDER held after the failing writes, the
shim's log lines, what FOLDER held after the last write."""

import errno
import json
import logging
import os
import sys

if __name__ == "__main__":
    folder = sys.argv[1]
    filler = os.path.join(folder, "filler")
    with open(filler, "wb", buffering=0) as file:  # unbuffered: each write reaches the file system
        try:
            while True:
                file.write(b"\0" * 1024)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logging.getLogger("te_offload_shim").addHandler(Keep())
    os.environ["TE_OFFLOAD_SHIM_STATS"] = os.path.join(folder, "stats.json")
    from te_offload_shim.engine import stats, stats_file

    stats_file.write(stats.counts)
    stats_file.write(stats.counts)
    full = sorted(os.listdir(folder))
    os.remove(filler)
    stats_file.write(stats.counts)
    print(json.dumps({"full": full, "said": said, "after": sorted(os.listdir(folder))}))
