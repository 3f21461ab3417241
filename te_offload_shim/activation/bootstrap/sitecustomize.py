"""`te-offload-shim run` puts this folder first on PYTHONPATH, so every Python process started
below it (torchrun ranks, a Ray cluster started by `ray.init()`, multiprocessing spawn children)
imports this module at start-up: it activates the shim, then runs the sitecustomize it shadows.

This folder is all that `run` adds to any interpreter's path: an interpreter without the package
(another Python version, a system python) starts as it would without `run`, saying nothing.

Only one module named `sitecustomize` is ever imported, and Debian's Python (and many images)
ship one, so the one further down sys.path must still run, exactly as if we were not here.

Any Python that runs below `run` parses this file, Python 2.7 included (a tool's own interpreter,
an old system python): it must stay plain ASCII source in syntax both read, without annotations,
f-strings or other Python-3-only forms (tests/hostile/test_run_old_pythons.py).
"""

import os
import sys

_HERE = os.path.normcase(os.path.dirname(os.path.abspath(__file__)))


def _activate():
    if os.environ.get("TE_OFFLOAD_SHIM", "").strip().lower() in ("0", "false", "no", "off"):
        return
    try:
        __import__("te_offload_shim")  # importing installs it
    except Exception:
        # Never fall back to the copy this folder belongs to: its environment's site-packages
        # (wrapt, C extensions) were built for the interpreter that ran `run`, maybe not this one
        # (`te-offload-shim run -- python3.12 ...` from a 3.11 venv). Where the package is not
        # installed, this interpreter runs without the shim, silently, as it would without `run`;
        # nor may the shim ever stop an interpreter from starting.
        pass


def _chain():
    ours = sys.modules.pop("sitecustomize", None)
    # Our folder leaves sys.path (it holds nothing else); PYTHONPATH keeps it for the children.
    sys.path[:] = [p for p in sys.path if os.path.normcase(os.path.abspath(p or os.curdir)) != _HERE]
    try:
        import sitecustomize  # noqa: F401  (the next one; its errors reach site.py as usual)
    except ImportError as exc:
        # Python 2's ImportError has no `name`; its message says which module was missing
        missing = getattr(exc, "name", None) or str(exc).rpartition(" ")[2].strip("'")
        if missing != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_activate()
_chain()
