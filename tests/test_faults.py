"""Faults, bad input and concurrency: the shim never breaks the program it runs in.

Hooks that fail never fail the import; clearing that fails never stops the offload; the wrapped
function keeps its own behaviour and errors exactly; installing from many threads at once, or while
a target is being imported, leaves exactly one wrapper.
"""

from __future__ import annotations

from pathlib import Path

from conftest import run_py
from test_verl import BUILD, ENGINE, OFFLOAD

FAULTY_MODULE = '''
"""A module whose attributes defeat the patcher in every way we can think of."""
CONST = 42

class _NoSignature:
    @property
    def __signature__(self):
        raise RuntimeError("no signature for you")
    def __call__(self, models):
        return "called"

weird = _NoSignature()

def fine(models):
    return "fine"

def other(models):
    return "other"

class Engine:
    @property
    def model(self):
        raise RuntimeError("model property exploded")
    def offload(self):
        return "offloaded"
'''

HOOKS = """
import importlib, logging
import te_offload_shim
import faulty
from te_offload_shim.engine.patch import shim_layers
st = te_offload_shim.status()
rows = {r["name"]: r for r in st["targets"]}
def said(row):
    return row["state"] + (": " + row["detail"] if row["detail"] else "")
emit(imported=True, states={k: said(rows[k]) for k in rows if k.startswith("faulty")},
     hook_errors=st["hook_errors"], weird=faulty.weird("m"), fine_layers=shim_layers(faulty.fine),
     fine=faulty.fine("m"))
"""

TARGETS = (
    "faulty:missing,faulty:CONST,faulty:weird,faulty:fine,faulty:Engine.offload@self.model,faulty:Nope.method,"
    "faulty:other@modelz"
)


def _faulty(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "faulty.py").write_text(FAULTY_MODULE)
    return {"TE_OFFLOAD_SHIM_TARGETS": TARGETS}


def test_hooks_that_cannot_patch_never_fail_the_import(tmp_path: Path) -> None:
    env = _faulty(tmp_path)
    for strict in ("0", "1"):  # strict mode raises at call time, never inside an import
        r = run_py(HOOKS, env={**env, "TE_OFFLOAD_SHIM_STRICT": strict}, path=[tmp_path])
        assert r["imported"]
        assert r["states"]["faulty:missing"] == "absent"
        assert r["states"]["faulty:Nope.method"] == "absent"
        assert r["states"]["faulty:CONST"].startswith("error: CONST is a int")
        assert r["states"]["faulty:fine"] == "patched" and r["fine_layers"] == 1
        assert r["states"]["faulty:other"].startswith("error: models spec 'modelz' names no parameter of other")
        assert r["weird"] == "called", "an unpatchable attribute is left exactly as it was"
        # A target whose patching raises is an error state of its own, said once, never a hook error.
        assert r["states"]["faulty:weird"] == "error: RuntimeError: no signature for you"
        assert r["hook_errors"] == []
        assert r["_stderr"].count("faulty:weird is not patched (error: RuntimeError: no signature for you)") == 1
        assert r["_stderr"].count("is not patched") == 5, "weird, CONST, other, and the two absent user targets"
        assert r["fine"] == "fine"


def test_locating_models_that_raises_fails_open_and_raises_in_strict(tmp_path: Path) -> None:
    env = _faulty(tmp_path)
    code = """
import te_offload_shim, faulty
results = []
for _ in range(3):
    try:
        results.append(faulty.Engine().offload())
    except RuntimeError as exc:
        results.append("raised: " + str(exc))
emit(results=results, stats=te_offload_shim.stats())
"""
    r = run_py(code, env=env, path=[tmp_path])
    assert r["results"] == ["offloaded"] * 3
    assert r["_stderr"].count("model property exploded") == 1, "one warning, not one per call"
    assert r["stats"]["errors"] == 3
    strict = run_py(code, env={**env, "TE_OFFLOAD_SHIM_STRICT": "1"}, path=[tmp_path])
    assert strict["results"] == ["raised: model property exploded"] * 3


NOT_A_DICT = """
layers = w.linear_layers(model)
layers[0][1].__dict__["_fp8_workspaces"] = ["a list", "not a dict"]
layers[1][1].__dict__["_fp8_workspaces"] = ("a tuple",)
"""


def test_non_dict_workspaces_skipped_with_one_warning_and_weights_round_trip() -> None:
    code = f"import te_offload_shim\nCALLER = {ENGINE!r}\n" + BUILD.replace(
        "initial = w.cache_state", NOT_A_DICT + "initial = w.cache_state"
    )
    r = run_py(code + OFFLOAD, verl="0.8.0")
    assert r["offloaded"] and r["same"]
    assert r["after"] == {"entries": 0, "bytes": 0} and r["stats"]["entries"] == 7
    assert r["_stderr"].count("not a dict") == 1


BAD_INPUT = """
import torch
from harness import megatron_world as w, te_standins as te
w.apply_cpu_quirks()
import te_offload_shim
import verl.utils.megatron_utils as mu
wrapped = mu.offload_megatron_model_to_cpu
original = wrapped.__wrapped__

def plain():
    layer = te.TELinearStandIn(8, 8)
    te.fill_like_forward(layer)
    return torch.nn.Sequential(layer, torch.nn.ReLU())

def no_te():
    return torch.nn.Sequential(torch.nn.Linear(4, 4))

inputs = {
    "none": lambda: None,
    "empty list": lambda: [],
    "generator": lambda: (m for m in [plain()]),
    "single module": lambda: plain()[0],
    "an iterable module": plain,
    "single DDP": lambda: w.wrap_ddp(w.build_gpt(layers=1, hidden=16, vocab=32)),
    "no TE layers": lambda: [no_te()],
    "an int": lambda: 7,
}

def outcome(fn, value):
    try:
        return ["returned", repr(fn(value))]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]

out = {n: {"original": outcome(original, make()), "wrapped": outcome(wrapped, make())} for n, make in inputs.items()}
emit(out=out, stats=te_offload_shim.stats())
"""


def test_bad_input_behaves_exactly_as_the_original() -> None:
    r = run_py(BAD_INPUT, verl="0.8.0")
    for name, pair in r["out"].items():
        assert pair["wrapped"] == pair["original"], name
    assert r["out"]["none"]["original"][0] == "TypeError"
    assert r["out"]["single module"]["original"][0] == "TypeError"
    assert r["out"]["generator"]["original"] == ["returned", "None"]
    assert r["_stderr"].count("one-shot iterator") == 1
    assert r["stats"]["errors"] == 0, r["_stderr"][-2000:]


CONCURRENT = """
import importlib, sys, threading, time
import te_offload_shim
from te_offload_shim.engine.patch import shim_layers
te_offload_shim.uninstall()

# 8 threads call install() at once
barrier = threading.Barrier(8)
def go():
    barrier.wait()
    te_offload_shim.install()
threads = [threading.Thread(target=go) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
import race_0
eight = shim_layers(race_0.offload)

# a target imported on one thread while another installs, with the two racing in both orders
races = []
for i in range(1, N):
    te_offload_shim.uninstall()
    barrier = threading.Barrier(2)
    def importer():
        barrier.wait()
        time.sleep((i % 3) * 0.0005)
        importlib.import_module(f"race_{i}")
    def installer():
        barrier.wait()
        time.sleep(((i + 1) % 3) * 0.0005)
        te_offload_shim.install()
    pair = [threading.Thread(target=importer), threading.Thread(target=installer)]
    [t.start() for t in pair]
    [t.join() for t in pair]
    mod = sys.modules[f"race_{i}"]
    races.append([shim_layers(mod.offload), shim_layers(mod.alias_holder.offload)])
emit(eight=eight, races=races)
"""


def test_concurrent_install_and_import_leave_exactly_one_wrapper(tmp_path: Path) -> None:
    n = 40
    for i in range(n):
        (tmp_path / f"holder_{i}.py").write_text(f"from race_{i} import offload\n")
        (tmp_path / f"race_{i}.py").write_text(
            f"def offload(models):\n    return models\n\nimport holder_{i} as alias_holder\n"
        )
    targets = ",".join(f"race_{i}:offload" for i in range(n))
    r = run_py(
        CONCURRENT.replace("range(1, N)", f"range(1, {n})"),
        env={"TE_OFFLOAD_SHIM_TARGETS": targets},
        path=[tmp_path],
    )
    assert r["eight"] == 1
    assert r["races"] == [[1, 1]] * (n - 1)


def test_a_buffer_no_ddp_holds_is_searched_for_once(monkeypatch) -> None:
    """Megatron-FSDP or a user's own buffer: one gc scan, not one per offload."""
    from te_offload_shim.integrations import megatron as megatron_buffers

    scans = []
    monkeypatch.setattr(megatron_buffers, "_scan", lambda: scans.append(1))

    class Buffer:
        params = ()

    orphan = Buffer()
    assert megatron_buffers.modules_of_buffer(orphan) == (None, [])
    assert megatron_buffers.modules_of_buffer(orphan) == (None, [])
    assert len(scans) == 1
    assert megatron_buffers.modules_of_buffer(Buffer()) == (None, []) and len(scans) == 2


def test_disabling_a_framework_covers_its_variants(monkeypatch) -> None:
    from te_offload_shim import _switches as _config

    monkeypatch.setenv("TE_OFFLOAD_SHIM_DISABLE", "nemo-rl, areal")
    off = [
        n
        for n in ("nemo-rl", "nemo-rl-0.5", "nemo-rl-0.3", "areal", "areal-awex", "roll", "verl")
        if _config.is_disabled(n)
    ]
    assert off == ["nemo-rl", "nemo-rl-0.5", "nemo-rl-0.3", "areal", "areal-awex"]


def test_ray_tracing_keyword_does_not_stop_the_clearing() -> None:
    """Ray's tracing closure passes `_ray_trace_ctx` to actor methods; the original's signature has
    no such parameter, so binding must look past it."""
    import inspect

    import torch

    from harness import te_standins as te
    from te_offload_shim.engine.handler import make_handler
    from te_offload_shim.engine.registry import Record
    from te_offload_shim.integrations.targets import Target

    class Actor:
        def __init__(self) -> None:
            layer = te.TELinearStandIn(4, 4)
            te.fill_like_forward(layer)
            self.model = torch.nn.Sequential(layer)

        def sleep(self) -> str:
            return "slept"

    target = Target("tracing", __name__, "Actor.sleep", "self.model")
    record = Record("target", Actor, "sleep", Actor.sleep, target=target.name)
    handler = make_handler(target, inspect.signature(Actor.sleep), "method", record)
    actor = Actor()
    seen = []
    result = handler(lambda **kw: seen.append(kw) or "slept", actor, (), {"_ray_trace_ctx": {"t": 1}})
    assert result == "slept" and seen == [{"_ray_trace_ctx": {"t": 1}}], "the original still gets the keyword"
    assert actor.model[0]._fp8_workspaces == {}
