"""scripts/discover.py over the real siiRL and Trinity-RFT wheels (scripts/setup-env.sh).

What it reports there (`--json`, every candidate), and that the spec it proposes for siiRL's
offload functions, declared as a user's own targets with the built-in siiRL entries switched off,
clears the caches of a real siiRL 0.2.0 offload as the entries do. Each test runs in a fresh
interpreter (discover must import nothing; the second one installs the shim).
"""

from __future__ import annotations

import json

import pytest
from conftest import DEPS
from support.discover_script import def_line
from support.set_up import needs

FOLDERS = {
    name: (DEPS / name).resolve()  # discover reports resolved paths (.deps may hold links)
    for name in ("siirl-0.2.0", "siirl-0.1.0.post1", "trinity-rft-0.6.0", "trinity-rft-0.5.2")
}
OFFLOAD = "siirl.utils.megatron.megatron_utils:offload_megatron_model_to_cpu"
REWARD = "reward_model.megatron.reward_model:MegatronRewardModel.offload_params_to_cpu"


def _installed() -> list[str]:
    for folder in FOLDERS.values():
        needs(folder, f"{folder} not installed")
    return [str(f) for f in FOLDERS.values()]


def _discover(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    from support.discover_script import main

    assert main("--json", *args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.subprocess(timeout=120)
def test_discover_over_siirl_and_trinity_finds_siirl_and_covers_everything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys

    folders = _installed()
    before = set(sys.modules)
    rows = _discover(capsys, *folders)
    imported = {m.split(".")[0] for m in set(sys.modules) - before}
    assert not imported & {"siirl", "trinity", "verl", "torch", "megatron"}, imported

    def found(folder: str, target: str) -> dict:
        hits = [r for r in rows if r["target"] == target and r["file"].startswith(str(FOLDERS[folder]) + "/")]
        assert len(hits) == 1, (folder, target, rows)
        return hits[0]

    for folder, workers, reward_entry in (
        ("siirl-0.2.0", "siirl.engine", "siirl-reward"),
        ("siirl-0.1.0.post1", "siirl.workers", "siirl-reward-0.1"),
    ):
        offload = found(folder, OFFLOAD)
        file = FOLDERS[folder] / "siirl" / "utils" / "megatron" / "megatron_utils.py"
        line = def_line(file, "offload_megatron_model_to_cpu", indented=True)
        assert (offload["file"], offload["line"]) == (str(file), line)
        assert "storage().resize_(0)" in offload["reason"] and "param.data = ...cpu" in offload["reason"]
        assert offload["covered_by"] == "siirl" and offload["spec"] == f"{OFFLOAD}@models"
        reward = found(folder, f"{workers}.{REWARD}")
        assert reward["covered_by"] == reward_entry
        assert reward["spec"] == f"{workers}.{REWARD}@self.reward_model_module"
        # the reward model's compute_reward offloads through it: covered by name, as the workers' calls
        assert found(folder, f"{workers}.reward_model.megatron.reward_model:MegatronRewardModel.compute_reward")[
            "covered_by"
        ] == ("calls offload_params_to_cpu (a table name)")

    trinity = [r for r in rows if r["target"].startswith("trinity.")]
    modules = {r["target"].partition(":")[0] for r in trinity}
    assert modules == {"trinity.trainer.verl_legacy.megatron_workers", "trinity.trainer.verl.megatron_workers"}
    assert {r["covered_by"] for r in trinity} == {"calls offload_megatron_model_to_cpu (a table name)"}, (
        "Trinity-RFT has no offload of its own: every candidate calls verl's"
    )
    assert [r["target"] for r in rows if not r["covered"]] == []


@pytest.mark.subprocess(timeout=240)
def test_the_spec_discover_proposes_for_siirl_clears_real_siirl(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `spec` discover gives (the value its last line would print were siiRL not in the table),
    pasted into TE_OFFLOAD_SHIM_TARGETS with the built-in siirl entries switched off."""
    import importlib

    from support.siirl_case import build, offload_through_the_workers, on_path

    import te_offload_shim as shim

    rows = _discover(capsys, str(FOLDERS["siirl-0.2.0"]))
    specs = [r["spec"] for r in rows if r["covered_by"] in ("siirl", "siirl-reward")]
    assert len(specs) == 2
    # read when the shim installs: installed again with them, as the next run would start
    monkeypatch.setenv("TE_OFFLOAD_SHIM_TARGETS", ",".join(specs))
    monkeypatch.setenv("TE_OFFLOAD_SHIM_DISABLE", "siirl")  # siirl, siirl-reward, siirl-reward-0.1
    shim.uninstall()
    assert shim.install()

    on_path("0.2.0")
    workers = importlib.import_module("siirl.engine.megatron_workers")
    world = build()
    r = offload_through_the_workers(world, workers)
    assert r["flushes"] == [0] and r["after"]["entries"] == 0
    assert r["reward_flushes"] == [0] and r["reward_after"]["entries"] == 0
    assert r["same"] and r["offloaded"]
    paths = [spec.partition("@")[0] for spec in specs]
    assert sorted(shim.stats()["by_target"]) == sorted(paths), "cleared by the user's targets, not the table's"
    state = {t["name"]: t["state"] for t in shim.status()["targets"]}
    assert state["siirl"] == state["siirl-reward"] == "disabled"
    assert all(state[p] == "patched" for p in paths)
    assert shim.status()["user_target_problems"] == []
