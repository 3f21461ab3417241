"""`sitecustomize` of the interpreters a test starts under mutmut (scripts/mutation.sh copies this file
to mutants/sitecustomize.py, which their PYTHONPATH holds): in mutmut's run that learns which tests
reach which function, each function of the mutated modules this interpreter reaches is appended,
when first reached, to the file the suite names (support/mutation.py says why). Appended at once,
not at exit: a forked child ends with `os._exit`. Outside that run, or without mutmut, it does nothing.
"""

import os


class _Appended(set):
    """mutmut's record of the functions reached (`mutmut.state`'s `_stats`), each new one also appended to `path`."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def add(self, name: str) -> None:
        if name in self:
            return
        super().add(name)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{name}\n".encode())
        finally:
            os.close(fd)


def _record() -> None:
    path = os.environ.get("TEST_MUTMUT_HITS")
    if path is None or os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    try:
        from mutmut.configuration import config
        from mutmut.state import state
    except ImportError:  # an interpreter without mutmut: it cannot import the mutated modules either
        return
    state()._stats = _Appended(path)
    # mutmut reads its configuration from the working directory at the first function reached; an
    # interpreter started elsewhere (a test's temporary directory) would fail there: read it now,
    # from mutmut's copy of the repository, where this file is.
    cwd = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    try:
        config()
    finally:
        os.chdir(cwd)


_record()
