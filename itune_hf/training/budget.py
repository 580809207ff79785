"""The time budget: a measured step sizes the step count (`--time-budget`), the run fits it again once it has timed
its own first steps, and a running run stops in time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from .config import TrainingConfig


def measure_step_seconds(
    model, batch: dict[str, Any], accelerator, optimizer, repeats: int = 2, loss_of: Callable | None = None
) -> float:
    """Seconds one micro-batch's forward and backward take, measured on `batch` after one warm-up pass.

    Leaves no trace: gradients are cleared and every random generator is restored, so a sized run computes what the
    same run with that step count computes. Under several processes, every rank gets the slowest rank's figure.

    Args:
        model: The prepared model.
        batch: A micro-batch.
        accelerator: The run's `Accelerator`.
        optimizer: Its optimizer (gradients cleared after each pass).
        repeats: Passes timed after the warm-up.
        loss_of: The loss of a batch (default: the model's captioning loss); SCST's samples and scores too.
    """
    from accelerate.utils import send_to_device

    states = _random_states()
    model.train()
    batch = send_to_device(batch, accelerator.device)
    timings = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        accelerator.backward(loss_of(batch) if loss_of is not None else model(**batch).loss)
        timings.append(time.perf_counter() - started)
        optimizer.zero_grad(set_to_none=True)
    _restore_random_states(states)
    slowest = accelerator.gather(torch.tensor([sum(timings[1:]) / repeats], device=accelerator.device)).max()
    return float(slowest)


def steps_within_budget(budget_seconds: float, seconds_per_step: float, max_steps: int) -> int:
    """Optimizer steps that fit `budget_seconds` at `seconds_per_step`: at least 1, at most `max_steps`."""
    if seconds_per_step <= 0:
        return max_steps
    return max(1, min(max_steps, int(budget_seconds // seconds_per_step)))


#: Steps a budgeted run takes before it times its own steps (the first `WARM_STEPS` left out) and fits its length to
#: what they cost. The step measured before the run is taken while memory and caches still warm up, so it costs
#: more than the steps that follow, and a length sized from it alone leaves part of the budget unused.
RESIZE_AFTER, WARM_STEPS = 10, 2


class TimeBudget:
    """The optimizer steps' wall time against `--time-budget` (validation and checkpoints are paused out).

    Args:
        seconds: The budget; None for none.
        tolerance: How far past the budget a run may go before it stops (the sizing already aimed at the budget).
        resize_at: The step at which `fitted_length` re-sizes the run from its own steps' cost (None: never; a
            resumed run keeps its length).
        max_steps: The most steps a re-sized run may take.
    """

    def __init__(
        self, seconds: float | None, tolerance: float = 1.2, *, resize_at: int | None = None, max_steps: int = 0
    ) -> None:
        self.seconds, self.tolerance = seconds, tolerance
        self.resize_at, self.max_steps = resize_at, max_steps
        self.spent, self._since = 0.0, time.perf_counter()
        self._warm: float | None = None  # seconds spent when the warm-up steps were done
        self.measured: float | None = None  # seconds per step, once `fitted_length` has timed them

    def _spent_now(self) -> float:
        return self.spent + time.perf_counter() - self._since

    def fitted_length(self, step: int, accelerator=None) -> int | None:
        """At step `resize_at`, the run's length that fits the budget at the measured cost of steps `WARM_STEPS` + 1
        to `resize_at` (at least `step`: a run already over its budget ends there); None at every other step.
        The main process decides, for every rank alike."""
        if self.seconds is None or self.resize_at is None:
            return None
        if step == WARM_STEPS:
            self._warm = self._spent_now()
        if step != self.resize_at or self._warm is None:
            return None
        spent = self._spent_now()
        per_step = self.measured = (spent - self._warm) / (step - WARM_STEPS)
        more = int((self.seconds - spent) // per_step) if per_step > 0 else self.max_steps
        length = step + max(0, min(self.max_steps - step, more))
        if accelerator is None or accelerator.num_processes == 1:
            return length
        from accelerate.utils import broadcast

        return int(broadcast(torch.tensor([length], device=accelerator.device), from_process=0).item())

    @contextlib.contextmanager
    def paused(self):
        self.spent += time.perf_counter() - self._since
        try:
            yield
        finally:
            self._since = time.perf_counter()

    def overrun(self, accelerator=None) -> bool:
        """True, on every rank alike (the main process decides), once the steps ran `tolerance` x the budget."""
        if self.seconds is None:
            return False
        over = self.spent + time.perf_counter() - self._since > self.tolerance * self.seconds
        if accelerator is None or accelerator.num_processes == 1:
            return over
        from accelerate.utils import broadcast

        return bool(broadcast(torch.tensor([float(over)], device=accelerator.device), from_process=0).item())


def steps_for_budget(
    config: TrainingConfig, model, batch, accelerator, optimizer, max_steps: int, tasks: int = 1, loss_of=None
) -> int:
    """The step count that fits `config.time_budget`, from a step measured on `batch` (printed); a step of `tasks`
    pre-training tasks is taken as `tasks` captioning passes; `loss_of` (a batch's loss) replaces the captioning
    loss (SCST)."""
    seconds = measure_step_seconds(model, batch, accelerator, optimizer, loss_of=loss_of)
    seconds *= config.gradient_accumulation_steps * tasks
    steps = steps_within_budget(config.time_budget, seconds, max_steps)
    accelerator.print(
        f"time budget {config.time_budget:.0f}s: {seconds:.2f}s per step measured, {steps} of {max_steps} steps"
    )
    return steps


def _random_states() -> dict[str, Any]:
    import random

    states = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_random_states(states: dict[str, Any]) -> None:
    import random

    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
