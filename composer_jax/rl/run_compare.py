"""Are two RL runs the same run? (the reproducible schedule's promise, `rl/schedule.py`)

    diff = compare_runs(dir_a, dir_b)       # [] when identical, else what differs (readable lines)

Compares metrics.jsonl per step (the rows of one step merged; wall-clock fields dropped, and with
`ignore_transport` the weight-sync byte counts, which depend on where the weight store's delta
chain started, so differ after a resume), the consumed log (groups and rollout ids of every step)
and the arrays of the newest checkpoint, bit for bit. Also a command:

    python -m composer_jax.rl.run_compare RUN_A RUN_B [--ignore-transport]
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import orbax.checkpoint as ocp

# wall-clock (or wall-clock-derived) metric names: the only fields allowed to differ
TIME_FIELDS = ("time", "step_time_s", "rollouts_per_sec", "trained_tokens_per_sec",
               "trainer_idle_frac", "trainer_idle_frac_total", "eval_time_s", "eval_s",
               "weight_sync_s", "publish_s", "elapsed_s")
TRANSPORT_FIELDS = ("weight_sync_bytes", "weight_sync_ratio", "weight_sync_changed_frac")


def _timey(key: str) -> bool:
    return key in TIME_FIELDS or key.endswith(("_time_s", "_per_sec", "_s", "_idle_frac"))


def metrics_by_step(workdir, ignore_transport: bool = False) -> dict[int, dict]:
    """{step: the merged rows of that step without wall-clock fields}."""
    out: dict[int, dict] = {}
    path = pathlib.Path(workdir) / "metrics.jsonl"
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        step = int(row.pop("step"))
        keep = {k: v for k, v in row.items() if not _timey(k)
                and not (ignore_transport and k.startswith("weight_sync"))}
        out.setdefault(step, {}).update(keep)
    return out


def consumed(workdir) -> list[dict]:
    path = pathlib.Path(workdir) / "rollouts" / "consumed.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def checkpoint_arrays(workdir) -> tuple[int, dict[str, np.ndarray]]:
    """(version, {path: array}) of the newest checkpoint's trainer state, read without a template."""
    root = pathlib.Path(workdir).resolve() / "checkpoints"
    steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
    if not steps:
        raise FileNotFoundError(f"no checkpoint under {root}")
    step_dir = root / str(steps[-1])
    item = next(p for p in step_dir.iterdir() if p.is_dir() and p.name == "state")
    tree = ocp.PyTreeCheckpointer().restore(item)
    flat = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix}/{i}")
        elif node is not None:
            flat[prefix] = np.asarray(node)
    walk(tree, "")
    return steps[-1], flat


def compare_runs(a, b, ignore_transport: bool = False, checkpoints: bool = True) -> list[str]:
    """What differs between runs `a` and `b` (module docstring); [] when they are the same."""
    diffs = []
    ma, mb = metrics_by_step(a, ignore_transport), metrics_by_step(b, ignore_transport)
    if sorted(ma) != sorted(mb):
        diffs.append(f"metrics steps differ: {sorted(set(ma) ^ set(mb))}")
    for step in sorted(set(ma) & set(mb)):
        ra, rb = ma[step], mb[step]
        for k in sorted(set(ra) | set(rb)):
            va, vb = ra.get(k, "<missing>"), rb.get(k, "<missing>")
            if va != vb and not (isinstance(va, float) and isinstance(vb, float)
                                 and np.isnan(va) and np.isnan(vb)):
                diffs.append(f"step {step} {k}: {va} != {vb}")
    ca, cb = consumed(a), consumed(b)
    if ca != cb:
        first = next((i for i, (x, y) in enumerate(zip(ca, cb)) if x != y), min(len(ca), len(cb)))
        diffs.append(f"consumed logs differ from row {first} ({len(ca)} vs {len(cb)} rows)")
    if checkpoints:
        va, xa = checkpoint_arrays(a)
        vb, xb = checkpoint_arrays(b)
        if va != vb:
            diffs.append(f"newest checkpoints at versions {va} and {vb}")
        for k in sorted(set(xa) | set(xb)):
            if k not in xa or k not in xb:
                diffs.append(f"checkpoint array {k} only in one run")
            elif xa[k].shape != xb[k].shape or xa[k].tobytes() != xb[k].tobytes():
                diffs.append(f"checkpoint array {k} differs")
    return diffs


def main(argv: list[str]) -> int:
    runs = [a for a in argv[1:] if not a.startswith("--")]
    if len(runs) != 2:
        print(__doc__)
        return 2
    diffs = compare_runs(runs[0], runs[1], ignore_transport="--ignore-transport" in argv)
    print("identical" if not diffs else "\n".join(diffs[:50]))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
