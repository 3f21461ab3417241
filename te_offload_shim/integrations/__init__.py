"""The frameworks: the table of entry points to patch (targets, data only) and the rules its
entries name (rules), the user's targets read at install (user_targets), when upstream fixed itself
(versions), Megatron's DDP buffers (megatron), Ray's workers and actor copies (ray), and
the search for offload functions the table lacks (discover).
"""
