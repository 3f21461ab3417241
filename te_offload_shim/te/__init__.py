"""Transformer Engine knowledge, and no framework's: where each release keeps its cached quantized
weights (layouts), which chunks a call holds (chunks), one walk over a chunk (walk), whether it is
CUDA-graphed (graphs: TE's marks, and a framework's handed down as `GraphMarks`), FP8 primary
weights (primary), how many bytes a quantized tensor holds (sizes), the clearing itself (caches,
reporting with report), and TE's re-creatable process globals given back on request
(process_globals). Works on the objects given; never imports TE, reads no switch.
"""
