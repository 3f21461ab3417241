"""The health model: what `te-offload-shim status` gathers, how it judges it, and how it prints it.

`collect()` builds the report (a JSON-able dict: `status --json` prints it as it is, with its
`schema_version`), `assess()` judges it into problems (unhealthy: `status` exits 1) and warnings,
`strict_failures()` says why `status --strict` fails the gate, `print_report()` writes the human
form. The judging is one list of findings (`_findings`: the whole report's, then each target row's,
then each `.pth` file's), in the order they are printed. The CLI parses and dispatches.

Collecting with `do_import` imports each present target in this process (the package is installed
here, as the CLI imports it), which is what lets `status --import` report what a real process gets.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from te_offload_shim import _switches
from te_offload_shim.activation import pth

PROBLEM = "problem"  # the report is unhealthy: `status` exits 1
WARNING = "warning"  # said, and `status` still exits 0

# --- gathering ---------------------------------------------------------------------------------


def collect(do_import: bool = False) -> dict[str, Any]:
    """Everything `status` reports, and whether it is healthy (with the reasons when not)."""
    import te_offload_shim
    from te_offload_shim.api import all_targets
    from te_offload_shim.integrations import versions
    from te_offload_shim.integrations.user_targets import unknown_switches

    enabled = _switches.enabled()
    targets = all_targets()
    rows = [versions.target_row(t, enabled) for t in targets]
    import_output = _import_targets(rows) if do_import else []
    shim = te_offload_shim.status()
    live = {r["name"]: r for r in shim["targets"]}
    rows = [{**row, **live[row["name"]]} for row in rows]  # what is installed, and status()'s row (states.TargetRow)
    found, namesakes = versions.versions()
    report: dict[str, Any] = {
        "schema_version": 2,  # of `status --json` (docs/api.md); CHANGELOG.md says what each version changed
        "shim": {
            "version": te_offload_shim.__version__,
            "path": os.path.dirname(os.path.abspath(te_offload_shim.__file__)),
            "enabled": enabled,
            "installed_here": shim["installed"],
            "strict": _switches.strict(),
        },
        "python": {"version": found["python"], "executable": sys.executable},
        "versions": found,
        # installed distributions named for a framework that hold none of its modules: not its version
        "namesakes": namesakes,
        "targets": rows,
        "routes": pth.routes(),
        "switches": {name: os.environ[name] for name in _switches.ALL_SWITCHES if name in os.environ},
        # TE_OFFLOAD_SHIM* names that are no switch (misspelt: they do nothing), with the closest switch
        "unknown_switches": [
            {"name": name, "value": os.environ.get(name, ""), "closest": closest}
            for name, closest in unknown_switches([n for n in os.environ if n.startswith(_switches.ENABLE)])
        ],
        "disabled_by": _disabled_by([t.name for t in targets]),
        "user_target_problems": shim["user_target_problems"],
        "hook_errors": shim["hook_errors"],
        "imported": do_import,
        "import_output": import_output,  # what importing the targets printed or warned (--import)
        # TE_OFFLOAD_SHIM_AUDIT: the latest residue report of this process (None until an offload ran here)
        "audit": {"enabled": _switches.audit(), "latest": te_offload_shim.stats()["audit"]},
        "net": shim["net"],  # the flush net (engine/net.py): armed only where TE's PyTorch modules are imported
    }
    report["routes"]["in_force"] = _route_in_force(report["routes"], shim["installed"])
    problems, warnings = assess(report)
    report.update(healthy=not problems, problems=problems, warnings=warnings)
    report["strict_failures"] = strict_failures(report)
    return report


def strict_failures(report: dict[str, Any]) -> list[str]:
    """Why `status --strict` fails: no activation route in force for this interpreter (the CLI's own
    import of the package is no route), any warning. A target present here that would not be patched
    fails it too: only `TE_OFFLOAD_SHIM=0` leaves one so (switched off by `TE_OFFLOAD_SHIM_DISABLE`, or
    fixed upstream, it is meant to be), and that is a warning here."""
    failures = [f"warning: {w}" for w in report["warnings"]]
    in_force = report["routes"]["in_force"]
    if in_force.startswith("none") or in_force == "PYTHONSTARTUP (interactive only)":
        # PYTHONSTARTUP runs in interactive sessions only: `python train.py` would get no shim
        failures.insert(0, "no activation route is in force for this interpreter (te-offload-shim enable, or run)")
    return failures


def _disabled_by(names: list[str]) -> dict[str, list[str]]:
    """Each TE_OFFLOAD_SHIM_DISABLE value and the targets it switches off (a name also switches off
    its `name-*` variants, `_switches.covers`): shown by `status` rather than left to be guessed."""
    return {value: [n for n in names if _switches.covers(value, n)] for value in sorted(_switches.disabled_targets())}


# The routes besides the .pth files: (name, key of report["routes"]), in the order `in force here`
# names them. The Ray hook counts where it ran: this process is a Ray worker.
_ROUTES = (
    ("sitecustomize bootstrap", "sitecustomize_bootstrap"),
    ("VERL_USE_EXTERNAL_MODULES", "verl_external_modules"),
    ("Ray worker setup hook", "ray_worker_setup_hook"),
    ("PYTHONSTARTUP (interactive only)", "pythonstartup"),
)


def _route_in_force(routes: dict[str, Any], installed_here: bool) -> str:
    """The route that activates the shim in processes started like this one."""
    # a .pth file activates the shim in this user's interpreters where this user can read it
    found = [".pth"] if any(entry["readable"] for entry in routes["pth"]) else []
    found += [name for name, key in _ROUTES if routes[key]]
    if found:
        return ", ".join(found)
    return "none: active only where code imports te_offload_shim" + (" (as this process did)" if installed_here else "")


# --- importing the targets (--import) ------------------------------------------------------------


def _import_targets(rows: list[dict[str, Any]]) -> list[str]:
    """Import each present target module, so that the shim patches it in this process; each row's
    `import_error` says how its module's import failed (None: it did not, or the target is absent).

    Returns what the imports printed or warned (megatron and its friends say a lot): held back and
    shown after the report, not ahead of it."""
    import importlib
    import io
    import warnings

    errors: dict[str, str] = {}
    printed: list[str] = []  # each import's own output, then what reached file descriptor 1 itself
    with _descriptor_1_held(printed), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # each warning once per place, as Python shows them
        for row in rows:
            module = row["target"].partition(":")[0]
            if row["present"] and module not in errors:  # a module that failed is not imported again
                this = io.StringIO()  # this import's own output, for the error that cuts it short
                with contextlib.redirect_stdout(this), contextlib.redirect_stderr(this):
                    try:
                        importlib.import_module(module)
                    except Exception as exc:
                        errors[module] = f"{type(exc).__name__}: {exc}"
                    except SystemExit as exc:
                        # Research code that parses sys.argv at import (argparse) exits here: its import
                        # failed, and the others are still to be checked. KeyboardInterrupt stops status.
                        errors[module] = _exit_text(exc, this.getvalue())
                printed.append(this.getvalue())
            row["import_error"] = errors.get(module)
    lines = [line for text in printed for line in text.splitlines() if line.strip()]
    lines += [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
    return list(dict.fromkeys(lines))


def _exit_text(exc: SystemExit, printed: str) -> str:
    """`SystemExit: exit code 2; it printed: usage: ... | train.py: error: ...`: the exit, with the
    last lines the module printed before it (argparse's usage and error)."""
    code = 0 if exc.code is None else exc.code
    text = f"SystemExit: exit code {code}" if isinstance(code, int) else f"SystemExit: {code}"
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    return f"{text}; it printed: {' | '.join(lines[-3:])}" if lines else text


@contextlib.contextmanager
def _descriptor_1_held(sink: list[str]) -> Iterator[None]:
    """Point file descriptor 1 at a scratch file while the targets import, and put what reached it
    into `sink`: a C extension's printf, a subprocess the import runs, a write to fd 1, none of which
    Python's `sys.stdout` sees. `status --json` must print one JSON document and nothing else."""
    _flush_stdout()  # what was written before belongs where it was going
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(_scratch_file())
            saved = os.dup(1)
        except OSError:
            # nowhere to hold it, or no descriptor 1 (closed by the caller: nothing can reach the report
            # either): leave it as it is
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
    with contextlib.suppress(AttributeError, OSError):  # not Linux, an old kernel, or refused by a seccomp profile
        return open(os.memfd_create("te-offload-shim-status"), "w+b")
    import tempfile

    return tempfile.TemporaryFile()  # OSError where there is no usable temporary folder either


def _flush_stdout() -> None:
    for stream in (sys.stdout, sys.__stdout__):
        with contextlib.suppress(Exception):  # None, or a closed or odd stream: its text stays where it is
            stream.flush()  # type: ignore[union-attr]
    with contextlib.suppress(Exception):  # no C library to ask (not Linux or macOS): nothing buffered there to lose
        import ctypes

        ctypes.CDLL(None).fflush(None)  # every C stdio output stream (printf from an extension)


# --- judging -------------------------------------------------------------------------------------


def _findings(report: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """What is wrong with the report, as (PROBLEM or WARNING, what to say), in the order it is listed:
    the whole report's first, then each target row's, then the .pth files'."""
    from te_offload_shim.integrations import versions
    from te_offload_shim.integrations.user_targets import switch_problems, unknown_switch_text

    if not report["shim"]["enabled"]:
        # An operator's choice, not a fault: `status` exits 0 so the same image check passes.
        yield WARNING, f"switched off by {_switches.ENABLE}={os.environ.get(_switches.ENABLE)}: nothing is patched"
    if "*" in _switches.disabled_targets():
        yield WARNING, f"every target is switched off by {_switches.DISABLE}=*: nothing is patched"
    # `TE_OFFLOAD_SHIM=maybe`, `TE_OFFLOAD_SHIM_DISABLE=verll`: the shim goes on as the default says
    yield from ((WARNING, p) for p in switch_problems(tuple(r["name"] for r in report["targets"])))
    for entry in report["unknown_switches"]:
        # A warning, not a problem: the shim itself works as the known switches say; the name does nothing.
        yield WARNING, unknown_switch_text(f"{entry['name']}={entry['value']}", entry["closest"])
    if not versions.wrapt_ok(report["versions"]["wrapt"]):
        yield PROBLEM, f"wrapt {versions.WRAPT_NEEDED} is needed to patch, found {report['versions']['wrapt']}"
    yield from ((PROBLEM, f"{_switches.TARGETS}: {p}") for p in report["user_target_problems"])
    yield from ((PROBLEM, f"patching failed: {e}") for e in report["hook_errors"])
    if report["net"]["state"] == "error":
        yield PROBLEM, f"flush net: error: {report['net']['detail']}"
    for row in report["targets"]:
        name, state = row["name"], row.get("state") or ""
        if state == "error":
            yield PROBLEM, f"{name}: error: {row.get('detail', '')}"
        if state == "absent" and row.get("user") and row.get("imported"):
            module, _, attribute = row["target"].partition(":")
            yield PROBLEM, f"{name}: {module} has no attribute {attribute} (misspelt in {_switches.TARGETS}?)"
        if row.get("layers", 0) > 1:
            yield PROBLEM, f"{name}: {row['layers']} shim wrappers stacked on {row['target']}"
        if row.get("import_error"):
            yield WARNING, f"{name}: import failed: {row['import_error']}"
        if report["imported"] and row["would_be_patched"] and row.get("imported") and state != "patched":
            yield WARNING, f"{name}: expected to be patched, state is {state!r}"
        if row["in_supported"] is False and row["would_be_patched"]:
            yield WARNING, f"{name}: {row['in_supported_basis']}: a release this entry was not checked on"
    for entry in report["routes"]["pth"]:  # each te_offload_shim.pth this interpreter runs (pth.pth_files)
        path, mode = entry["path"], entry["mode"] or "unknown"
        again = "run `te-offload-shim enable` again"  # it writes the file readable by every user
        if not entry["readable"]:  # site.py skips a file it cannot open, without a word
            why = f"{path} is not readable by this user (mode {mode}): this interpreter starts without the shim"
            yield PROBLEM, f"{why}; {again} as the file's owner (it writes the file readable by every user)"
        elif not entry["current"]:
            yield WARNING, f"outdated .pth line (re-run `te-offload-shim enable`): {path}"
        elif entry["mode"] is not None and not int(entry["mode"], 8) & 0o004:
            why = f"{path} is mode {mode}: other users' interpreters skip it and start without the shim"
            yield WARNING, f"{why}; {again} (it writes the file readable by every user)"


def assess(report: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of a report: a problem makes it unhealthy."""
    findings = list(_findings(report))
    return [t for kind, t in findings if kind == PROBLEM], [t for kind, t in findings if kind == WARNING]


# --- printing ------------------------------------------------------------------------------------

_IMPORT_LINES = 20


def _yes(value: object) -> str:
    return {True: "yes", False: "no", None: "unknown"}.get(value, str(value))  # type: ignore[call-overload]


def _supported(row: dict[str, Any]) -> str:
    """`yes (>=0.4.0)`: whether the installed release is one the entry declares, and the declaration."""
    if not row["present"] or not row["distribution"]:  # a TE_OFFLOAD_SHIM_TARGETS entry declares no releases
        return "-"
    return f"{_yes(row['in_supported'])} ({row['supported'] or 'no release'})"


def _fixed(row: dict[str, Any]) -> str:
    answer = _yes(row["fixed_upstream"])
    return f"{answer} (from {row['fixed_in']})" if row["fixed_in"] and row["present"] else answer


def _print_shim(report: dict[str, Any]) -> None:
    shim = report["shim"]
    print(f"te-offload-shim {shim['version']} ({shim['path']})")
    # `enabled` is the switch, not the state: where the shim acts is `in force here` below
    on = "on" if shim["enabled"] else "off: the shim does nothing in any process"
    print(f"  switch {_switches.ENABLE}: {on}   strict: {_yes(shim['strict'])}")
    print(f"  python {report['python']['version']} ({report['python']['executable']})")
    print("versions:")
    for name, value in report["versions"].items():
        other = ", ".join(report["namesakes"].get(name, ()))
        note = f" ({other} installed is another package: it holds none of {name}'s modules)" if other else ""
        if name != "python":
            print(f"  {name:<20} {value or '-'}{note}")


def _print_targets(report: dict[str, Any], show_all: bool) -> None:
    header = ["target", "present", "version", "supported", "fixed upstream", "would be patched", "disabled"]
    if report["imported"]:
        header += ["state", "shim wrappers"]  # `layers` in JSON: our wrappers on the attribute, 1 when patched
    # What is here (and what would be patched) first: the targets present here and those the switches
    # name (TE_OFFLOAD_SHIM_TARGETS, TE_OFFLOAD_SHIM_DISABLE); the many targets of frameworks this
    # environment does not have after them (--all), else one summary line (every row: --all, or --json).
    here = [r for r in report["targets"] if r["present"] or r.get("user") or r["disabled"]]
    elsewhere = [r for r in report["targets"] if r not in here]
    table = [header]
    for row in here + elsewhere if show_all else here:
        cells = [row["name"], _yes(row["present"]), row["version"] or "-", _supported(row)]
        cells += [_fixed(row), _yes(row["would_be_patched"]), _yes(row["disabled"])]
        table.append(cells + ([str(row["state"]), str(row["layers"])] if report["imported"] else []))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    if elsewhere and not show_all:  # a row of its own, aligned with the table's first two columns
        names = ", ".join(row["name"] for row in elsewhere)
        table.append(["others", "no", f"{len(elsewhere)} targets: {names} (every row: --all)"])
    print("targets:")
    for cells in table:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip())


def _print_routes(report: dict[str, Any]) -> None:
    routes = report["routes"]
    label = {True: "", False: " (outdated)", None: " (not readable by this user)"}
    files = ", ".join(p["path"] + label[p["current"]] for p in routes["pth"])
    fields = [(".pth", files or "no"), *((name, _yes(routes[key])) for name, key in _ROUTES)]
    fields += [("ray.init setup hook", routes["ray_init_propagation"])]
    fields += [("switches", ", ".join(f"{k}={v}" for k, v in report["switches"].items()) or "none set")]
    # a name that is no switch is said once, among the warnings (with the closest switch), not here too
    for value, names in report["disabled_by"].items():
        variants = " (its name-* variants included)" if len(names) > 1 and value != "*" else ""
        fields.append((f"{_switches.DISABLE}={value} switches off", f"{', '.join(names) or 'no target'}{variants}"))
    fields.append(("in force here", routes["in_force"]))
    print("activation routes:")
    for name, value in fields:
        print(f"  {name + ':':<33} {value}")


def _net_line(net: dict[str, Any], installed: bool) -> str:
    """The flush net in one line: its state and why, and what it has cleared in this process."""
    if net["state"] == "not armed" and installed and net["detail"].startswith("Transformer Engine"):
        return "on: arms in a process that imports Transformer Engine's PyTorch modules (none here)"
    line = f"{net['state']}: {net['detail']}"
    if net["state"] == "armed" or net["flushes"]:
        from te_offload_shim._log import human_bytes

        line += (
            f"; {net['flushes']} flushes seen, {net['cleared_flushes']} cleared {net['entries']} caches in "
            f"{net['layers']} layers ({human_bytes(net['bytes'])}); {net['live_layers']} TE layers known"
        )
        if net.get("primary_weight_cleared"):
            line += f"; FP8 primary weights' transposes dropped ({human_bytes(net['primary_weight_cleared'])})"
        if net["callers"]:
            line += f"; called from {', '.join(net['callers'])}"
        if net.get("undecided"):
            line += (
                f"; {net['undecided']} TE layers left undecided (an own weight empty on the device, as a reshard "
                f"or an offload that marks nothing leaves it): {', '.join(net['undecided_layers'])}"
            )
    if net.get("frozen_not_searched"):
        line += (
            f"; {net['frozen_not_searched']} objects frozen by gc.freeze() not searched (layers among them "
            "may keep their caches: import the shim at start-up)"
        )
    return line


def print_report(report: dict[str, Any], show_all: bool = False) -> None:
    """The human form of `collect()`'s report; every target row with `show_all`."""
    _print_shim(report)
    _print_targets(report, show_all)
    _print_routes(report)
    print(f"flush net: {_net_line(report['net'], report['shim']['installed_here'])}")
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
