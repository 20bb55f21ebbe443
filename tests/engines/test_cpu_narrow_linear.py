"""The CPU engine's linear layers over a few rows (gpu_worker.engines.cpu ``_narrow_linear``): the same product as
``torch.nn.Linear``, laid out as what reads the logits in place expects. No model is loaded."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.engines.cpu import NARROW_ROWS, _narrow_linear


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1,), (2,), (3, 1), (2, 5), (NARROW_ROWS + 1,)])
def test_a_narrow_linear_computes_what_the_layer_computes(shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 96, bias=bias)
    x = torch.randn(*shape, 48)
    with torch.inference_mode():
        expected = layer(x)
        _narrow_linear(layer)
        got = layer(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_narrow_linears_output_is_contiguous() -> None:
    """xgrammar applies its token bitmask to the logits in place, by their memory: over a transposed view it masked
    other tokens than the grammar's, and the grammar then refused the token its own mask had allowed."""
    layer = torch.nn.Linear(16, 32, bias=False)
    _narrow_linear(layer)
    with torch.inference_mode():
        for rows in (1, 2, 5):
            assert layer(torch.randn(rows, 1, 16)).is_contiguous()
