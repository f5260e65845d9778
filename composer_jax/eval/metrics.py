"""Pure metric functions of the evaluation suite: pass@k, regressions, cost, aggregation.

Shape glossary: n = samples of one task (episodes), c = resolved samples among them, k <= n.
Nothing here touches the sandbox or JAX; every function is a pure function of plain values.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), the probability that at least
    one of k samples drawn without replacement from n (c of them correct) is correct.

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which is exact and stable for large n."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def regressions(before: Mapping[str, str], after: Mapping[str, str],
                test_ids: Iterable[str]) -> list[str]:
    """Tests among `test_ids` that passed before the agent's change and do not pass after it.

    `before` / `after` map a test id to its outcome ("pass", "fail", "error", "skip", ...); a test
    missing from `after` (it did not run: the module no longer imports) counts as not passing."""
    return sorted(t for t in test_ids if before.get(t) == "pass" and after.get(t) != "pass")


def episode_price(prompt_tokens: int, cached_prompt_tokens: int, generated_tokens: int, *,
                  prompt_per_mtok: float, cached_per_mtok: float, generated_per_mtok: float) -> float:
    """Price of one episode in the config's currency: uncached prompt tokens, cached prompt tokens
    (a prefix already sent in an earlier turn of the episode) and generated tokens, each at its
    price per million tokens. `cached_prompt_tokens` is part of `prompt_tokens`."""
    if not 0 <= cached_prompt_tokens <= prompt_tokens or generated_tokens < 0:
        raise ValueError(f"need 0 <= cached ({cached_prompt_tokens}) <= prompt ({prompt_tokens}) "
                         f"and generated ({generated_tokens}) >= 0")
    fresh = prompt_tokens - cached_prompt_tokens
    return (fresh * prompt_per_mtok + cached_prompt_tokens * cached_per_mtok
            + generated_tokens * generated_per_mtok) / 1e6


def common_prefix_len(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two sequences (token ids or characters)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def task_summary(samples: Sequence[Mapping], ks: Sequence[int]) -> dict:
    """Per-(task, prompt style) summary of K sampled episodes (each a flat episode record with at
    least `resolved`): resolved rate, pass@k for each k <= K, and the mean of every numeric field."""
    n = len(samples)
    c = sum(int(bool(s["resolved"])) for s in samples)
    out = {"samples": n, "num_resolved": c}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = pass_at_k(n, c, k)
    numeric = [k for k, v in samples[0].items() if isinstance(v, (int, float))]  # bools included
    for key in numeric:
        out[key] = mean([float(s[key]) for s in samples])
    return out


def aggregate(rows: Sequence[Mapping], ks: Sequence[int]) -> dict:
    """Mean over tasks of per-task summaries (`task_summary` rows): every numeric key, plus
    `num_tasks`. pass@k over tasks is the mean of the per-task unbiased estimates."""
    if not rows:
        return {"num_tasks": 0}
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float))]
    out = {k: mean([float(r[k]) for r in rows if k in r]) for k in keys}
    out["num_tasks"] = len(rows)
    return out


def binomial_stderr(p: float, n: int) -> float:
    """Standard error of a rate p measured on n independent tasks."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else 0.0
