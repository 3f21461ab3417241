"""`python -S unpickle_bare.py BLOB`: unpickle BLOB in an interpreter that has neither te_offload_shim
nor wrapt (tests/hostile/test_wrapper_transparency.py), call the result on [1] and print what it returns."""

from __future__ import annotations

import pickle
import sys


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        obj = pickle.loads(f.read())
    assert "te_offload_shim" not in sys.modules and "wrapt" not in sys.modules
    print(obj([1]))


if __name__ == "__main__":
    main()
