"""TE's modules on Megatron-shaped activations: 3-D [sequence, batch, hidden] inputs, in a twin
process per release (tests/twin/conftest.py).

The twin's module tests feed 2-D [tokens, hidden] inputs; Megatron feeds [s, b, h]. The weight
gradient GEMM then reads the input's column-wise copy only, whose buffer TE's C++ allocates as
[h, s, b]; its logical shape is that rotated back (common.h `Tensor::shape()`), not what the
Python storage class of TE < 2.1x reports for it (`[b, h*s]`). The whole stack
(tests/twin/test_twin_stack.py) runs this path; this is its kernel-level check."""

from __future__ import annotations

import pytest

from harness.te_twin.cells import need

pytestmark = pytest.mark.twin


@pytest.mark.parametrize("recipe", ["DelayedScaling", "Float8CurrentScaling"])
@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear"])
def test_a_3d_input_trains_as_its_2d_flattening(release: str, module: str, recipe: str) -> None:
    """Forward and backward of one FP8 step on x [16, 2, 64] give the bit-identical output, input
    gradient and weight gradient of the same step on x.reshape(32, 64)."""
    need(release, recipe, module)
    import torch

    from harness import te_twin
    from harness.te_twin import training

    x = torch.randn(16, 2, 64, generator=torch.Generator().manual_seed(3))
    results = []
    for shaped in (x, x.reshape(32, 64)):
        torch.manual_seed(0)
        layer = getattr(training.te(), module)(64, 32, params_dtype=torch.float32)
        inp = shaped.clone().requires_grad_(True)
        with te_twin.autocast(training.make_recipe(recipe)):
            y = layer(inp, is_first_microbatch=True)
        (y.float() ** 2).sum().backward()
        assert inp.grad is not None and layer.weight.grad is not None
        results.append((y.reshape(32, 32), inp.grad.reshape(32, 64), layer.weight.grad))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
