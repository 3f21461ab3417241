"""PYTHONSTARTUP file: `export PYTHONSTARTUP=$(te-offload-shim startup-file)`.

Python runs it only for interactive sessions (the REPL; IPython and Jupyter kernels too, unless
`InteractiveShellApp.exec_PYTHONSTARTUP` is off). It does nothing for `python script.py`, `-c`,
Ray workers or torchrun ranks: use `te-offload-shim enable` or `run` for those.
It runs in the session's namespace, so it leaves no names behind (`__import__` binds none).
"""

try:
    __import__("te_offload_shim")  # importing installs it (unless TE_OFFLOAD_SHIM=0)
except Exception:  # a startup file must never spoil the session
    pass
