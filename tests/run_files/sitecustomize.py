"""A user's own sitecustomize (tests/activation/test_cli_run.py copies it into a user folder on PYTHONPATH): the
bootstrap shadows it and must still run it, once per interpreter."""

import builtins

builtins.USER_SITECUSTOMIZE = getattr(builtins, "USER_SITECUSTOMIZE", 0) + 1  # type: ignore[attr-defined]
