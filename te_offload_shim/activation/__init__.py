"""How the shim gets into a process: the `.pth` line and the sitecustomize bootstrap used by
`te-offload-shim enable` / `run` (pth, bootstrap/), and the PYTHONSTARTUP file (pythonstartup).
Ray's worker hook lives with the other Ray code, in integrations/ray.py.
"""
