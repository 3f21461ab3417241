"""What is left on the device and in the process: residue by category (residue), the allocator
and driver numbers (process_memory), and the per-offload audit (audit).
"""
