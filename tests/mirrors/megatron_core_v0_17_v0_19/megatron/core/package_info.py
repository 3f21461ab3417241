"""megatron/core/package_info.py of the chosen tag: `__version__` as each tag's own file builds it.

NVIDIA/Megatron-LM core_v0.17.0 (9539a12e) says MAJOR 0, MINOR 17, PATCH 0, PRE_RELEASE 'rc0':
"0.17.0rc0". core_v0.18.0 (ba7b5ebc): "0.18.0". core_v0.19.0 (5be96267): PATCH 1, "0.19.1". (0.18 on
append a VCS suffix unless NO_VCS_VERSION=1; the mirror leaves it out.)
"""

import os

_BY_TAG = {"0.17.0": "0.17.0rc0", "0.18.0": "0.18.0", "0.19.0": "0.19.1"}
TAG = os.environ.get("MEGATRON_CORE_MIRROR_RELEASE", "0.19.0")
__version__ = _BY_TAG[TAG]
