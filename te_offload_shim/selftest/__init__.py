"""`te-offload-shim selftest`: the command (command.py) and its measuring processes (measure.py,
run as `python -m te_offload_shim.selftest`). A tool: no training process imports it."""
