"""A user's own Ray `worker_process_setup_hook` that does not chain ours (tests/integrations/test_ray.py)."""

from __future__ import annotations

import os


def setup() -> None:
    os.environ["USER_HOOK_RAN"] = "1"
