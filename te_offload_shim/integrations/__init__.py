"""The frameworks: the table of entry points to patch (targets, data only) and the rules its
entries name (rules), the user's targets read at install (user_targets), when upstream fixed itself
(versions), Megatron's DDP buffers (megatron), and Ray's workers and actor copies (ray). Offload
functions the table lacks are named at run time by the flush net (flush); reading source for them is
a contributor's script, scripts/discover.py in the repository.
"""

from te_offload_shim.engine import attributes
from te_offload_shim.integrations.megatron import CUDA_GRAPHS

# Told here, where the package loads: nothing of integrations/ (the table's patches, the flush net,
# Ray's actor copies) runs before it, so no wrapped offload and no flush clears without the marks.
attributes.know_cuda_graphs(CUDA_GRAPHS)
