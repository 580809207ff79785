"""Gradient accumulation as `Trainer` does it: every optimizer step's gradient is the mean of its micro-batches'
gradients, also the epoch's last step, whose accumulation the end of the data cuts short."""

from __future__ import annotations

import pytest
import torch

from itune_hf.training import TrainingConfig, train
from itune_hf.training.data import EpochLength
from itune_hf.training.loop import _accumulation_scale

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")  # runs `itune train` in-process
ADAMW_STEP = torch.optim.AdamW.step


def test_the_scale_makes_each_accumulation_a_mean():
    config = TrainingConfig(output_dir="unused", gradient_accumulation_steps=3)
    epoch = EpochLength(micro_batches=13, steps=5)  # steps of 3, 3, 3, 3 and 1 micro-batches
    assert [_accumulation_scale(config, epoch, b) for b in range(13)] == [1.0] * 12 + [3.0]
    assert _accumulation_scale(TrainingConfig(output_dir="unused"), epoch, 12) == 1.0


def gradients_at_each_step(world, output_dir, monkeypatch, **settings) -> list[torch.Tensor]:
    """The trainable weights' gradient at each optimizer step of a run whose learning rate is 0 (weights fixed)."""
    seen = []

    def recording(self, *args, **kwargs):
        seen.append(torch.cat([p.grad.flatten() for g in self.param_groups for p in g["params"] if p.grad is not None]))
        return ADAMW_STEP(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    config = TrainingConfig(
        output_dir=str(output_dir), data=str(world), preset="itune-tiny-random", batch_size=4, learning_rate=0.0,
        lr_schedule="constant", weight_decay=0.0, max_grad_norm=0.0, eval_split="none", report_to="none",
        mixed_precision="no", num_epochs=1, **settings,
    )  # fmt: skip
    train(config)
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    GradientState._reset_state()
    return seen


def test_the_epochs_short_last_accumulation_is_the_mean_of_its_micro_batches(world, tmp_path, monkeypatch):
    each = gradients_at_each_step(world, tmp_path / "one", monkeypatch, gradient_accumulation_steps=1)
    steps = 5
    short = len(each) % steps
    assert short, f"pick an accumulation that does not divide the epoch's {len(each)} micro-batches"
    accumulated = gradients_at_each_step(world, tmp_path / "five", monkeypatch, gradient_accumulation_steps=steps)
    assert len(accumulated) == -(-len(each) // steps)
    torch.testing.assert_close(accumulated[0], torch.stack(each[:steps]).mean(0))
    torch.testing.assert_close(accumulated[-1], torch.stack(each[-short:]).mean(0))  # was x short / steps
