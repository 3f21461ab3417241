"""The post-import hook's state across fork, reload and interrupts, and `status` telling the truth.

- A fork waits for a post-import callback running on another thread: the child has that target
  patched, and patches what its own threads import.
- `importlib.reload(te_offload_shim)` (IPython's autoreload, plugin reloaders) leaves a working
  shim, and `status` says what is really there.
- A callback that fails never fails the import: its row says `error` with the reason.
- A user target is named as an `import` statement names it (NFKC, as Python normalises identifiers).
- A status row never says `patched` while the attribute holds no live wrapper of ours.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_util import cached_layer, child_exit_status, write_module


def _row(name: str) -> dict[str, Any]:
    import te_offload_shim as shim

    rows = [dict(r) for r in shim.status()["targets"] if r["name"] == name or r["target"] == name]
    assert len(rows) == 1, (name, shim.status()["targets"])
    return rows[0]


HELD_TARGET = """\
import fork_events

class _Held:
    # An offload function object whose `__wrapped__` is read by the patcher: the first read (in the
    # parent's post-import callback) holds that callback until the test lets it go.
    def __call__(self, models):
        return "offloaded"

    @property
    def __wrapped__(self):
        if not fork_events.HELD:
            fork_events.HELD.append(1)
            fork_events.ENTERED.set()
            fork_events.RELEASE.wait(30)
            fork_events.RELEASED_AT.append(fork_events.time.monotonic())
        raise AttributeError("__wrapped__")

offload = _Held()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "fork_warm:offload,fork_held:offload,fork_after:offload"})
def test_a_fork_waits_for_a_callback_running_on_another_thread_and_the_child_patches_its_imports(
    tmp_path: Path,
) -> None:
    """A fork never copies a callback half done: it waits for the one running on another thread, so
    the child has that target patched, and patches what its own threads import."""
    import importlib
    import threading
    import time
    import warnings

    import te_offload_shim  # noqa: F401  (installs the shim)
    from te_offload_shim.engine.patch import shim_layers

    plain = "def offload(models):\n    return 'offloaded'\n"
    write_module(
        tmp_path,
        "fork_events",
        "import threading, time\nHELD, RELEASED_AT = [], []\nENTERED, RELEASE = threading.Event(), threading.Event()\n",
    )
    write_module(tmp_path, "fork_warm", plain)
    write_module(tmp_path, "fork_held", HELD_TARGET)
    write_module(tmp_path, "fork_after", plain)
    import fork_events  # type: ignore[import-not-found]
    import fork_warm  # type: ignore[import-not-found]  # noqa: F401  (the patcher and wrapt are loaded)

    layer = cached_layer()
    holder = threading.Thread(target=importlib.import_module, args=("fork_held",))
    holder.start()
    assert fork_events.ENTERED.wait(20), "the callback for fork_held is running on the other thread"
    threading.Timer(1.0, fork_events.RELEASE.set).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() with threads running
        pid = os.fork()
    forked_at = time.monotonic()
    if pid == 0:  # the child: the held target is patched; its first new thread imports a target
        try:
            outcome: list[object] = [shim_layers(sys.modules["fork_held"].offload) == 1]

            def first_thread() -> None:
                after = importlib.import_module("fork_after")
                after.offload([layer])  # no other import in between
                outcome.append(layer._fp8_workspaces == {})

            thread = threading.Thread(target=first_thread)
            thread.start()
            thread.join(20)
            os._exit(0 if outcome == [True, True] else 3 if outcome[:1] != [True] else 4)
        except BaseException:
            os._exit(6)
    try:
        status = child_exit_status(pid, 30)
    finally:
        fork_events.RELEASE.set()
        holder.join(20)
    assert fork_events.RELEASED_AT and fork_events.RELEASED_AT[0] <= forked_at, "the fork did not wait"
    assert status != 3, "the callback in flight at the fork was not done in the child"
    assert status != 4, "the child's first thread imported a target and it was not patched"
    assert status == 0, f"the forked child {'hung' if status is None else f'exited {status}'}"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "reloaded_target:offload"})
def test_the_package_survives_its_own_reload(tmp_path: Path) -> None:
    import importlib

    import te_offload_shim as shim

    write_module(tmp_path, "reloaded_target", "def offload(models):\n    return 'offloaded'\n")
    import reloaded_target  # type: ignore[import-not-found]

    assert _row("reloaded_target:offload")["layers"] == 1
    importlib.reload(shim)  # IPython's %autoreload, a plugin reloader
    layer = cached_layer()
    reloaded_target.offload([layer])
    assert layer._fp8_workspaces == {}, "still patched after the package's reload"
    assert shim.uninstall() == 1
    assert shim.install()
    importlib.reload(reloaded_target)
    row = _row("reloaded_target:offload")
    assert (row["state"], row["layers"]) == ("patched", 1), row
    layer = cached_layer()
    assert reloaded_target.offload([layer]) == "offloaded"
    assert layer._fp8_workspaces == {}, "the reloaded target is patched"
    assert sum(1 for f in sys.meta_path if type(f).__name__ == "ImportHook") == 1, sys.meta_path


class _Interrupting:
    """A meta path finder that, while armed, makes every import of a module of the shim not loaded
    yet raise TimeoutError: a callback that fails (a broken install, a bug)."""

    def __init__(self) -> None:
        self.armed = False
        self.hits = 0

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if self.armed and fullname.startswith("te_offload_shim.") and fullname not in sys.modules:
            self.hits += 1
            raise TimeoutError("step timed out")


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "interrupted_target:offload"})
def test_a_callback_that_fails_is_said_and_the_import_succeeds(tmp_path: Path) -> None:
    """The import goes on, the row says `error` with the reason, `hook_errors` lists it; the callback
    is not run again for that module object (it would fail again), but a reload runs it afresh."""
    import importlib

    import te_offload_shim as shim

    write_module(tmp_path, "interrupted_target", "def offload(models):\n    return 'offloaded'\n")
    write_module(tmp_path, "unrelated_module", "")
    layer = cached_layer()
    shim.status()  # the reports are loaded; the patcher is not, yet
    alarm = _Interrupting()
    sys.meta_path.insert(0, alarm)  # ours moves back in front of it; the path finder stays behind it

    alarm.armed = True
    import interrupted_target  # type: ignore[import-not-found]  # the import itself completes

    assert alarm.hits >= 1, "the callback failed"
    alarm.armed = False
    importlib.import_module("unrelated_module")  # not run again at the next import
    row = _row("interrupted_target:offload")
    assert row["state"] == "error" and "TimeoutError" in row["detail"], row
    assert [e for e in shim.status()["hook_errors"] if e.startswith("interrupted_target: TimeoutError")], shim.status()
    assert interrupted_target.offload([layer]) == "offloaded" and layer._fp8_workspaces, "unpatched, as said"

    importlib.reload(interrupted_target)  # a new run of the module's body: its callbacks run again
    row = _row("interrupted_target:offload")
    assert (row["state"], row["layers"]) == ("patched", 1), row
    assert interrupted_target.offload([layer]) == "offloaded"
    assert layer._fp8_workspaces == {}


def _fullwidth(text: str) -> str:
    """`text` in fullwidth letters (U+FF01..): what a name copied from a CJK document may hold."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" and c != ":" else c for c in text)


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": _fullwidth("nfkc_target:offload")})
def test_a_user_target_is_named_as_an_import_statement_names_it(tmp_path: Path) -> None:
    import unicodedata

    import te_offload_shim as shim

    named = os.environ["TE_OFFLOAD_SHIM_TARGETS"]
    assert named != "nfkc_target:offload" and unicodedata.normalize("NFKC", named) == "nfkc_target:offload"
    assert shim.status()["user_target_problems"] == []
    write_module(tmp_path, "nfkc_target", "def offload(models):\n    return 'offloaded'\n")
    # `import` followed by that fullwidth name imports this very module: Python reads identifiers as NFKC.
    import nfkc_target  # type: ignore[import-not-found]

    row = _row("nfkc_target:offload")
    assert (row["state"], row["layers"]) == ("patched", 1), row
    layer = cached_layer()
    nfkc_target.offload([layer])
    assert layer._fp8_workspaces == {}
    os.environ["TE_OFFLOAD_SHIM_DISABLE"] = _fullwidth("nfkc_target:offload")  # named the same way
    layer = cached_layer()
    nfkc_target.offload([layer])
    assert layer._fp8_workspaces, "switched off by its fullwidth name"


@pytest.mark.subprocess(env={"TE_OFFLOAD_SHIM_TARGETS": "walked:offload,walked:missing,walked:NOT_CALLABLE"})
def test_status_walks_every_state_of_a_target_truthfully(tmp_path: Path) -> None:
    import functools
    import importlib

    import te_offload_shim as shim

    write_module(tmp_path, "walked", "NOT_CALLABLE = 3\n\ndef offload(models):\n    return 'offloaded'\n")

    def state() -> tuple[str, int, bool]:
        row = _row("walked:offload")
        return row["state"], row["layers"], row["imported"]

    def clears() -> bool:
        layer = cached_layer()
        walked.offload([layer])
        return layer._fp8_workspaces == {}

    assert state() == ("pending", 0, False)
    import walked  # type: ignore[import-not-found]

    assert state() == ("patched", 1, True) and clears()
    assert _row("walked:missing")["state"] == "absent"
    assert _row("walked:NOT_CALLABLE")["state"] == "error"

    ours = walked.offload
    walked.offload = ours.__wrapped__  # someone put the original back (a test's monkeypatch undone, a reload unseen)
    row = _row("walked:offload")
    assert (row["state"], row["layers"]) == ("error", 0) and "wrapper" in row["detail"], row
    assert not clears()

    importlib.reload(walked)
    assert state() == ("patched", 1, True) and clears()

    os.environ["TE_OFFLOAD_SHIM_DISABLE"] = "walked:offload"  # at run time: the next offload is left alone
    assert state() == ("disabled", 1, True) and not clears()
    del os.environ["TE_OFFLOAD_SHIM_DISABLE"]
    assert state() == ("patched", 1, True) and clears()

    profiled = functools.wraps(walked.offload)(lambda models: ours_now(models))
    ours_now = walked.offload
    walked.offload = profiled  # a profiler wrapped ours: ours is still in the chain, and armed
    assert state() == ("patched", 1, True) and clears()
    walked.offload = ours_now

    assert shim.uninstall() == 1
    assert state() == ("not installed", 0, True) and not clears()
    assert shim.install()
    assert state() == ("patched", 1, True) and clears()
