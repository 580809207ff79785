"""TIFG's loss is XGPT's eq. 5: (1/N) sum_i ||x_i - x̄_i||_2^2, summed over the dimensions, averaged over real
regions (padding regions left out)."""

from __future__ import annotations

import pytest
import torch

from itune_hf.training.pretraining import tifg_loss


def test_tifg_loss_is_eq_5_on_a_hand_computed_example():
    target = torch.tensor([[[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [9.0, 9.0, 9.0]]])
    generated = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0]])  # the third region is padding
    # region 1: 1 + 4 + 0 = 5; region 2: 1 + 1 + 1 = 3; (5 + 3) / 2 real regions = 4
    assert tifg_loss(generated, target, mask).item() == pytest.approx(4.0)


def test_tifg_loss_averages_over_the_regions_of_the_whole_batch_and_sums_the_dimensions():
    generator = torch.Generator().manual_seed(0)
    generated, target = torch.randn(2, 4, 6, generator=generator), torch.randn(2, 4, 6, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    per_region = [((generated[b, n] - target[b, n]) ** 2).sum() for b in range(2) for n in range(4) if mask[b, n]]
    expected = sum(per_region) / len(per_region)
    assert tifg_loss(generated, target, mask).item() == pytest.approx(expected.item(), rel=1e-6)
    # widening the features (same per-dimension error) widens the loss: a sum over dimensions, not a mean
    doubled = tifg_loss(torch.cat([generated, generated], -1), torch.cat([target, target], -1), mask)
    assert doubled.item() == pytest.approx(2 * expected.item(), rel=1e-6)
