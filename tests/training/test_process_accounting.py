"""What a run on several processes counts and reports: the loss of the whole global batch (not process 0's alone),
the captions trained on (not the repeats that even out an epoch's last micro-batches), and a resume on another
number of processes refused. Checked with a stand-in accelerator; `test_training.py` launches two real processes."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from itune_hf.training.checkpoints import TrainingState
from itune_hf.training.loop import _captions_trained, _same_processes, _update


class TwoProcesses:
    """An accelerator of two processes whose other process's loss is `other`."""

    num_processes, sync_gradients = 2, True

    def __init__(self, other: float) -> None:
        self.other = other

    def accumulate(self, model):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, parameters, max_norm):
        return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)

    def reduce(self, tensor, reduction):
        assert reduction == "mean"
        return (tensor + self.other) / 2


def test_the_logged_loss_is_the_mean_over_the_processes():
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step_was_skipped = False
    config = SimpleNamespace(max_grad_norm=1.0)
    logged = _update(config, TwoProcesses(other=5.0), model, optimizer, lambda: model.weight.sum() * 3.0, None)
    assert logged == pytest.approx(4.0)  # (3 + 5) / 2: it was 3, this process's alone


def test_captions_trained_leave_out_the_repeats_that_even_out_the_last_micro_batches():
    loader = SimpleNamespace(dataset=list(range(185)))  # 185 pairs, 32 per process: 64, 64, then 57 real
    config, accelerator = SimpleNamespace(batch_size=32), TwoProcesses(other=0.0)
    batch = {"labels": torch.zeros(32, 5)}  # every process's last micro-batch is full: repeats fill it
    assert [_captions_trained(config, accelerator, loader, batch, i) for i in range(3)] == [64, 64, 57]
    stream = SimpleNamespace()  # a stream counts what it read
    assert _captions_trained(config, accelerator, stream, batch, 2) == 64


def test_a_resume_on_another_number_of_processes_is_refused():
    _same_processes(TrainingState(processes=2), TwoProcesses(other=0.0), "out/checkpoints/step-4")
    _same_processes(TrainingState(processes=None), SimpleNamespace(num_processes=1), "old")  # not recorded: passes
    with pytest.raises(ValueError, match=r"saved by a run on 2 process\(es\), this one has 1: the global batch"):
        _same_processes(TrainingState(processes=2), SimpleNamespace(num_processes=1), "out/checkpoints/step-4")
