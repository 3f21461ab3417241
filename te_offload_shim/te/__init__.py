"""Transformer Engine knowledge: where each release keeps its cached quantized weights (caches), and
how many bytes a quantized tensor holds (sizes). Works on the objects given; never imports TE.
"""
