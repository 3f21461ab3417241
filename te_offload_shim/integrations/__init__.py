"""The frameworks: the table of entry points to patch (targets), when upstream fixed itself
(versions), Megatron's DDP buffers and CUDA-graph switches (megatron), Ray's workers and actor
copies (ray), and the search for offload functions the table lacks (discover).
"""
