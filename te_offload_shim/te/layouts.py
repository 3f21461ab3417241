"""Where each Transformer Engine release keeps a layer's cached quantized weights (TE source files
named so they can be checked again):

* TE >= 1.8 (`transformer_engine/pytorch/module/base.py`): `self._fp8_workspaces`, a plain dict
  filled by `get_fp8_workspace()` (1.8 - 1.13), `get_weight_workspace()` (2.0 - 2.14),
  `quantize_weight()` (2.15+). TE rebuilds a missing entry on the next forward, so popping the
  entries is safe. Keys: "weight" (Linear, LayerNormLinear), "fc1_weight",
  "fc2_weight" (LayerNormMLP), "weight0".."weightN-1" (GroupedLinear, 1.9+), "weight" too for a
  GroupedLinear with `single_grouped_weight=True` (2.19+).
* TE before 1.8, 0.x included (`module/base.py` sets `fp8_weight_shapes`): attributes `weight{i}_fp8` and
  `weight{i}_t_fp8`. NOT safe to drop: a later forward with `is_first_microbatch=False`
  re-allocates an uninitialised buffer and uses it unfilled. Left alone, reported as skipped.

The values are quantized tensors whose bytes live in inner tensors, never in the wrapper: counting
them is `sizes`'s job. The clearing (`caches`) and the residue report both read these names.
"""

WORKSPACES = "_fp8_workspaces"
LEGACY_MARKER = "fp8_weight_shapes"
LEGACY_ATTRS = ("weight1_fp8", "weight1_t_fp8", "weight2_fp8", "weight2_t_fp8")
