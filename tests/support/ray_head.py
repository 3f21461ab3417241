"""A Ray head node for tests/integrations/test_ray.py: `ray.init()` on loopback, prints the GCS address and keeps
the cluster up until its stdin closes. Run by path, in a process whose environment is scrubbed."""

from __future__ import annotations

import sys

import ray


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()
    ray.shutdown()


if __name__ == "__main__":
    main()
