#!/usr/bin/env bash
# Mutation testing with mutmut (docs/testing.md#mutation-testing); not part of CI.
#   scripts/mutation.sh [FILE...]   e.g. scripts/mutation.sh te_offload_shim/_hook.py
#   scripts/mutation.sh FILE -- MUTANT...   only the mutants named (mutmut's names, * as a wildcard):
#                                   a run stopped part-way is finished without checking again what it checked
# MUTATION_CHILDREN=N runs N mutants at once (default 1: timing-sensitive tests stay unloaded).
# Each file named (default: every file of pyproject.toml's [tool.te-offload-shim.mutation]) is run
# on its own, one mutant at a time, against its own tests there: mutmut runs each mutant against
# those of them that reached the mutated function (the interpreters they start included:
# tests/support/mutation.py). Then it prints each file's score and the mutants that lived, marking
# those docs/testing.md names (with why each lives). Every run starts afresh, in .mutation/<file>/ (git-ignored):
# a project root of its own for mutmut, which reads one test selection per project from its
# pyproject.toml and makes its copy of the repository there (mutants/). Results of an earlier run,
# made against other code or tests, are never reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MUTMUT_VERSION=3.8.1
PY=$ROOT/.venv/bin/python
if ! "$PY" -c "import mutmut, sys; sys.exit(mutmut.__version__ != '$MUTMUT_VERSION')" 2>/dev/null; then
  "$PY" -m pip install -q "mutmut==$MUTMUT_VERSION"
fi
mapfile -t configured < <("$PY" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["te-offload-shim"]["mutation"], sep="\n")')
files=() names=()
while [[ $# -gt 0 && $1 != -- ]]; do files+=("$1"); shift; done
if [[ $# -gt 0 ]]; then
  shift
  names=("$@")
  if [[ ${#files[@]} -ne 1 || ${#names[@]} -eq 0 ]]; then
    echo "mutation.sh: mutants are named for one file: scripts/mutation.sh FILE -- MUTANT..." >&2
    exit 2
  fi
fi
[[ ${#files[@]} -gt 0 ]] || files=("${configured[@]}")
for file in "${files[@]}"; do
  if ! printf '%s\n' "${configured[@]}" | grep -qxF "$file"; then
    echo "mutation.sh: $file is not in pyproject.toml's [tool.te-offload-shim.mutation]: ${configured[*]}" >&2
    exit 2
  fi
done

# Each subprocess test starts a fresh interpreter, not a child of the fork server (tests/support/zygote.py):
# mutmut waits for any child of its process (os.wait), and takes a fork server's end for a mutant's;
# and a forked child runs no sitecustomize.
export TEST_NO_ZYGOTE=1
status=0
for file in "${files[@]}"; do
  work=.mutation/$(basename "$file" .py)
  rm -rf "$work"
  mkdir -p "$work/mutants"
  for part in te_offload_shim tests harness; do ln -s "$ROOT/$part" "$work/$part"; done
  # this file's pyproject.toml: the repository's, with what to mutate and which tests to run set
  "$PY" - "$file" > "$work/pyproject.toml" <<'EOF'
import json, sys, tomllib
file = sys.argv[1]
text = open("pyproject.toml").read()
tests = tomllib.loads(text)["tool"]["te-offload-shim"]["mutation"][file]
lines = ["[tool.mutmut]", f"only_mutate = {json.dumps([file])}", f"pytest_add_cli_args_test_selection = {json.dumps(tests)}"]
print(text.replace("[tool.mutmut]\n", "\n".join(lines) + "\n", 1), end="")
EOF
  # The tests of verl's releases find them in .deps beside the tests: mutmut copies the tests, not .deps.
  [[ -e .deps ]] && ln -s "$ROOT/.deps" "$work/mutants/.deps"
  # What the interpreters a test starts reach counts for the test (tests/support/mutation.py).
  cp tests/support/mutmut_sitecustomize.py "$work/mutants/sitecustomize.py"
  start=$SECONDS
  # Its own process group: what a stopped mutant's run leaves running (a child interpreter stuck on
  # a mutant's deadlock) is ended with it.
  (cd "$work" && exec setsid "$ROOT/.venv/bin/mutmut" run --max-children "${MUTATION_CHILDREN:-1}" "${names[@]}" > mutants/run.log 2>&1) &
  run_pid=$!
  rc=0
  wait "$run_pid" || rc=$?
  kill -- -"$run_pid" 2>/dev/null || true
  elapsed=$((SECONDS - start))
  if [[ $rc -ne 0 ]]; then
    tail -c 4000 "$work/mutants/run.log" | tr '\r' '\n' | tail -40
    echo "mutation.sh: mutmut exited $rc on $file (its output: $work/mutants/run.log)" >&2
    status=$rc
    continue
  fi
  "$PY" - "$file" "$work" "$elapsed" <<'EOF'
"""The file's score from mutmut's record (mutants/<file>.meta), and its mutants that lived."""

import json
import re
import sys
from pathlib import Path

file, work, elapsed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
# mutmut 3.8.1's exit codes (mutmut/stats.py), in short: everything else is "other"
KINDS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 36: "timeout", -24: "timeout"}
KINDS |= {24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}
named = set(re.findall(r"`([\w.ǁ]+__mutmut_\d+)`", Path("docs/testing.md").read_text()))
codes = json.loads((work / "mutants" / (file + ".meta")).read_text())["exit_code_by_key"]
kinds = {key: KINDS.get(code, f"other ({code})") for key, code in codes.items()}
count = {k: sum(1 for v in kinds.values() if v == k) for k in ("killed", "timeout", "survived", "no tests", "not checked")}
other = len(kinds) - sum(count.values())
caught = count["killed"] + count["timeout"]
checked = len(kinds) - count["not checked"]
print(f"--- {file}: {len(kinds)} mutants in {elapsed // 60} min {elapsed % 60} s: {count['killed']} killed, "
      f"{count['timeout']} timeout, {count['survived']} survived, {count['no tests']} no tests, {other} other, "
      f"{count['not checked']} not checked (not named); score {caught / max(checked, 1):.1%} of those checked")
for key, kind in sorted(kinds.items()):
    if kind not in ("killed", "timeout", "not checked"):
        said = " (named in docs/testing.md)" if key in named else ""
        print(f"    {kind}: {key}{said}")
print(f"    (a mutant's change: cd {work} && ../../.venv/bin/mutmut show NAME)")
EOF
done
exit "$status"
