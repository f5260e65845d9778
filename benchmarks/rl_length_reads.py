"""Re-read rate per level in a finished lookup_levels run's TRAINING rollouts (rl.task.verify):
the fraction of episodes that read more notes than the task's chain (easy 1, hard 2), over the
first and the last K rollout groups (admission order).

    python benchmarks/rl_length_reads.py runs/rl_length_v2 [K=40]
"""
from __future__ import annotations

import json
import pathlib
import sys


def header(path: pathlib.Path) -> dict:
    """The JSON header of a `.rollout` file."""
    b = path.read_bytes()
    i = b.index(b"{")
    return json.JSONDecoder().raw_decode(b[i:].decode("latin1"))[0]


def main() -> None:
    work, k = pathlib.Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rows = []
    for f in sorted((work / "rollouts").glob("g*/g*.rollout")):
        h = header(f)
        info = h["info"]
        rows.append((h["group_id"], info["level"],
                     len(info["reads"]) > (1 if info["level"] == "easy" else 2)))
    groups = sorted({g for g, _, _ in rows})
    for name, sel in (("first", set(groups[:k])), ("last", set(groups[-k:]))):
        for level in ("easy", "hard"):
            x = [r for g, lv, r in rows if g in sel and lv == level]
            print(f"{name:<6}{level:<5} re-read rate {sum(x) / max(len(x), 1):.2f} "
                  f"(n={len(x)} episodes)")
    print(f"{len(groups)} groups in {work}")


if __name__ == "__main__":
    main()
