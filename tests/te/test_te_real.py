"""Transformer Engine's own code, release by release: the shim against TE's real classes and modules.

Each release in harness/te_releases.py is imported from its PyPI wheel (`.deps/te-X`) in one fresh
interpreter that runs harness/te_probe.py (only TE's compiled extension and its shared-library
loading are replaced: harness/te_import.py). The probe builds real objects from tensors of known
sizes and records what the shim counted and cleared; these tests assert on that record, one test id
per release and class / module, so CI shows each release's pass or skip (`-rs` gives the reasons).
The probes run once per test session in one process (one forked child per release), shared by the
xdist workers through a file lock (one worker, with `--dist loadgroup`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.set_up import needs

from harness import te_releases

REPO = Path(__file__).resolve().parents[2]
# Every test here waits for the one probe run: under `pytest -n 2 --dist loadgroup` (scripts/test.sh)
# they all go to one worker, so the other keeps running other tests instead of waiting on the lock.
pytestmark = pytest.mark.xdist_group("te-probe")
INSTALLED = [r for r in te_releases.RELEASES if te_releases.installed(r)]


def _probe(release: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The probe's record of `release`. The first call of a session probes every installed release
    in one process (shared imports once, one forked child per release: harness/te_probe.py main)."""
    from filelock import FileLock

    needs(te_releases.installed(release), f"TE {release} not in {te_releases.folder(release)}")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one run's workers share it
    path = shared / f"te-probe-{release}.json"
    with FileLock(str(shared / "te-probe.lock")):
        if not path.is_file():
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_OFFLOAD_SHIM", "NVTE_"))}
            env["PYTHONPATH"] = str(REPO)
            proc = subprocess.run(
                [sys.executable, "-W", "ignore", "-m", "harness.te_probe", *INSTALLED],
                capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
            )  # fmt: skip
            for line in proc.stdout.splitlines():
                if line.startswith("RESULT "):
                    record = json.loads(line[len("RESULT ") :])
                    (shared / f"te-probe-{record['release']}.json").write_text(json.dumps(record))
            assert path.is_file(), f"no record of TE {release} ({proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(path.read_text())
    assert "fatal" not in result, f"TE {release} did not import:\n{result['fatal']}"
    return result


def _value_cases() -> list[Any]:
    return [
        pytest.param(release, name, id=f"{release}-{name}")
        for release in te_releases.RELEASES
        for name in te_releases.BOUNDARIES[release]["classes"]
    ]


def _module_cases() -> list[Any]:
    return [
        pytest.param(release, name, id=f"{release}-{name}")
        for release in te_releases.RELEASES
        for name in te_releases.MODULES
    ]


@pytest.mark.parametrize("release", te_releases.RELEASES)
def test_release_matches_its_recorded_boundaries(release: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """te_releases.BOUNDARIES (which docs/te-releases.md's table is generated from) says what the real
    release has: value classes, the method that fills the cache, the keys each module caches under."""
    result = _probe(release, tmp_path_factory)
    data = te_releases.BOUNDARIES[release]
    assert sorted(result["values"]) == sorted(data["classes"])
    assert result["workspace_methods"] == [data["workspace_method"]]
    keys = {name: record.get("keys") for name, record in result["modules"].items() if not record.get("absent")}
    assert keys == data["keys"]
    assert (result["init_skipped"] is None) == (te_releases.key(release) >= (2, 0)), result["init_skipped"]


@pytest.mark.parametrize(("release", "name"), _value_cases())
def test_real_value_bytes_are_counted_exactly_and_cleared(
    release: str, name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A real object of the class, built by TE's own constructor from tensors made by the probe:
    `scan` and `clear_fp8_workspaces` count exactly those tensors' bytes, and the entry is gone."""
    record = _probe(release, tmp_path_factory)["values"][name]
    if "error" in record:
        reason = te_releases.NOT_BUILDABLE.get(name, {}).get(release)
        if reason and reason in record["error"]:
            pytest.skip(f"TE {release} {name} cannot be built on CPU: {record['error']}")
        pytest.fail(f"TE {release} {name} could not be built: {record['error']}\n{record.get('trace', '')}")
    assert record["expected"] > 0 and record["tensors"] >= 1
    assert (record["scan"], record["cleared"]) == (record["expected"], record["expected"]), record
    assert (record["entries"], record["left"], record["errors"]) == (1, 0, [])


@pytest.mark.parametrize("family", sorted(te_releases.FIELDS))
def test_standin_field_names_are_the_real_classes(family: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """harness/te_standins.py builds its values with te_releases.FIELDS: every real class of that
    family (tensor, base, storage) in every release holds its bytes in exactly those fields."""
    checked = 0
    for release in INSTALLED:
        for name, record in _probe(release, tmp_path_factory)["values"].items():
            if name.startswith(family) and name[len(family) :] in ("", "Base", "Storage") and "fields" in record:
                assert record["fields"] == sorted(te_releases.FIELDS[family]), (release, name)
                checked += 1
    assert checked >= 4 or len(INSTALLED) < len(te_releases.RELEASES)


@pytest.mark.parametrize(("release", "name"), _module_cases())
def test_real_module_is_built_on_cpu_or_skipped_with_the_reason(
    release: str, name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """TE's own Linear / LayerNormLinear / LayerNormMLP / GroupedLinear: built on CPU where the
    constructor allows it, its cache filled under the keys its source uses, cleared by the shim.
    Where it refuses (it asks the GPU), the release is one the twin runs: there the module is built,
    trained and cleared (tests/twin/test_twin_caches.py), so nothing is left unrun."""
    record = _probe(release, tmp_path_factory)["modules"][name]
    if record.get("absent"):
        pytest.skip(f"TE {release} has no {name}")
    if "error" in record:
        from harness.te_twin.cells import TWIN_RELEASES

        # Where TE's constructor refuses a CPU-only torch, the twin (which answers as a GPU) builds
        # the module and runs what this test checks: tests/twin/test_twin_caches.py, every release
        if release not in TWIN_RELEASES:
            pytest.skip(f"TE {release} {name} constructor refuses on CPU: {record['error']} (not twinned)")
        return
    assert record["workspaces_dict"], "a TE >= 1.8 module keeps a plain dict"
    assert record["cleared_entries"] == record["filled"] > 0 and record["left"] == 0
    assert record["cleared_bytes"] == record["expected_bytes"]


@pytest.mark.parametrize("release", te_releases.RELEASES)
def test_fp8_primary_weight_copies_are_reported(release: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A real quantized tensor as a parameter (`fp8_model_init`): no workspace, but its transpose /
    columnwise copy survives an offload; the report names it and counts exactly its bytes."""
    records = _probe(release, tmp_path_factory)["primary_weights"]
    built = {name: r for name, r in records.items() if "error" not in r}
    if not built:
        pytest.skip(f"TE {release}: no quantized parameter buildable on CPU: {records}")
    from te_offload_shim.te.primary import TRANSPOSE_REBUILT_FROM

    for name, record in built.items():
        assert record["expected"] > 0 and record["reported"] == record["expected"], (name, record)
        assert record["params"] == 1 and record["entries"] == 0 and name in record["where"][0]
        clear = record["clear"]
        assert clear["data_kept"] and not clear["errors"], (name, clear)
        if name == "Float8Tensor" and te_releases.key(release) >= TRANSPOSE_REBUILT_FROM:
            # its transpose goes, through TE's own function for it (clear_columnwise_cache from 2.16,
            # TE #2805; Float8Tensor.remove_caches before); the data stays
            assert (clear["cleared"], clear["left"], clear["copies_kept"]) == (record["expected"], 0, []), clear
            api = "clear_columnwise_cache" if te_releases.key(release) >= (2, 16) else "remove_caches"
            assert clear["dropped_by"] == api, clear
        else:  # MXFP8 / blockwise / NVFP4 columnwise data is never dropped, nor a transpose TE does not rebuild
            assert (clear["cleared"], clear["left"]) == (0, record["expected"]) and clear["copies_kept"], clear
            assert clear["dropped_by"] is None, clear


@pytest.mark.parametrize("release", te_releases.RELEASES)
def test_fp8_weight_transpose_is_rebuilt_by_every_module_from_the_release_the_shim_drops_it(
    release: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The shim drops a Float8Tensor primary weight's transpose only from te_caches.TRANSPOSE_REBUILT_FROM
    (2.4): from there, each of TE's modules calls `update_usage(columnwise_usage=True)` on its FP8
    weight in backward, which recreates a missing transpose; before, none does."""
    from te_offload_shim.te.primary import TRANSPOSE_REBUILT_FROM

    result = _probe(release, tmp_path_factory)
    calls = result["rebuild_calls"]
    if te_releases.key(release) >= TRANSPOSE_REBUILT_FROM:
        assert all(n > 0 for n in calls.values()), calls
    elif te_releases.key(release) >= (2, 0):
        assert not any(calls.values()), calls
    assert result["te_version"].startswith(te_releases.PIP[release])


@pytest.mark.parametrize("release", te_releases.RELEASES)
def test_graph_marks_of_the_real_graph_module_stop_clearing(
    release: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Scenario 12 again, with TE's graph module really imported: the functions make_graphed_callables
    leaves on a module (names recorded per release) keep the shim away from that chunk."""
    graph = _probe(release, tmp_path_factory)["graph"]
    data = te_releases.BOUNDARIES[release]["graph_marks"]
    assert graph["plain"]["marks"] == data["plain"] and graph["order"]["marks"] == data["order"]
    for case in ("plain", "order"):
        if graph[case]["marks"]:
            assert (graph[case]["cleared"], graph[case]["left"]) == (0, 1), graph[case]
            assert "make_graphed_callables" in graph[case]["reason"]
        else:  # nothing left on the module (2.8+ with _order): megatron's cuda_graphs list is the mark
            assert graph[case]["cleared"] == 1


def test_docs_table_of_te_releases_is_the_generated_one() -> None:
    page = (REPO / "docs" / "te-releases.md").read_text()
    assert te_releases.markdown() in page, "regenerate it: .venv/bin/python -m harness.te_releases"


def test_setup_script_fetches_every_release_the_tests_name() -> None:
    script = (REPO / "scripts" / "setup-env.sh").read_text()
    specs = {f"{r}={p}" if r != p else r for r, p in te_releases.PIP.items()}
    words = set(script.replace(";", " ").split())
    assert specs <= words, sorted(specs - words)
