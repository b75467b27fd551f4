"""A NaN or infinite loss never updates the weights; `train.nonfinite` says what follows
(docs/training.md): `stop` fails the run at once, `skip` counts the step and goes on until
`train.nonfinite_max_skips` such steps in a row."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

import torch


class NonFiniteLoss(RuntimeError):
    """The loss was NaN or infinite and `train.nonfinite` says to stop (a failed run)."""


class SkippableAdamW(torch.optim.AdamW):
    """AdamW whose next `step` can be skipped: the update of a non-finite loss is dropped under
    every ZeRO stage, which all call the base optimizer's `step` on the (flat) fp32 weights;
    DeepSpeed's counters and the schedule still advance (the step counts, the data is consumed)."""

    skip_next = False

    @torch.no_grad()
    def step(self, closure=None):
        if self.skip_next:
            self.skip_next = False
            return None
        return super().step(closure)


def apply_nonfinite_policy(loss: float, state, train_cfg, last_checkpoint: Optional[Path],
                           log: Callable[..., Any]) -> None:
    """After a step of loss `loss` (the same on every rank): reset the run of non-finite steps
    in `state` (a TrainState) on a finite loss; else raise NonFiniteLoss (`stop`, or `skip`
    past the limit) or count the skipped step."""
    if math.isfinite(loss):
        state.nonfinite_in_row = 0
        return
    step = state.step
    resume = (f"the last good checkpoint is {last_checkpoint.name}" if last_checkpoint is not None
              else "no checkpoint was written yet")
    if train_cfg.nonfinite == "stop":
        raise NonFiniteLoss(f"loss {loss} at step {step} (its update was not applied): stopping "
                            f"(train.nonfinite=stop); {resume}; train.nonfinite=skip skips such steps")
    state.skipped_steps += 1
    state.nonfinite_in_row += 1
    log(f"[yellow]step {step}: loss {loss}, update skipped[/yellow] ({state.nonfinite_in_row} in a row, "
        f"{state.skipped_steps} in all; train.nonfinite=skip)")
    if state.nonfinite_in_row >= train_cfg.nonfinite_max_skips:
        raise NonFiniteLoss(f"loss {loss} at step {step}: {state.nonfinite_in_row} non-finite steps in a row "
                            f"reached train.nonfinite_max_skips={train_cfg.nonfinite_max_skips}; {resume}")
