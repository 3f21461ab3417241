#!/usr/bin/env bash
# Mutation testing with mutmut (docs/testing.md#mutation-testing); not part of CI.
#   scripts/mutation.sh [FILE...]   e.g. scripts/mutation.sh te_offload_shim/_hook.py
# Mutates the files named (default: every file of pyproject.toml's [tool.mutmut] only_mutate), runs
# for each mutant the tests of its `pytest_add_cli_args_test_selection` that reach the mutated
# function (children of `@pytest.mark.subprocess` tests included: tests/support/mutation.py), then
# prints each file's score and its surviving mutants, marking those docs/testing.md names as
# equivalent. Every run starts afresh from a new copy (mutants/, git-ignored): results of an earlier
# run, made against other code or tests, are never reused. One mutant at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT_VERSION=3.8.1
PY=.venv/bin/python
if ! "$PY" -c "import mutmut, sys; sys.exit(mutmut.__version__ != '$MUTMUT_VERSION')" 2>/dev/null; then
  "$PY" -m pip install -q "mutmut==$MUTMUT_VERSION"
fi
mapfile -t configured < <("$PY" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]["only_mutate"], sep="\n")')
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=("${configured[@]}")
globs=()
for file in "${files[@]}"; do
  if ! printf '%s\n' "${configured[@]}" | grep -qxF "$file"; then
    echo "mutation.sh: $file is not in [tool.mutmut] only_mutate (pyproject.toml): ${configured[*]}" >&2
    exit 2
  fi
  module=${file%.py}
  globs+=("${module//\//.}.*")
done

rm -rf mutants
mkdir mutants
# The tests of verl's releases find them in .deps beside the tests: mutmut copies the tests, not .deps.
[[ -e .deps ]] && ln -s ../.deps mutants/.deps
# What the interpreters a test starts reach counts for the test (tests/support/mutation.py).
cp tests/support/mutmut_sitecustomize.py mutants/sitecustomize.py
# Each subprocess test starts a fresh interpreter, not a child of the fork server (tests/support/zygote.py):
# mutmut waits for any child of its process (os.wait), and takes a fork server's end for a mutant's;
# and a forked child runs no sitecustomize.
export TEST_NO_ZYGOTE=1
start=$SECONDS
# Its own process group: what a stopped mutant's run leaves running (a child interpreter stuck on a
# mutant's deadlock) is ended with it.
setsid .venv/bin/mutmut run --max-children 1 "${globs[@]}" > mutants/run.log 2>&1 &
run_pid=$!
rc=0
wait "$run_pid" || rc=$?
kill -- -"$run_pid" 2>/dev/null || true
elapsed=$((SECONDS - start))
if [[ $rc -ne 0 ]]; then
  tail -c 4000 mutants/run.log | tr '\r' '\n' | tail -40
  echo "mutation.sh: mutmut exited $rc (its output: mutants/run.log)" >&2
  exit "$rc"
fi
"$PY" - "$elapsed" "${files[@]}" <<'EOF'
"""Each file's score from mutmut's records (mutants/<file>.meta), and its mutants that lived."""

import json
import re
import sys
from pathlib import Path

KINDS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 36: "timeout", -24: "timeout",
         24: "timeout", 152: "timeout", 255: "timeout"}  # mutmut 3.8.1's status_by_exit_code, in short
elapsed, files = int(sys.argv[1]), sys.argv[2:]
equivalent = set(re.findall(r"`([\w.ǁ]+__mutmut_\d+)`", Path("docs/testing.md").read_text()))
print(f"--- mutation testing: {len(files)} file(s), {elapsed // 60} min {elapsed % 60} s")
for file in files:
    codes = json.loads(Path("mutants", file + ".meta").read_text())["exit_code_by_key"]
    kinds = {key: KINDS.get(code, f"other ({code})") for key, code in codes.items()}
    count = {k: sum(1 for v in kinds.values() if v == k) for k in ("killed", "timeout", "survived", "no tests")}
    other = len(kinds) - sum(count.values())
    caught = count["killed"] + count["timeout"]
    print(f"{file}: {len(kinds)} mutants, {count['killed']} killed, {count['timeout']} timeout, "
          f"{count['survived']} survived, {count['no tests']} no tests, {other} other: "
          f"score {caught / len(kinds):.1%}")
    for key, kind in sorted(kinds.items()):
        if kind not in ("killed", "timeout"):
            said = " (named equivalent in docs/testing.md)" if key in equivalent else ""
            print(f"    {kind}: {key}{said}")
print("each mutant's change: .venv/bin/mutmut show NAME")
EOF
