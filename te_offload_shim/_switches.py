"""Environment switches, read in one place.

Read at call time rather than import time: `TE_OFFLOAD_SHIM=0` or `TE_OFFLOAD_SHIM_DISABLE` set in
a running process leaves the next offload alone, and `TE_OFFLOAD_SHIM_STRICT` takes effect at the
next call. `TE_OFFLOAD_SHIM=0` at start-up also keeps the shim from installing at all.
`TE_OFFLOAD_SHIM_TARGETS` is read once, when the shim installs (integrations/user_targets.py).
Only the reading is here: what is wrong with the switches as set (a value that is no 1/0, a name that
is no switch) is worded by integrations/user_targets.py, at install when `understood` says so and in
`te-offload-shim status`.

The package's ground floor: it reads environment variables and imports nothing else, so that every
module may read a switch (and `import te_offload_shim` can load it at start-up when one is set).
"""

import os
import sys

_FALSE = {"0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on"}

ENABLE = "TE_OFFLOAD_SHIM"
STRICT = "TE_OFFLOAD_SHIM_STRICT"
DISABLE = "TE_OFFLOAD_SHIM_DISABLE"
TARGETS = "TE_OFFLOAD_SHIM_TARGETS"
FORCE_CUDA_GRAPHS = "TE_OFFLOAD_SHIM_FORCE_CUDA_GRAPHS"
AUDIT = "TE_OFFLOAD_SHIM_AUDIT"
NET = "TE_OFFLOAD_SHIM_NET"  # the flush net
TE_GLOBALS = "TE_OFFLOAD_SHIM_TE_GLOBALS"
LOG = "TE_OFFLOAD_SHIM_LOG"  # warning|info|debug: the shim's own log level (and stderr handler)
STATS = "TE_OFFLOAD_SHIM_STATS"  # a path ({rank}, {pid}): stats() as JSON after each clearing and at exit
# Every switch the package reads, and the one list of them: what `status` shows, and what each
# TE_OFFLOAD_SHIM* name set in the environment is checked against (a name not here does nothing, and
# is warned about: `TE_OFFLOAD_SHIM_DISABLED=verl` would otherwise leave verl patched in silence).
ALL_SWITCHES = (
    ENABLE,
    STRICT,
    DISABLE,
    TARGETS,
    FORCE_CUDA_GRAPHS,
    AUDIT,
    NET,
    TE_GLOBALS,
    LOG,
    STATS,
)
# The on/off switches, with what each stays at when unset or set to a value that is no 1/0.
FLAGS = {ENABLE: True, STRICT: False, FORCE_CUDA_GRAPHS: False, TE_GLOBALS: False, NET: True}
LOG_LEVELS = {"warning": 30, "info": 20, "debug": 10}
# The values of the switches that read a closed set of them (empty: as unset); the others take any text
# (a path, a device type, target names). Any other value is worded by integrations/user_targets.py.
VALUES = {**dict.fromkeys(FLAGS, frozenset({"", *_TRUE, *_FALSE})), LOG: frozenset({"", *LOG_LEVELS})}
# Where launchers put the process's global rank: torchrun (and Ray's verl workers), then Slurm's
# srun, Open MPI's mpirun, MPICH/Intel MPI's PMI.
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    return True if value in _TRUE else False if value in _FALSE else FLAGS[name]


def enabled() -> bool:
    """False when TE_OFFLOAD_SHIM=0: the whole package becomes a no-op."""
    return _flag(ENABLE)


def strict() -> bool:
    """True when TE_OFFLOAD_SHIM_STRICT=1: the shim's own errors raise instead of warning."""
    return _flag(STRICT)


def net() -> bool:
    """False when TE_OFFLOAD_SHIM_NET=0: the flush net leaves every allocator flush alone (the table
    of targets still works)."""
    return _flag(NET)


def force_with_cuda_graphs() -> bool:
    """True when the user states their CUDA graphs are re-captured after an offload."""
    return _flag(FORCE_CUDA_GRAPHS)


def te_globals() -> bool:
    """True when TE_OFFLOAD_SHIM_TE_GLOBALS=1: an offload also gives back TE's re-creatable process
    globals (te/process_globals.py says which, and when never)."""
    return _flag(TE_GLOBALS)


def audit() -> bool:
    """True when TE_OFFLOAD_SHIM_AUDIT is on (1/true/yes/on, or a device type): after each wrapped
    offload, report what is still on the device."""
    value = os.environ.get(AUDIT, "").strip().lower()
    return bool(value) and value not in _FALSE


def audit_device_type() -> str | None:
    """The device type the audit counts: None (any device but the CPU) for 1/true/yes/on, else the
    value itself (`cuda`, or `cpu` to see the audit work on a machine without an accelerator)."""
    value = os.environ.get(AUDIT, "").strip().lower()
    return None if value in _TRUE or value in _FALSE or not value else value


def disabled_targets() -> frozenset[str]:
    """Target names switched off by TE_OFFLOAD_SHIM_DISABLE (`*` switches off every target)."""
    raw = os.environ.get(DISABLE, "")
    if not raw.isascii():  # names as TE_OFFLOAD_SHIM_TARGETS reads them (NFKC, like Python identifiers)
        import unicodedata

        raw = unicodedata.normalize("NFKC", raw)
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def covers(value: str, name: str) -> bool:
    """Whether the TE_OFFLOAD_SHIM_DISABLE value `value` switches off target `name`: `*` all of
    them, a name itself and its `name-*` variants (`nemo-rl` covers `nemo-rl-0.5` and `nemo-rl-0.3`,
    `roll` covers `roll-train`, `skyrl` covers `skyrl-train`)."""
    return value == "*" or name == value or name.startswith(f"{value}-")


def is_disabled(name: str) -> bool:
    return any(covers(value, name) for value in disabled_targets())


def understood(name: str) -> bool:
    """Whether the `TE_OFFLOAD_SHIM*` variable `name` is a switch, unset or set to a value it reads.
    `install()` asks it of each name set: a name or value it cannot read has integrations/user_targets.py
    load and say what is wrong, which a process setting only good switches never loads."""
    value = os.environ.get(name, "").strip().lower()
    return name in ALL_SWITCHES and (name not in VALUES or value in VALUES[name])


def user_targets() -> str:
    return os.environ.get(TARGETS, "")


def log_level() -> int | None:
    """The level TE_OFFLOAD_SHIM_LOG names (warning, info, debug), else None."""
    return LOG_LEVELS.get(os.environ.get(LOG, "").strip().lower())


def rank() -> str | None:
    """The process's global rank: the first of `RANK_VARIABLES` set, else torch.distributed's when
    it is initialised (read only where torch is imported already), else None (no distributed job)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isascii() and value.isdigit():  # anything else (`abc`, `-1`, `1/2`, `²`) is no rank: the next is asked
            return str(int(value))  # `00` is rank 0
    dist = sys.modules.get("torch.distributed")
    try:
        return str(dist.get_rank()) if dist is not None and dist.is_initialized() else None
    except Exception:  # a torch without distributed support, or one being torn down
        return None
