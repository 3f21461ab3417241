"""Find offload functions the table does not know, by reading source: a contributor's tool.

    python3 scripts/discover.py [PATH ...] [--all] [--json] [-v]

It was `te-offload-shim discover` until 0.7.0. A user needs no scan: the flush net clears, at run
time, the offloads no table entry knows, and names the function that called the flush (the log line
and `status`'s net row, `callers`): the function an entry or TE_OFFLOAD_SHIM_TARGETS should add.
Reading source for such functions is the table's contributors' job, so the scanner lives here, with
its tests (tests/tools/test_discover*.py). Run from a checkout, it reads the table of that checkout's
package, installed or not.

verl's `offload_megatron_model_to_cpu` has been copied into many forks and frameworks; no table can
list them all. This scans Python source statically (with `ast`; nothing is imported or run) for
functions and methods that move a Megatron model's weights off the device and then flush the
allocator, in the same body:

- a move: `<...>buffer<...>.offload_to_cpu(...)` (megatron-core's buffer offload; not with
  `move_params=False`), `<...>.storage().resize_(0)` / `.untyped_storage().resize_(0)`, or
  `<x>.data = <...>.to("cpu") / .cpu() / torch.empty(0, ...)`, or `torch_memory_saver.pause()`;
- a flush: a call named `empty_cache`, `clear_memory`, `gc_collect`, `aggressive_empty_cache`, or
  `torch_memory_saver.pause()` (it takes the whole pool off the device);
- and the module imports `megatron`, or the function names `param_data` / `DistributedDataParallel`
  (keeps FSDP and plain-torch offloads out).

A candidate is "covered" when a table entry (or `TE_OFFLOAD_SHIM_TARGETS`) names it, when it only
calls offload functions named like table entries, or when it clears the caches itself (its body, or
a function of its module it calls by name, touches `_fp8_workspaces`). Known limits are in
docs/frameworks.md ("Finding offload functions the table does not know").
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROG = "scripts/discover.py"
CHECKOUT = Path(__file__).resolve().parents[1]  # the repository this script belongs to
TARGETS = "TE_OFFLOAD_SHIM_TARGETS"  # the user's own entries, read as the shim reads them
FLUSH_CALLS = frozenset({"empty_cache", "clear_memory", "gc_collect", "aggressive_empty_cache"})
_SAVER_HINT = "memory_saver"
_TEXT_FLUSH = ("empty_cache", "clear_memory", "gc_collect", "pause(")
_TEXT_MOVE = ("resize_", "offload", "cpu", "pause(", "move_model")
_MODEL_NAMES = ("param_data", "DistributedDataParallel")
_CACHE_ATTR = "_fp8_workspaces"


@dataclass
class Candidate:
    target: str  # module:qualname
    file: str
    line: int
    reason: str
    where: str  # a guess at the `where` spec; "" means the first argument
    covered: bool = False
    covered_by: str = ""  # a table entry's name, "TE_OFFLOAD_SHIM_TARGETS" or "clears _fp8_workspaces itself"
    delegates: list[str] = field(default_factory=list)  # offload functions it calls for the move
    delegates_only: bool = False  # every move it makes is such a call

    @property
    def spec(self) -> str:
        return f"{self.target}@{self.where}" if self.where else self.target


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is(node: ast.AST, value: object) -> bool:
    """Whether `node` is the literal `value`."""
    return isinstance(node, ast.Constant) and node.value == value


def _first_is(call: ast.Call, value: object) -> bool:
    return bool(call.args) and _is(call.args[0], value)


def _moves_params(call: ast.Call) -> bool:
    """Not `move_params=False` (megatron-core's buffer offload then keeps the weights where they are)."""
    return not any(k.arg == "move_params" and _is(k.value, False) for k in call.keywords)


def _is_cpu_move(value: ast.AST) -> bool:
    """`....to("cpu", ...)`, `....to(device="cpu")`, `....cpu()`, `torch.empty(0, ...)` anywhere in `value`."""
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            name, device = _call_name(node), [*node.args, *(k.value for k in node.keywords if k.arg == "device")]
            if (name == "cpu" and isinstance(node.func, ast.Attribute)) or (name == "empty" and _first_is(node, 0)):
                return True
            if name == "to" and any(_is(a, "cpu") for a in device):
                return True
    return False


# Offload functions of the model's weights, by name: "offload" in it (or it starts with "move_model"),
# one of _DELEGATE_OF too, none of _DELEGATE_NOT, and it does not end like the gradients' or the way back.
_DELEGATE_OF = ("model", "module", "weight", "param")
_DELEGATE_NOT = ("optimizer", "copy_param")
_DELEGATE_NOT_END = ("grads", "grad_buffers", "_grad", "to_gpu")


def _delegated_move(name: str, call: ast.Call) -> bool:
    """A call to another offload function of the model's weights: `offload_megatron_model_to_cpu(m)`,
    `offload_megatron_no_grad_module(...)`, `self.move_model(m, "cpu")` (not optimizer or grads, not
    `move_params=False`)."""
    lower = name.lower()
    if not ("offload" in lower or lower.startswith("move_model")) or lower.endswith(_DELEGATE_NOT_END):
        return False
    if any(w in lower for w in _DELEGATE_NOT) or not any(w in lower for w in _DELEGATE_OF):
        return False
    if lower.startswith("move_model"):  # a mover in both directions: only towards the CPU
        return any(_is(v, "cpu") for v in [*call.args, *(k.value for k in call.keywords)])
    return _moves_params(call)


def _saver_pause(call: ast.Call) -> bool:
    return _call_name(call) == "pause" and _SAVER_HINT in ast.unparse(call.func)


class _Body:
    """Moves and flushes in one function body (nested functions and classes are their own).

    Walked with a stack, not ast.NodeVisitor's recursion: one deeply nested expression (a sum of a
    few hundred terms) would exceed the recursion limit and cost the whole scan."""

    _OWN = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

    def __init__(self) -> None:
        self.moves: list[str] = []
        self.flushes: list[str] = []
        self.names: set[str] = set()
        self.self_attrs: list[str] = []
        self.delegates: list[str] = []  # callees that do the move (another offload function)
        self.called: set[str] = set()  # names of the functions and methods it calls

    def read(self, statements: list[ast.stmt]) -> None:
        """Every node below `statements`, parents before children, in source order."""
        stack: list[ast.AST] = list(reversed(statements))
        while stack:
            node = stack.pop()
            if isinstance(node, self._OWN):
                continue
            if isinstance(node, ast.Name):
                self.names.add(node.id)
            elif isinstance(node, ast.Attribute):
                self.names.add(node.attr)
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    self.self_attrs.append(node.attr)
            elif isinstance(node, ast.Call):
                self._call(node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr == "data" and _is_cpu_move(node.value):
                        self.moves.append(f"{ast.unparse(target)} = ...cpu")
            stack.extend(reversed(list(ast.iter_child_nodes(node))))

    def _call(self, node: ast.Call) -> None:
        name = _call_name(node)
        self.called.add(name)
        if name == "offload_to_cpu" and isinstance(node.func, ast.Attribute):
            receiver = ast.unparse(node.func.value)
            if "buffer" in receiver.lower() and _moves_params(node):
                self.moves.append(f"{receiver}.offload_to_cpu()")
        elif name == "resize_" and _first_is(node, 0):
            storage = node.func.value if isinstance(node.func, ast.Attribute) else None
            if isinstance(storage, ast.Call) and _call_name(storage) in ("storage", "untyped_storage"):
                self.moves.append(f"{_call_name(storage)}().resize_(0)")
        elif _delegated_move(name, node):
            self.moves.append(f"{name}(...)")
            self.delegates.append(name)
        elif _saver_pause(node):
            self.moves.append("torch_memory_saver.pause()")
            self.flushes.append("torch_memory_saver.pause()")
        if name in FLUSH_CALLS:
            self.flushes.append(f"{name}()")


def _guess_where(func: ast.FunctionDef | ast.AsyncFunctionDef, body: _Body, is_method: bool) -> str:
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    if is_method:
        for attr in body.self_attrs:
            if "model" in attr.lower():
                return f"self.{attr}"
        params = params[1:]
    for name in params:
        if "model" in name.lower() or name in ("chunks", "modules"):
            return name
    return ""


def _touches_cache(tree: ast.AST) -> bool:
    return any(getattr(n, "attr", None) == _CACHE_ATTR or _is(n, _CACHE_ATTR) for n in ast.walk(tree))


def _imports_megatron(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "megatron" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "megatron" and not node.level:
            return True
    return False


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """(qualname, node, is_method) for module-level functions and methods of module-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node, False
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    static = any(ast.unparse(d) == "staticmethod" for d in item.decorator_list)
                    yield f"{node.name}.{item.name}", item, not static


def scan_source(source: str, module: str, filename: str) -> list[Candidate]:
    """Candidates in one module's source. Raises what `ast.parse` raises for source it cannot
    build (SyntaxError, ValueError, RecursionError, MemoryError): `scan` reports the file skipped."""
    if not any(t in source for t in _TEXT_FLUSH) or not any(t in source for t in _TEXT_MOVE):
        return []
    tree = ast.parse(source, filename)
    megatron = _imports_megatron(tree)
    clearing: set[str] | None = None
    found: list[Candidate] = []
    for qualname, func, is_method in _functions(tree):
        body = _Body()
        body.read(func.body)
        if not body.moves or not body.flushes:
            continue
        if not megatron and not body.names.intersection(_MODEL_NAMES):
            continue
        if clearing is None:
            clearing = {q.rpartition(".")[2] for q, f, _ in _functions(tree) if _touches_cache(f)}
        moves = ", ".join(dict.fromkeys(body.moves))
        flushes = ", ".join(dict.fromkeys(body.flushes))
        candidate = Candidate(
            f"{module}:{qualname}",
            filename,
            func.lineno,
            f"moves weights ({moves}) and flushes ({flushes})",
            _guess_where(func, body, is_method),
            delegates=list(dict.fromkeys(body.delegates)),
            delegates_only=bool(body.delegates) and len(body.delegates) == len(body.moves),
        )
        # it clears the caches itself: in its own body, or in a function of its module that it calls
        # by name (verl 0.9's `_clear_te_fp8_weight_workspaces(model_chunk)`)
        if _touches_cache(func) or body.called.intersection(clearing):
            candidate.covered, candidate.covered_by = True, f"clears {_CACHE_ATTR} itself"
        found.append(candidate)
    return found


# --- where the source comes from ----------------------------------------------------------------


def _module_name(relative: Path) -> str | None:
    """The module a .py file at `relative` (to its import root) is, None where no import names it."""
    module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
    return module if all(p.isidentifier() for p in module.split(".")) else None


def _package_root(path: Path) -> Path:
    """The folder a module would be imported from: the first parent without an __init__.py."""
    root = path if path.is_dir() else path.parent
    while (root / "__init__.py").is_file():
        root = root.parent
    return root


_SKIP_DIRS = frozenset({"__pycache__", "tests", "test", ".git", "node_modules"})


def files_under(path: Path) -> Iterator[tuple[Path, str]]:
    """(file, module name) for every .py file under `path` (a folder on sys.path, a package, a file)."""
    path = path.resolve()
    root = _package_root(path)
    walked: Iterable[tuple[str, list[str], list[str]]] = (
        os.walk(path) if path.is_dir() else [(str(path.parent), [], [path.name])]
    )
    for folder, dirs, files in walked:
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith((".dist-info", ".egg-info")))
        for name in sorted(files):
            module = _module_name(Path(folder, name).relative_to(root))
            if name.endswith(".py") and module is not None:
                yield Path(folder, name), module


def scan(files: Iterable[tuple[Path, str]], skipped: list[str]) -> list[Candidate]:
    """Candidates in `files`. A file that cannot be read or analysed for any reason (one valid
    module can still be too deep for `ast` to build: a sum of 3,000 terms raises RecursionError)
    costs only itself: it goes into `skipped`, with why, and the scan goes on."""
    found: list[Candidate] = []
    for file, module in files:
        try:
            if not file.is_file():  # a named pipe called x.py would block the read for good
                raise OSError("not a regular file")
            source = file.read_text(encoding="utf-8", errors="replace")
            found.extend(scan_source(source, module, str(file)))
        except Exception as exc:
            skipped.append(f"{file}: {type(exc).__name__}: {exc}")
    return found


def mark_covered(candidates: list[Candidate]) -> None:
    """Mark the candidates the built-in table or TE_OFFLOAD_SHIM_TARGETS names."""
    from te_offload_shim.integrations.targets import BUILTIN
    from te_offload_shim.integrations.user_targets import parse_user_targets

    user, _ = parse_user_targets(os.environ.get(TARGETS, ""))
    table = {t.path: t.name for t in BUILTIN}
    table.update({t.path: TARGETS for t in user})
    wrapped_names = {t.attribute.rpartition(".")[2] for t in (*BUILTIN, *user)}
    for candidate in candidates:
        if candidate.covered:
            continue
        name = table.get(candidate.target)
        if name:
            candidate.covered, candidate.covered_by = True, name
            continue
        # it only calls other offload functions, each named like one the table wraps: cleared in there
        if candidate.delegates_only and wrapped_names.issuperset(candidate.delegates):
            candidate.covered, candidate.covered_by = True, f"calls {', '.join(candidate.delegates)} (a table name)"


def default_paths() -> list[str]:
    """Where `discover` looks without PATH: the folders on sys.path (site-packages, PYTHONPATH,
    editable checkouts), but the standard library's, the current directory, this checkout and its
    scripts folder (run as a script, Python puts the folder on sys.path and the script the checkout:
    no installed code)."""
    stdlib = (sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"))
    skip = {os.path.realpath(p) for p in (*stdlib, ".", CHECKOUT, CHECKOUT / "scripts")}
    return [p for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) not in skip]


def discover(paths: list[str], skipped: list[str]) -> list[Candidate]:
    """Every candidate under `paths` (or `default_paths()`), covered ones marked; the files that
    could not be scanned, with why, go into `skipped`. A file under two of the paths is read once."""
    files: dict[Path, str] = {}
    for path in paths or default_paths():
        for file, module in files_under(Path(path)):
            files.setdefault(file, module)  # as an import finds it: the first folder on the path
    candidates = scan(files.items(), skipped)
    mark_covered(candidates)
    candidates.sort(key=lambda c: (c.covered, c.target))
    return candidates


def as_json(candidates: list[Candidate]) -> list[dict[str, object]]:
    """The candidates as `--json` prints them: every field but `delegates_only`, and the spec."""
    return [{**{k: v for k, v in asdict(c).items() if k != "delegates_only"}, "spec": c.spec} for c in candidates]


def print_text(candidates: list[Candidate], show_all: bool) -> None:
    shown = [c for c in candidates if show_all or not c.covered]
    for c in shown:
        note = f"  [covered: {c.covered_by}]" if c.covered else ""
        print(f"{c.target}  {c.file}:{c.line}  {c.reason}{note}")
    new = [c for c in candidates if not c.covered]
    covered = len(candidates) - len(new)
    print(f"{PROG}: {len(new)} not covered, {covered} covered")
    if new:
        specs = dict.fromkeys(c.spec for c in new)  # one per target, however many copies were found
        print(f"TE_OFFLOAD_SHIM_TARGETS={','.join(specs)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Find offload functions the table does not cover (reads source, imports nothing)."
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="folders or files (default: the folders on sys.path)")
    parser.add_argument("--json", action="store_true", help="every candidate, covered ones included, as JSON")
    parser.add_argument("--all", action="store_true", help="list the covered candidates too")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="name each file that could not be scanned, and why"
    )
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:  # never "0 not covered" for a path that is not there
        read = sum(1 for p in args.paths if p not in missing for _ in files_under(Path(p)))
        print(f"{PROG}: no such path: {', '.join(missing)} ({read} files read)", file=sys.stderr)
        return 2
    skipped: list[str] = []
    candidates = discover(args.paths, skipped)
    if args.verbose:
        for line in skipped:
            print(f"{PROG}: skipped {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(as_json(candidates), indent=2))
    else:
        print_text(candidates, args.all)
    return 0


if __name__ == "__main__":
    # `te_offload_shim` (the table's names) is this checkout's package, installed or not
    sys.path.insert(0, str(CHECKOUT))
    sys.exit(main())
