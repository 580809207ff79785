"""Time budgets (`itune_hf.training.budget`): the steps that fit, unpaused time only, the run's length fitted to its
own timed steps (its learning-rate schedule stretched to match), and the share of `itune demo`'s budget left for
training once evaluation is reserved."""

from __future__ import annotations

import pytest
import torch

from itune_hf.commands.demo import EvaluationCost, training_seconds
from itune_hf.training import TimeBudget, TrainingConfig, steps_within_budget
from itune_hf.training.accelerator import make_scheduler, stretch_scheduler
from itune_hf.training.budget import WARM_STEPS


def test_steps_within_budget():
    assert steps_within_budget(100.0, 2.0, 200) == 50
    assert steps_within_budget(100.0, 2.0, 30) == 30  # never more than asked for
    assert steps_within_budget(1.0, 2.0, 30) == 1  # at least one step
    assert steps_within_budget(100.0, 0.0, 30) == 30


def test_time_budget_counts_only_unpaused_time(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("itune_hf.training.budget.time.perf_counter", lambda: now[0])
    budget = TimeBudget(10.0)
    now[0] = 11.0
    assert not budget.overrun()  # within the 20% tolerance
    with budget.paused():
        now[0] = 100.0  # validation: not counted
    assert not budget.overrun()
    now[0] = 101.5
    assert budget.overrun()
    assert not TimeBudget(None).overrun()


def test_time_budget_fits_the_run_to_its_own_timed_steps(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("itune_hf.training.budget.time.perf_counter", lambda: now[0])
    budget = TimeBudget(100.0, resize_at=10, max_steps=1000)
    lengths = []
    for step in range(1, 11):
        now[0] += 5.0 if step <= WARM_STEPS else 2.0  # the first steps are slow; the rest take 2 s
        with budget.paused():
            now[0] += 50.0  # validation: not counted
        lengths.append(budget.fitted_length(step))
    assert lengths[:-1] == [None] * 9
    # 10 + 26 + 16 = 26 s spent at step 10, 74 s left at 2 s a step: 37 more
    assert lengths[-1] == 47 and budget.measured == pytest.approx(2.0)
    assert budget.fitted_length(11) is None  # once only
    assert TimeBudget(100.0, resize_at=10, max_steps=20).fitted_length(10) is None  # its warm-up was not timed


def test_time_budget_fitting_keeps_to_max_steps_and_ends_a_run_over_its_budget(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("itune_hf.training.budget.time.perf_counter", lambda: now[0])
    quick, slow = TimeBudget(100.0, resize_at=4, max_steps=20), TimeBudget(10.0, resize_at=4, max_steps=20)
    for step in range(1, 5):
        now[0] += 4.0
        fitted = quick.fitted_length(step), slow.fitted_length(step)
    assert fitted == (20, 4)  # never past max_steps; 16 s of a 10 s budget spent: the run ends at this step
    assert TimeBudget(None, resize_at=4, max_steps=20).fitted_length(4) is None
    assert TimeBudget(100.0, resize_at=None, max_steps=20).fitted_length(4) is None  # a resumed run keeps its length


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_a_stretched_schedule_continues_as_one_planned_with_that_length(schedule):
    config = TrainingConfig(output_dir="x", warmup_steps=10, lr_schedule=schedule, learning_rate=1e-3)

    def rates(scheduler, steps):
        out = []
        for _ in range(steps):
            scheduler.optimizer.step()
            scheduler.step()
            out.append(scheduler.get_last_lr()[0])
        return out

    def optimizer():
        return torch.optim.AdamW([torch.zeros(2, requires_grad=True)], lr=config.learning_rate)

    planned = make_scheduler(config, optimizer(), 40)
    stretched = make_scheduler(config, optimizer(), 200)
    assert rates(stretched, 10) == rates(planned, 10)  # the warm-up does not depend on the length
    stretch_scheduler(stretched, config, 40)
    assert rates(stretched, 30) == pytest.approx(rates(planned, 30))
    assert stretched.optimizer.param_groups[0]["lr"] == pytest.approx(planned.optimizer.param_groups[0]["lr"])


def test_demo_reserves_evaluation_time_before_sizing_training():
    cost = EvaluationCost(load=5.0, greedy_per_image=0.1, beam_per_image=0.3)
    # 540 - 100 spent - (2 x 5 load + 100 x 0.1 greedy + 2 x 100 x 0.3 beam) = 360, 90% of it for training
    assert training_seconds(540.0, 100.0, cost, val_images=100, test_images=100) == pytest.approx(324.0)
    assert training_seconds(540.0, 500.0, cost, val_images=100, test_images=100) == 0.0
    slower = EvaluationCost(load=5.0, greedy_per_image=0.2, beam_per_image=0.6)
    assert training_seconds(540.0, 100.0, slower, val_images=100, test_images=100) < 324.0
