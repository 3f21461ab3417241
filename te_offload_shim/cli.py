"""`te-offload-shim` (also `python -m te_offload_shim`): enable, disable, run, status, discover, startup-file.

Importing this module imports the package, which installs the shim in the CLI's own process; that
is what lets `status --import` report what a real process would get.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from te_offload_shim import _switches
from te_offload_shim.activation import pth


def _enable(args: argparse.Namespace) -> int:
    try:
        what, path = pth.enable(args.site)
    except pth.SiteError as exc:
        print(f"te-offload-shim enable: {exc}", file=sys.stderr)
        return 1
    print(f"te-offload-shim: {what}: {path}")
    if what != "already enabled" and not args.site:
        print("te-offload-shim: every Python process of this interpreter now activates the shim at start-up")
    return 0


def _disable(args: argparse.Namespace) -> int:
    try:
        what, path = pth.disable(args.site)
    except pth.SiteError as exc:
        print(f"te-offload-shim disable: {exc}", file=sys.stderr)
        return 1
    print(f"te-offload-shim: {what}: {path}")
    for other in pth.pth_files():
        if other["path"] != path:
            print(f"te-offload-shim: still enabled by {other['path']}")
    return 0


def _run(args: argparse.Namespace) -> int:
    command = list(args.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("te-offload-shim run: no command given (usage: te-offload-shim run -- CMD [ARGS...])", file=sys.stderr)
        return 2
    env = dict(os.environ)
    previous = env.get("PYTHONPATH", "")
    bootstrap = pth.BOOTSTRAP_DIR
    if bootstrap not in previous.split(os.pathsep):
        # Prepended, the user's entries kept as they were (an empty PYTHONPATH stays without a
        # trailing separator: an empty entry would put the current directory on sys.path).
        env["PYTHONPATH"] = bootstrap + (os.pathsep + previous if previous else "")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)  # the command gets our pid, signals and exit status
    except OSError as exc:
        print(f"te-offload-shim run: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvpe does not return


def _import_targets(rows: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """Import each present target module, so that the shim patches it in this process.

    Returns the import errors, and what the imports printed or warned (megatron and its friends say
    a lot): held back and shown after the report, not ahead of it."""
    import importlib
    import io
    import warnings

    errors: dict[str, str] = {}
    said = io.StringIO()
    below_python: list[str] = []  # what reached file descriptor 1 itself
    with _descriptor_1_held(below_python), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # each warning once per place, as Python shows them
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            for row in rows:
                module = row["target"].partition(":")[0]
                if not row["present"] or module in errors:
                    continue
                try:
                    importlib.import_module(module)
                except Exception as exc:
                    errors[module] = f"{type(exc).__name__}: {exc}"
    lines = [line for text in (said.getvalue(), *below_python) for line in text.splitlines() if line.strip()]
    lines += [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
    return errors, list(dict.fromkeys(lines))


@contextlib.contextmanager
def _descriptor_1_held(sink: list[str]) -> Iterator[None]:
    """Point file descriptor 1 at a scratch file while the targets import, and put what reached it
    into `sink`: a C extension's printf, a subprocess the import runs, a write to fd 1, none of which
    Python's `sys.stdout` sees. `status --json` must print one JSON document and nothing else."""
    _flush_stdout()  # what was written before belongs where it was going
    try:
        held = _scratch_file()
    except OSError:  # nowhere to hold it: leave it as it is
        yield
        return
    with held:
        try:
            saved = os.dup(1)
        except OSError:  # no descriptor 1 (closed by the caller): nothing can reach the report either
            yield
            return
        os.dup2(held.fileno(), 1)
        try:
            yield
        finally:
            _flush_stdout()  # C's stdio buffer and sys.__stdout__'s still hold the imports' output
            os.dup2(saved, 1)
            os.close(saved)
            held.seek(0)
            sink.append(held.read().decode("utf-8", "replace"))


def _scratch_file() -> Any:
    """A file that needs no writable folder (a container's read-only root file system may have no
    usable /tmp): an anonymous memory file where Linux has them, else a temporary file."""
    if hasattr(os, "memfd_create"):
        try:
            return open(os.memfd_create("te-offload-shim-status"), "w+b")
        except OSError:  # an old kernel, or memfd refused by a seccomp profile
            pass
    import tempfile

    return tempfile.TemporaryFile()  # OSError where there is no usable temporary folder either


def _flush_stdout() -> None:
    for stream in (sys.stdout, sys.__stdout__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a closed or odd stream: its text stays where it is
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # every C stdio output stream (printf from an extension)
    except Exception:  # no C library to ask (not Linux or macOS): nothing buffered there to lose
        pass


def collect(do_import: bool = False) -> dict[str, Any]:
    """Everything `status` reports, and whether it is healthy (with the reasons when not)."""
    import te_offload_shim
    from te_offload_shim.api import all_targets
    from te_offload_shim.integrations import versions

    enabled = _switches.enabled()
    targets = all_targets()
    rows = [versions.target_row(t, enabled) for t in targets]
    import_errors, import_output = _import_targets(rows) if do_import else ({}, [])
    if do_import:
        live = {r["name"]: r for r in te_offload_shim.status()["targets"]}
        for row in rows:
            module = row["target"].partition(":")[0]
            row["imported"] = live[row["name"]]["imported"]
            row["state"] = live[row["name"]]["state"]
            row["detail"] = live[row["name"]]["detail"]
            row["layers"] = live[row["name"]]["layers"]
            row["import_error"] = import_errors.get(module)
    shim = te_offload_shim.status()
    found = versions.versions()
    report: dict[str, Any] = {
        "shim": {
            "version": te_offload_shim.__version__,
            "path": os.path.dirname(os.path.abspath(te_offload_shim.__file__)),
            "enabled": enabled,
            "installed_here": shim["installed"],
            "strict": _switches.strict(),
        },
        "python": {"version": found["python"], "executable": sys.executable},
        "versions": found,
        "targets": rows,
        "routes": pth.routes(),
        "switches": {name: os.environ[name] for name in _switches.ALL_SWITCHES if name in os.environ},
        "disabled_by": _disabled_by([t.name for t in targets]),
        "user_target_problems": shim["user_target_problems"],
        "declaration_problems": [p for t in targets for p in versions.declaration_problems(t)],
        "hook_errors": shim["hook_errors"],
        "imported": do_import,
        "import_output": import_output,  # what importing the targets printed or warned (--import)
        # TE_OFFLOAD_SHIM_AUDIT: the latest residue report of this process (None until an offload ran here)
        "audit": {"enabled": _switches.audit(), "latest": te_offload_shim.stats()["audit"]},
        "net": shim["net"],  # the flush net (engine/net.py): armed only where TE's PyTorch modules are imported
    }
    report["routes"]["in_force"] = _route_in_force(report["routes"], shim["installed"])
    problems, warnings = _assess(report)
    report["healthy"] = not problems
    report["problems"] = problems
    report["warnings"] = warnings
    return report


def _disabled_by(names: list[str]) -> dict[str, list[str]]:
    """Each TE_OFFLOAD_SHIM_DISABLE value and the targets it switches off (a name also switches off
    its `name-*` variants, `_switches.covers`): shown by `status` rather than left to be guessed."""
    return {value: [n for n in names if _switches.covers(value, n)] for value in sorted(_switches.disabled_targets())}


def _assess(report: dict[str, Any]) -> tuple[list[str], list[str]]:
    from te_offload_shim.integrations import versions

    problems: list[str] = []
    warnings: list[str] = []
    if not report["shim"]["enabled"]:
        # An operator's choice, not a fault: `status` exits 0 so the same image check passes.
        warnings.append(f"switched off by {_switches.ENABLE}={os.environ.get(_switches.ENABLE)}: nothing is patched")
    if "*" in _switches.disabled_targets():
        warnings.append(f"every target is switched off by {_switches.DISABLE}=*: nothing is patched")
    if not versions.wrapt_ok(report["versions"]["wrapt"]):
        problems.append(f"wrapt {versions.WRAPT_NEEDED} is needed to patch, found {report['versions']['wrapt']}")
    problems.extend(report["declaration_problems"])
    problems.extend(f"{_switches.TARGETS}: {p}" for p in report["user_target_problems"])
    problems.extend(f"patching failed: {e}" for e in report["hook_errors"])
    if report["net"]["state"] == "error":
        problems.append(f"flush net: error: {report['net']['detail']}")
    for row in report["targets"]:
        state = row.get("state") or ""
        if state == "error":
            problems.append(f"{row['name']}: error: {row.get('detail', '')}")
        elif state == "absent" and row.get("user") and row.get("imported"):
            module, _, attribute = row["target"].partition(":")
            problems.append(f"{row['name']}: {module} has no attribute {attribute} (misspelt in {_switches.TARGETS}?)")
        if row.get("layers", 0) > 1:
            problems.append(f"{row['name']}: {row['layers']} shim wrappers stacked on {row['target']}")
        if row.get("import_error"):
            warnings.append(f"{row['name']}: import failed: {row['import_error']}")
        if report["imported"] and row["would_be_patched"] and row.get("imported") and state != "patched":
            warnings.append(f"{row['name']}: expected to be patched, state is {state!r}")
        if row["in_supported"] is False and row["would_be_patched"]:
            warnings.append(f"{row['name']}: {row['in_supported_basis']}: a release this entry was not checked on")
    pth_problems, pth_warnings = pth.assess(report["routes"]["pth"])
    return problems + pth_problems, warnings + pth_warnings


_IMPORT_LINES = 20


def _net_line(net: dict[str, Any], installed: bool) -> str:
    """The flush net in one line: its state and why, and what it has cleared in this process."""
    if net["state"] == "not armed" and installed and net["detail"].startswith("Transformer Engine"):
        return "on: arms in a process that imports Transformer Engine's PyTorch modules (none here)"
    line = f"{net['state']}: {net['detail']}"
    if net["state"] == "armed" or net["flushes"]:
        line += (
            f"; {net['flushes']} flushes seen, {net['cleared_flushes']} cleared {net['entries']} caches in "
            f"{net['layers']} layers ({_human(net['bytes'])}); {net['live_layers']} TE layers known"
        )
        if net["callers"]:
            line += f"; called from {', '.join(net['callers'])}"
    return line


def _human(n: int) -> str:
    from te_offload_shim._log import human_bytes

    return human_bytes(n)


def _yes(value: object) -> str:
    return {True: "yes", False: "no", None: "unknown"}.get(value, str(value))  # type: ignore[call-overload]


def _supported(row: dict[str, Any]) -> str:
    """`yes (>=0.4.0)`: whether the installed release is one the entry declares, and the declaration."""
    if not row["present"] or not row["distribution"]:  # a TE_OFFLOAD_SHIM_TARGETS entry declares no releases
        return "-"
    declared = row["supported"] or "no release"
    return f"{_yes(row['in_supported'])} ({declared})"


def _fixed(row: dict[str, Any]) -> str:
    answer = _yes(row["fixed_upstream"])
    return f"{answer} (from {row['fixed_in']})" if row["fixed_in"] and row["present"] else answer


def _print_report(report: dict[str, Any], show_all: bool = False) -> None:
    shim = report["shim"]
    print(f"te-offload-shim {shim['version']} ({shim['path']})")
    print(f"  enabled: {_yes(shim['enabled'])}   strict: {_yes(shim['strict'])}")
    print(f"  python {report['python']['version']} ({report['python']['executable']})")
    print("versions:")
    for name, value in report["versions"].items():
        if name != "python":
            print(f"  {name:<20} {value or '-'}")
    print("targets:")
    header = ["target", "present", "version", "supported", "fixed upstream", "would be patched", "disabled"]
    if report["imported"]:
        header += ["state", "layers"]
    table = [header]
    # What is here (and what would be patched) first; the many targets of frameworks this
    # environment does not have, one line (every row: --all, or --json).
    shown, absent = _present_first(report["targets"], show_all)
    for row in shown:
        cells = [row["name"], _yes(row["present"]), row["version"] or "-", _supported(row)]
        cells += [_fixed(row), _yes(row["would_be_patched"]), _yes(row["disabled"])]
        if report["imported"]:
            cells += [str(row["state"]), str(row["layers"])]
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for cells in table:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    if absent:  # a row of its own, aligned with the table's first two columns
        names = ", ".join(row["name"] for row in absent)
        cells = ["others".ljust(widths[0]), "no".ljust(widths[1]), f"{len(absent)} targets: {names} (every row: --all)"]
        print("  " + "  ".join(cells))
    print(f"flush net: {_net_line(report['net'], report['shim']['installed_here'])}")
    routes = report["routes"]
    print("activation routes:")
    label = {True: "", False: " (outdated)", None: " (not readable by this user)"}
    files = ", ".join(p["path"] + label[p["current"]] for p in routes["pth"])
    print(f"  .pth:                      {files or 'no'}")
    print(f"  sitecustomize bootstrap:   {_yes(routes['sitecustomize_bootstrap'])}")
    print(f"  VERL_USE_EXTERNAL_MODULES: {_yes(routes['verl_external_modules'])}")
    print(f"  PYTHONSTARTUP:             {_yes(routes['pythonstartup'])}")
    print(f"  Ray worker setup hook:     {_yes(routes['ray_worker_setup_hook'])} (in this process)")
    print(f"  ray.init setup hook:       {routes['ray_init_propagation']}")
    switches = ", ".join(f"{k}={v}" for k, v in report["switches"].items())
    print(f"  switches:                  {switches or 'none set'}")
    for value, names in report["disabled_by"].items():
        variants = " (its name-* variants included)" if len(names) > 1 and value != "*" else ""
        print(f"  {_switches.DISABLE}={value} switches off: {', '.join(names) or 'no target'}{variants}")
    print(f"  in force here:             {routes['in_force']}")
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    if report["import_output"]:
        shown = report["import_output"][:_IMPORT_LINES]
        print(f"what importing the targets printed or warned ({len(report['import_output'])} lines):")
        for line in shown:
            print(f"  | {line[:200]}")
        if len(report["import_output"]) > len(shown):
            print("  | ... (all of it: --json, key import_output)")
    print("healthy" if report["healthy"] else "UNHEALTHY: " + "; ".join(report["problems"]))


def _present_first(rows: list[dict[str, Any]], show_all: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows of the table, rows left to one summary line): the targets present here, and those the
    switches name (TE_OFFLOAD_SHIM_TARGETS, TE_OFFLOAD_SHIM_DISABLE), first, in the table's order;
    the others after them with `show_all`, else in the summary."""
    here = [r for r in rows if r["present"] or r.get("user") or r["disabled"]]
    elsewhere = [r for r in rows if r not in here]
    return (here + elsewhere, []) if show_all else (here, elsewhere)


def _route_in_force(routes: dict[str, Any], installed_here: bool) -> str:
    """The route that activates the shim in processes started like this one."""
    found = [
        name
        for name, on in (
            (".pth", pth.in_force(routes["pth"])),
            ("sitecustomize bootstrap", routes["sitecustomize_bootstrap"]),
            ("VERL_USE_EXTERNAL_MODULES", routes["verl_external_modules"]),
            ("Ray worker setup hook", routes["ray_worker_setup_hook"]),
            ("PYTHONSTARTUP (interactive only)", routes["pythonstartup"]),
        )
        if on
    ]
    if found:
        return ", ".join(found)
    return "none: active only where code imports te_offload_shim" + (" (as this process did)" if installed_here else "")


def _status(args: argparse.Namespace) -> int:
    report = collect(do_import=args.do_import)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=False))
    else:
        _print_report(report, show_all=args.all)
    if not report["healthy"]:
        print(f"te-offload-shim: unhealthy: {report['problems'][0]}", file=sys.stderr)
        return 1
    return 0


def _startup_file(args: argparse.Namespace) -> int:
    print(pth.STARTUP_FILE)
    return 0


def _discover(args: argparse.Namespace) -> int:
    from te_offload_shim.integrations import discover

    skipped: list[str] = []
    candidates = discover.discover(args.paths, skipped)
    if args.verbose:
        for line in skipped:
            print(f"te-offload-shim discover: skipped {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(discover.as_json(candidates), indent=2))
    else:
        discover.print_text(candidates, args.all)
    return 0


_COMMANDS = {
    "enable": "write te_offload_shim.pth into site-packages: every start of this interpreter activates the shim",
    "disable": "remove te_offload_shim.pth",
    "run": "run CMD with the shim active in it and in every Python process below it (PYTHONPATH bootstrap)",
    "status": "versions, targets, activation routes; exit 1 when unhealthy",
    "discover": "find offload functions the table does not cover (reads source, imports nothing)",
    "startup-file": "print the path of the PYTHONSTARTUP file (interactive sessions only)",
}


def _parser() -> argparse.ArgumentParser:
    from te_offload_shim import __version__

    parser = argparse.ArgumentParser(
        prog="te-offload-shim", description="Activate te_offload_shim in every Python process, and check it."
    )
    parser.add_argument("--version", action="version", version=f"te-offload-shim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=_COMMANDS[name], description=_COMMANDS[name])

    p = command("enable")
    p.add_argument("--site", metavar="DIR", help="this directory instead of the interpreter's site-packages")
    p.set_defaults(func=_enable)
    p = command("disable")
    p.add_argument("--site", metavar="DIR", help="this directory instead of the interpreter's site-packages")
    p.set_defaults(func=_disable)
    p = command("run")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(func=_run)
    p = command("status")
    p.add_argument("--json", action="store_true", help="machine-readable output (every target)")
    p.add_argument("--all", action="store_true", help="list every target, not only those present here")
    p.add_argument(
        "--import", dest="do_import", action="store_true", help="import the targets here and report what got patched"
    )
    p.set_defaults(func=_status)
    p = command("discover")
    p.add_argument("paths", nargs="*", metavar="PATH", help="folders or files (default: installed distributions)")
    p.add_argument("--json", action="store_true", help="every candidate, covered ones included, as JSON")
    p.add_argument("--all", action="store_true", help="list the covered candidates too")
    p.add_argument("-v", "--verbose", action="store_true", help="name each file that could not be scanned, and why")
    p.set_defaults(func=_discover)
    p = command("startup-file")
    p.set_defaults(func=_startup_file)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
