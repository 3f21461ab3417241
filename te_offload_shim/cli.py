"""`te-offload-shim` (also `python -m te_offload_shim`): enable, disable, run, status, stats, startup-file,
selftest.

Parses the command line and dispatches; what `status` gathers, judges and prints is the health model
(health.py). Importing this module imports the package, which installs the shim in the CLI's own
process; that is what lets `status --import` report what a real process would get.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from te_offload_shim import __version__, health
from te_offload_shim.activation import pth


def _site_command(name: str, act: Any, args: argparse.Namespace) -> int:
    """`enable` or `disable` (`act`: pth.enable or pth.disable): what happened to which file, or why
    it could not."""
    try:
        what, path = act(args.site)
    except pth.SiteError as exc:
        print(f"te-offload-shim {name}: {exc}", file=sys.stderr)
        return 1
    print(f"te-offload-shim: {what}: {path}")
    if name == "enable" and what != "already enabled" and not args.site:
        print("te-offload-shim: every Python process of this interpreter now activates the shim at start-up")
    for other in pth.pth_files() if name == "disable" else ():
        if other["path"] != path:
            print(f"te-offload-shim: still enabled by {other['path']}")
    return 0


def _run(args: argparse.Namespace) -> int:
    command = args.argv[1:] if args.argv[:1] == ["--"] else list(args.argv)
    if not command:
        print("te-offload-shim run: no command given (usage: te-offload-shim run -- CMD [ARGS...])", file=sys.stderr)
        return 2
    env = dict(os.environ)
    previous = env.get("PYTHONPATH", "")
    if pth.BOOTSTRAP_DIR not in previous.split(os.pathsep):
        # Prepended, the user's entries kept as they were (an empty PYTHONPATH stays without a
        # trailing separator: an empty entry would put the current directory on sys.path).
        env["PYTHONPATH"] = pth.BOOTSTRAP_DIR + (os.pathsep + previous if previous else "")
    _say_if_inert(command, env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)  # the command gets our pid, signals and exit status: no return
    except OSError as exc:
        print(f"te-offload-shim run: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127


def _say_if_inert(command: list[str], env: dict[str, str]) -> None:
    """One stderr line when the command's Python (the command itself, or its script's `#!` line)
    cannot import the package, or wrapt: it then runs without the shim, as it would without `run`."""
    import shutil
    import subprocess

    program = shutil.which(command[0], path=env.get("PATH")) or command[0]
    python: list[str] = [program]
    # Python 2.7 has no importlib.util (and no print function): there, both count as missing
    probe = (
        "import sys\ntry:\n import importlib.util as u\nexcept ImportError:\n u = None\n"
        "sys.stdout.write(' '.join(n for n in ('te_offload_shim', 'wrapt') if u is None or not u.find_spec(n)))"
    )
    try:  # a program that cannot be read or run: nothing to say
        if not os.path.basename(program).startswith("python"):
            with open(program, "rb") as file:
                line = file.readline(256).decode("utf-8", "replace")
            if not line.startswith("#!") or "python" not in line:
                return  # not a Python program (a shell script, a binary): nothing to ask
            python = line[2:].split()
        proc = subprocess.run([*python, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return
    missing = proc.stdout.split()
    if proc.returncode == 0 and missing:
        why = "cannot import te_offload_shim" if "te_offload_shim" in missing else "has no wrapt: nothing is patched"
        print(f"te-offload-shim run: {' '.join(python)} {why}; the command runs without the shim", file=sys.stderr)


def _status(args: argparse.Namespace) -> int:
    report = health.collect(do_import=args.do_import)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=False))
    else:
        health.print_report(report, show_all=args.all)
    if not report["healthy"]:
        print(f"te-offload-shim: unhealthy: {report['problems'][0]}", file=sys.stderr)
        return 1
    if args.strict and report["strict_failures"]:
        print(f"te-offload-shim: --strict: {'; '.join(report['strict_failures'])}", file=sys.stderr)
        return 1
    return 0


def _stats(args: argparse.Namespace) -> int:
    """Sum the stats files of a job's processes (TE_OFFLOAD_SHIM_STATS): every count added up, and
    each file's rank listed (None where its process never knew one). Whatever a file holds that no
    stats file does (not JSON, not numbers in objects, nesting deeper than Python's recursion limit),
    or a file that cannot be read (a folder), is said in one line, exit 2."""
    documents, ranks = [], []
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as file:
                document = json.load(file)
            if not isinstance(document, dict):
                raise ValueError(f"a JSON {_json_type(document)}, not the object a stats file holds")
            rank = document.pop("rank", None)
            document.pop("audit", None)  # one process's report: no sum
            _check(document, "")
        except Exception as exc:  # whatever the file holds: one line, never a traceback
            print(f"te-offload-shim stats: cannot read {path}: {_why(exc)}", file=sys.stderr)
            return 2
        documents.append(document)
        ranks.append(rank if isinstance(rank, str) else None)
    try:
        text = json.dumps({"processes": len(documents), "ranks": ranks, **_summed(documents, "")}, indent=2)
    except Exception as exc:
        print(f"te-offload-shim stats: cannot sum these files: {_why(exc)}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _check(value: Any, where: str) -> None:
    """A stats file holds numbers (or null) in objects, key by key: anything else is no stats file's."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _check(inner, f"{where}.{key}" if where else key)
    elif value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{where} is a JSON {_json_type(value)}, not a number")


def _summed(values: list[Any], where: str) -> Any:
    """Numbers added, objects key by key (a key missing from a file counts nothing there)."""
    present = [v for v in values if v is not None]
    objects = [v for v in present if isinstance(v, dict)]
    if objects and len(objects) < len(present):
        raise ValueError(f"{where} is an object in one file and a number in another")
    if objects:
        keys = dict.fromkeys(k for d in objects for k in d)
        return {k: _summed([d.get(k) for d in objects], f"{where}.{k}" if where else k) for k in keys}
    return sum(present) if present else None


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def _why(exc: Exception) -> str:
    """`exc` in one line."""
    if isinstance(exc, RecursionError):
        return "nested deeper than Python's recursion limit (no stats file is)"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _selftest(args: argparse.Namespace) -> int:
    from te_offload_shim.selftest import command

    return command.main(mib=args.mib, hidden=args.hidden, recipe=args.recipe, as_json=args.json)


def _startup_file(args: argparse.Namespace) -> int:
    print(pth.STARTUP_FILE)
    return 0


def _discover(args: argparse.Namespace) -> int:
    """`discover` left the package in 0.7.0: one line saying where it went, exit 2, whatever followed."""
    print(f"te-offload-shim discover: {_COMMANDS['discover']}", file=sys.stderr)
    return 2


_COMMANDS = {
    "enable": "write te_offload_shim.pth into site-packages: every start of this interpreter activates the shim",
    "disable": "remove te_offload_shim.pth",
    "run": "run CMD with the shim active in it and in every Python process below it (PYTHONPATH bootstrap)",
    "status": "versions, targets, activation routes; exit 1 when unhealthy (--strict: also when not in force here)",
    "stats": "sum the TE_OFFLOAD_SHIM_STATS files of a job's processes (JSON)",
    "discover": "gone since 0.7.0: the flush net names at run time each offload no entry knows (its log line, "
    "`status`'s net row: callers); the source scanner is scripts/discover.py in the shim's repository",
    "startup-file": "print the path of the PYTHONSTARTUP file (interactive sessions only)",
    "selftest": "on this node's GPU: TE layers' FP8 caches offloaded and flushed with the clearing off, then on; "
    "what came back to the driver; exit 0 handed back, 1 not, 2 cannot run here (no GPU, no TE, no FP8)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="te-offload-shim", description="Activate te_offload_shim in every Python process, and check it."
    )
    parser.add_argument("-V", "--version", action="version", version=f"te-offload-shim {version_text()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, func: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=_COMMANDS[name], description=_COMMANDS[name])
        p.set_defaults(func=func)
        return p

    for name, act in (("enable", pth.enable), ("disable", pth.disable)):
        command(name, functools.partial(_site_command, name, act)).add_argument(
            "--site", metavar="DIR", help="this directory instead of the interpreter's site-packages"
        )
    command("run", _run).add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p = command("status", _status)
    p.add_argument("--json", action="store_true", help="machine-readable output (every target)")
    p.add_argument("--all", action="store_true", help="list every target, not only those present here")
    p.add_argument(
        "--import", dest="do_import", action="store_true", help="import the targets here and report what got patched"
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="a gate: exit 1, saying why, when no activation route is in force, a warning stands, or a target "
        "importable here cannot be patched",
    )
    p = command("stats", _stats)
    p.add_argument("files", nargs="+", metavar="FILE", help="the JSON files TE_OFFLOAD_SHIM_STATS wrote")
    # no option is known to `discover` (prefix "+", no --help): every old command line, `--json` and
    # `--help` included, gets the line that says where it went
    p = sub.add_parser("discover", help=_COMMANDS["discover"], prefix_chars="+", add_help=False)
    p.add_argument("old", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=_discover)
    command("startup-file", _startup_file)
    p = command("selftest", _selftest)
    p.add_argument("--mib", type=float, default=1024.0, help="FP8 cache bytes to build, in MiB (default 1024)")
    p.add_argument(
        "--hidden",
        type=int,
        default=4096,
        help="each TE Linear layer's width (default 4096: each cache in blocks of its own)",
    )
    p.add_argument(
        "--recipe",
        choices=["auto", "delayed", "current", "mxfp8"],
        default="auto",
        help="FP8 recipe (auto: MXFP8 where TE supports it on this GPU, else delayed scaling)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def version_text() -> str:
    """`0.8.0.dev0`, with the commit when the package runs from a git checkout (`(commit abc1234)`)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, ".git")):
        return __version__
    try:
        command = ["git", "-C", root, "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__} (commit {commit})" if commit else __version__


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with _any_path_printable():
        try:
            code = int(args.func(args))
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            # `status --all | head -3`: the reader has what it wanted. Quiet, exit 0, as pip does; stdout
            # pointed at /dev/null so that the interpreter's own flush at exit does not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0


@contextlib.contextmanager
def _any_path_printable() -> Iterator[None]:
    """Print what cannot be encoded escaped (`\\udcff`), for as long as the command runs.

    A POSIX path is bytes: one that is not UTF-8 (a folder made on another system, a name a script
    built) reaches Python as lone surrogates, which a strict UTF-8 stdout (a UTF-8 locale,
    `PYTHONIOENCODING=utf-8`) refuses: `enable` would succeed, then exit 1 with a traceback while
    saying so. Python's own stderr escapes them in this way already."""
    changed: list[Any] = []
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            with contextlib.suppress(Exception):  # a text stream that cannot change: as it was
                stream.reconfigure(errors="backslashreplace")
                changed.append(stream)
    try:
        yield
    finally:
        for stream in changed:  # the caller's streams as they were (main() may run in its process)
            with contextlib.suppress(Exception):
                stream.reconfigure(errors="strict")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
