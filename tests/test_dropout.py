"""The text model's dropout: nn.Dropout's distribution from a quarter of the random draws."""

from __future__ import annotations

import torch

from inceptionlab.models.small import UniformMaskDropout


def test_keeps_each_element_with_probability_one_minus_p_and_rescales():
    torch.manual_seed(0)
    dropout = UniformMaskDropout(0.2).train()
    x = torch.ones(64, 250, 16)
    y = dropout(x)
    assert set(torch.unique(y).tolist()) == {0.0, 1.25}
    keep = float((y != 0).double().mean())
    # 256,000 Bernoulli(0.8) draws: the standard error is 0.0008; allow 5 of them.
    assert abs(keep - 0.8) < 0.004
    assert abs(float(y.mean()) - 1.0) < 0.005  # unbiased, as nn.Dropout


def test_masks_are_independent_across_positions_and_calls():
    torch.manual_seed(1)
    dropout = UniformMaskDropout(0.5).train()
    x = torch.ones(4096, 4)  # every column is one int16 field of the same 64-bit draws
    kept = (dropout(x) != 0).double()
    assert all(abs(float(kept[:, c].mean()) - 0.5) < 0.04 for c in range(4))
    # Fields of one draw must not be correlated: the agreement of two columns is ~0.5, not ~1.
    assert abs(float((kept[:, 0] == kept[:, 3]).double().mean()) - 0.5) < 0.04
    assert not torch.equal(dropout(x), dropout(x))


def test_gradient_is_the_mask_and_evaluation_is_the_identity():
    torch.manual_seed(2)
    dropout = UniformMaskDropout(0.3).train()
    x = torch.randn(7, 9, requires_grad=True)  # 63 elements: not a multiple of four fields
    y = dropout(x)
    y.sum().backward()
    assert torch.allclose(x.grad, torch.where(y != 0, 1 / 0.7, 0.0))
    assert torch.equal(dropout.eval()(x), x)
    assert torch.equal(UniformMaskDropout(0.0).train()(x), x)
