"""The third-party distributions the demo imports: what scripts/setup-demo.sh installs.

Runs demo/demo.py's three cases (1 layer, hidden 16), each in a fresh interpreter of this
environment, maps every module they imported to the distribution whose RECORD lists its file, and
prints `name==version  where` (the venv, or a .deps folder). With `--check`, exits 1 when the
venv's set differs from demo/requirements.txt plus torch, or a .deps one from the pins of
scripts/setup-demo.sh. Run it in the full environment (scripts/setup-env.sh), which holds more than
the demo imports, after a change of the demo's code or of a pinned release:

    .venv/bin/python scripts/demo-imports.py [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".deps"
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
# a case's interpreter: demo.py as __main__, its module files written out at exit
_RUN = """
import atexit, json, runpy, sys
def dump(path=sys.argv.pop(1)):
    with open(path, "w") as f:
        json.dump([getattr(m, "__file__", None) for m in list(sys.modules.values())], f)
atexit.register(dump)
sys.argv[0] = {demo!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_files(verl: str) -> set[str]:
    demo = str(REPO / "demo" / "demo.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(DEPS / f"verl-{verl}")]))
    env.pop("TE_OFFLOAD_SHIM", None)  # as demo.py runs its cases: the shim on, but "without"
    files: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for case in ("without", "with", "net"):
            out = Path(tmp) / f"{case}.json"
            cmd = [sys.executable, "-c", _RUN.format(demo=demo), str(out), "--case", case]
            cmd += ["--layers", "1", "--hidden", "16", "--verl", verl]
            case_env = dict(env, TE_OFFLOAD_SHIM="0") if case == "without" else env
            subprocess.run(cmd, env=case_env, check=True, stdout=subprocess.DEVNULL)
            files |= {os.path.realpath(f) for f in json.loads(out.read_text()) if f}
    return files


def owners() -> dict[str, tuple[str, str]]:
    """Every file of every distribution in the venv and the .deps folders -> (name==version, where)."""
    folders = [SITE, *sorted(p for p in DEPS.iterdir() if p.is_dir())] if DEPS.is_dir() else [SITE]
    found: dict[str, tuple[str, str]] = {}
    for folder in folders:
        where = "venv" if folder == SITE else f".deps/{folder.name}"
        for dist in metadata.distributions(path=[str(folder)]):
            spec = f"{norm(dist.metadata['Name'])}=={dist.version}"
            for file in dist.files or []:
                found.setdefault(os.path.realpath(str(dist.locate_file(file))), (spec, where))
    return found


def pins(text: str) -> set[str]:
    return {norm(n) + "==" + v for n, v in re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*)==([\w.+]+)", text)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the pins differ from what is imported")
    parser.add_argument("--verl", default="0.8.0", help="the verl release the demo runs (default 0.8.0)")
    args = parser.parse_args()
    owner = owners()
    used = {owner[f] for f in imported_files(args.verl) if f in owner}
    used = {(spec, where) for spec, where in used if not spec.startswith("te-offload-shim==")}  # the repository's
    for spec, where in sorted(used):
        print(f"{spec:40} {where}")
    if not args.check:
        return 0
    venv = {spec.split("+")[0] for spec, where in used if where == "venv"}  # torch 2.13.0+cpu -> torch==2.13.0
    deps = {spec for spec, where in used if where != "venv"}
    wanted_venv = pins((REPO / "demo" / "requirements.txt").read_text()) | {"torch==2.13.0"}
    wanted_deps = pins((REPO / "scripts" / "setup-demo.sh").read_text()) - {"uv==0.13.9", "torch==2.13.0"}
    differ = False
    for label, have, want in (("venv", venv, wanted_venv), (".deps", deps, wanted_deps)):
        for spec in sorted(have - want):
            print(f"demo-imports: imported, not pinned ({label}): {spec}", file=sys.stderr)
        for spec in sorted(want - have):
            print(f"demo-imports: pinned, not imported ({label}): {spec}", file=sys.stderr)
        differ |= have != want
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
