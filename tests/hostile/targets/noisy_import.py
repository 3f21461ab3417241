"""A target module whose import writes below Python's sys.stdout, as C extensions and the tools they
run do (tests/hostile/test_status_json.py): to file descriptor 1 itself, through C's buffered
printf, and from a subprocess that inherits the descriptor."""

import ctypes
import os
import subprocess
import sys

os.write(1, b"noisy_import: written to file descriptor 1\n")
ctypes.CDLL(None).printf(b"noisy_import: printf from C\n")  # buffered by C's stdio until it flushes
subprocess.run([sys.executable, "-c", "print('noisy_import: from a subprocess')"], check=True)
print("noisy_import: print")


def offload(models):  # type: ignore[no-untyped-def]
    return models
