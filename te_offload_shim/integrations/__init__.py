"""The frameworks: the table of entry points to patch (targets, data only) and the rules its
entries name (rules), the user's targets read at install (user_targets), when upstream fixed itself
(versions), Megatron's DDP buffers (megatron), Ray's workers and actor copies (ray), and
the search for offload functions the table lacks (discover).
"""

from te_offload_shim.engine import attributes
from te_offload_shim.integrations.megatron import CUDA_GRAPHS

# Told here, where the package loads: nothing of integrations/ (the table's patches, the flush net,
# Ray's actor copies) runs before it, so no wrapped offload and no flush clears without the marks.
attributes.know_cuda_graphs(CUDA_GRAPHS)
