#!/usr/bin/env bash
# Other projects' own test suites, run twice in a venv of their own: without the shim, and with its
# `.pth` active (every interpreter of the venv imports te_offload_shim at start, the import hook on
# sys.meta_path). Every test id must end the same way with the same message: the `.pth` changes
# nothing anyone else can see. wrapt 2.5.2's `tests/core` (its own post-import hooks and their
# import-deadlock tests among them) and the import-heavy files of pytest 9.2.0's `testing/`.
# Not part of CI (it downloads two sdists); docs/testing.md gives its last result.
#   scripts/peer-suites.sh [WORKDIR]        (default: a new temporary folder)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"
cd "$WORK"

run_pair() {  # NAME SDIST-SPEC PIP-PACKAGES TEST-ARGS...
  local name=$1 spec=$2 packages=$3; shift 3
  "$PY" -m pip download -q --no-deps --no-binary :all: "$spec" -d sdists
  local sdist; sdist=$(ls sdists/"${spec%%==*}"-"${spec##*==}".tar.gz)
  tar xzf "$sdist"
  local src=${sdist#sdists/}; src=${src%.tar.gz}
  "$PY" -m venv "venv-$name"
  # shellcheck disable=SC2086
  "venv-$name/bin/pip" install -q $packages
  local site; site=$("venv-$name/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$REPO" > "$site/checkout.pth"  # the package importable, as an editable install makes it
  (cd "$src" && "../venv-$name/bin/python" -m pytest -q -p no:cacheprovider "$@" --junitxml="$WORK/$name-without.xml" | tail -1) || true
  "venv-$name/bin/python" -c "import sys; sys.path.insert(0, '$REPO'); from te_offload_shim.activation import pth; pth.enable('$site')"
  "venv-$name/bin/python" -c "import sys; assert 'te_offload_shim' in sys.modules, 'the .pth did not run'"
  (cd "$src" && "../venv-$name/bin/python" -m pytest -q -p no:cacheprovider "$@" --junitxml="$WORK/$name-with.xml" | tail -1) || true
  "$PY" - "$WORK/$name-without.xml" "$WORK/$name-with.xml" "$name" <<'PY'
import re
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    found = {}
    for case in ET.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, child.get("message") or ""
        # a temporary folder's serial number is no outcome
        found[f"{case.get('classname')}::{case.get('name')}"] = (outcome, re.sub(r"pytest-\d+", "pytest-N", message))
    return found


without, with_pth, name = outcomes(sys.argv[1]), outcomes(sys.argv[2]), sys.argv[3]
differ = sorted(k for k in without.keys() | with_pth.keys() if without.get(k) != with_pth.get(k))
for key in differ:
    print(f"  {key}: without {without.get(key)}, with the .pth {with_pth.get(key)}")
print(f"peer-suites: {name}: {len(without)} test ids, {len(differ)} ending otherwise with the .pth")
sys.exit(1 if differ or not without else 0)
PY
}

status=0
run_pair wrapt wrapt==2.5.2 "wrapt==2.5.2 pytest" tests/core || status=1
run_pair pytest pytest==9.2.0 "pytest==9.2.0 hypothesis attrs xmlschema" testing/test_assertrewrite.py \
  testing/test_pathlib.py testing/test_collection.py testing/test_conftest.py testing/test_python_path.py \
  testing/python/collect.py || status=1
exit $status
