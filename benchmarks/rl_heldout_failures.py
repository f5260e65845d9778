"""How the held-out episodes of lookup run versions fail: the run's own held-out evaluation
(`rl/family_eval.py`, the same episodes and seeds as the run's `eval_resolved_rate`), with each
episode sorted into one outcome.

    python benchmarks/rl_heldout_failures.py runs/rl_heldout/seed1@20 runs/rl_heldout/seed1@40

Outcomes: resolved; never read the named note (no successful `read_file` of the prompt's key),
by stop reason; read it but did not finish, by stop reason; read it and finished with a wrong
code. Also counted: invalid tool calls and "file not found" tool errors (read_file of a note
that does not exist), from the episodes' decoded token records. Writes
benchmarks/results/rl_heldout_failures.txt (+ .json).
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def outcome(info: dict) -> str:
    """The outcome class of one held-out lookup episode from its `Rollout.info`."""
    reads, stop = info.get("reads", []), info.get("stop_reason")
    if info.get("resolved"):
        return "resolved"
    if info.get("key") not in reads:
        return f"never read the named note ({stop})"
    if not info.get("finished"):
        return f"read it, no finish ({stop})"
    return "read it, wrong code"


def failures(source: str) -> dict:
    """Outcome counts of the held-out evaluation of `source` (WORKDIR@V)."""
    import composer_jax.rl.family_eval as fe
    from composer_jax.agent.lookup import lookup_tokenizer
    got = {}
    summarize = fe.summarize

    def keep(rollouts, name, version):
        got["rollouts"] = rollouts
        return summarize(rollouts, name, version)
    fe.summarize = keep
    try:
        row = fe.evaluate_run(source)
    finally:
        fe.summarize = summarize
    tok = lookup_tokenizer()
    counts = collections.Counter(outcome(r.info) for r in got["rollouts"])
    not_found = sum(tok.decode(list(s.tokens)).count("file not found")
                    for r in got["rollouts"] for s in r.segments)
    return {"policy": source, "version": row["version"], "resolved": row["eval_resolved_rate"],
            "episodes": len(got["rollouts"]), "outcomes": dict(sorted(counts.items())),
            "invalid_calls": sum(r.info.get("num_invalid_calls", 0) for r in got["rollouts"]),
            "file_not_found_errors": not_found}


def main() -> None:
    sources = sys.argv[1:]
    if not sources:
        raise SystemExit("usage: python benchmarks/rl_heldout_failures.py WORKDIR@V [WORKDIR@V ...]")
    load0 = os.getloadavg()[0]
    rows = [failures(s) for s in sources]
    lines = [f"rl_heldout_failures: python benchmarks/rl_heldout_failures.py {' '.join(sources)}",
             f"machine: {os.cpu_count()} CPUs (shared); 1-min load average at start {load0:.1f}", ""]
    for r in rows:
        lines.append(f"{r['policy']} (version {r['version']}): resolved {r['resolved']:.3f} of "
                     f"{r['episodes']} held-out episodes; invalid tool calls {r['invalid_calls']}, "
                     f"of which 'file not found' {r['file_not_found_errors']}")
        lines += [f"    {k}: {v}" for k, v in r["outcomes"].items()]
    text = "\n".join(lines)
    out = ROOT / "benchmarks" / "results"
    (out / "rl_heldout_failures.txt").write_text(text + "\n")
    (out / "rl_heldout_failures.json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    main()
