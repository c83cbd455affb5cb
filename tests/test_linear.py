"""The blocked CPU linear equals F.linear for every row count and odd sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.linear import Linear


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 33])
@pytest.mark.parametrize("out_features", [32, 45, 97])
@pytest.mark.parametrize("bias", [False, True])
def test_blocked_linear_matches_f_linear(rows: int, out_features: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows * out_features)
    w = torch.randn(out_features, 24, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    x = torch.randn(rows, 24, generator=g)
    layer = Linear(w, b)
    torch.testing.assert_close(layer(x), F.linear(x, w, b), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer(x.view(1, rows, 24)), F.linear(x, w, b).view(1, rows, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer.dense_weight, w)
