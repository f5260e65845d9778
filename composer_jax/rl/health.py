"""Is an RL run healthy? One-line warnings from its metrics rows (pure functions, no I/O):

- held-out below the starting policy: an evaluated version whose `eval_resolved_rate` is below
  version 0's (the run is un-learning what the initial policy could do);
- valid calls collapsed: the mean `valid_call_rate` of the last WINDOW trainer versions is below
  COLLAPSE_FRACTION of the first WINDOW's (the policy stopped calling its tools properly).

`health_warnings(rows)` gives the run's warnings (end summary, rl_summary.json "warnings");
`HealthMonitor.check(step, row)` the new ones as rows arrive (the console, during the run).
"""
from __future__ import annotations

WINDOW = 5                  # trainer versions averaged for the valid-call rate
COLLAPSE_FRACTION = 0.5     # last window below this fraction of the first: collapsed


def _eval_rows(rows: list[dict]) -> dict[int, dict]:
    return {int(r["step"]): r for r in rows if isinstance(r.get("eval_resolved_rate"), float)}


def heldout_warning(rows: list[dict]) -> str | None:
    """The evaluated versions below version 0's held-out rate, in one line (None if none)."""
    ev = _eval_rows(rows)
    if 0 not in ev:
        return None
    base = ev[0]["eval_resolved_rate"]
    below = [v for v in sorted(ev) if v > 0 and ev[v]["eval_resolved_rate"] < base]
    if not below:
        return None
    last = below[-1]
    return (f"warning: held-out {ev[last]['eval_resolved_rate']:.3f} at version {last} is below "
            f"version 0's {base:.3f} (versions below version 0: "
            f"{', '.join(map(str, below))})")


def valid_call_warning(rows: list[dict]) -> str | None:
    """Valid tool calls collapsed (module docstring), in one line (None if not)."""
    series = [(int(r["step"]), r["valid_call_rate"]) for r in rows
              if isinstance(r.get("valid_call_rate"), float)]
    if len(series) < 2 * WINDOW:
        return None
    first, last = series[:WINDOW], series[-WINDOW:]
    a = sum(v for _, v in first) / WINDOW
    b = sum(v for _, v in last) / WINDOW
    if b >= COLLAPSE_FRACTION * a:
        return None
    return (f"warning: valid calls collapsed: valid_call_rate {b:.2f} at versions "
            f"{last[0][0]}-{last[-1][0]} (was {a:.2f} at versions {first[0][0]}-{first[-1][0]})")


def health_warnings(rows: list[dict]) -> list[str]:
    return [w for w in (heldout_warning(rows), valid_call_warning(rows)) if w is not None]


class HealthMonitor:
    """Feeds rows as they are logged; `check` returns the warnings to show now: the held-out one
    whenever another evaluated version falls below version 0, the valid-call one when the rate
    collapses (again after a recovery), not at every version in between."""

    def __init__(self, rows: list[dict] | None = None):
        self.rows = list(rows or [])
        self.heldout = heldout_warning(self.rows)
        self.collapsed = valid_call_warning(self.rows) is not None

    def check(self, step: int, row: dict) -> list[str]:
        self.rows.append({**row, "step": step})
        out = []
        if "eval_resolved_rate" in row:
            h = heldout_warning(self.rows)
            if h is not None and h != self.heldout:
                out.append(h)
            self.heldout = h
        if "valid_call_rate" in row:
            v = valid_call_warning(self.rows)
            if v is not None and not self.collapsed:
                out.append(v)
            self.collapsed = v is not None
        return out
