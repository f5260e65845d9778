"""Version 0's held-out score is the baseline every later version is judged against
(`rl/health.py`), so a run must not lose it:

- `finish_baseline(run)`: a run stopped (Ctrl-C, SIGTERM) while version 0 is being evaluated
  finishes that evaluation before it exits (a second Ctrl-C still aborts at once);
- `resubmit_lost_baseline(run)`: a resumed run whose metrics have no version-0 evaluation (killed
  during it) evaluates checkpoint 0 again, beside training.
"""
from __future__ import annotations

import sys

from composer_jax.runlog import read_metrics


def has_baseline(workdir) -> bool:
    return any(int(r.get("step", -1)) == 0 and "eval_resolved_rate" in r
               for r in read_metrics(workdir))


def finish_baseline(run) -> None:
    ev = run.ckpt_eval
    if ev is None or 0 not in ev.pending():
        return
    print("finishing the held-out evaluation of version 0 (the baseline) before stopping; "
          "Ctrl-C again aborts", file=sys.stderr)
    ev.wait(0)


def resubmit_lost_baseline(run) -> bool:
    """True when checkpoint 0 was submitted again (module docstring)."""
    ev = run.ckpt_eval
    if ev is None or 0 in ev.scheduled or has_baseline(run.workdir):
        return False
    if 0 not in run.ckpt.manager.all_steps():
        return False
    state = run.ckpt.restore(0, run.learner.state_template())
    print("version 0 has no held-out evaluation (the run stopped during it): evaluating "
          "checkpoint 0 again", file=sys.stderr)
    ev.submit(0, run.learner.eval_model(state))
    return True
