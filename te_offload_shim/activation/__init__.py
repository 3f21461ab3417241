"""How the shim gets into a process: the `.pth` line and the sitecustomize bootstrap used by
`te-offload-shim enable` / `run` (pth, bootstrap/), and the PYTHONSTARTUP file (pythonstartup).
The setup hook the shim gives Ray workers (ray_worker) is shipped to them by value; when to add it,
and the rest of Ray, is integrations/ray.py and ray_runtime_env.py.
"""
