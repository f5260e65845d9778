"""The evaluation suite: held-out CursorBench-style tasks scored for correctness, quality, cost and
behaviour. No JAX at import (model policies import it when built).

  suite.py      the versioned suite (id, manifest with per-task hashes, categories, two prompts)
  prompts.py    terse and detailed prompts
  disjoint.py   content-hash proof that the suite is disjoint from corpus, RL pool and SFT pool
  policies.py   oracle / null / heuristic reference agents; model policies (checkpoint, HF dir)
                run RL's TokenAgent on the inference engine service
  heuristic.py  the scripted mutation-repair baseline
  runner.py     K samples x styles x tasks, episodes run concurrently through the environment
  episodes.py   one finished episode (text loop or RL token-level rollout) as the metrics see it
  sources.py    content hash of the task generators' code (names the evaluation pool)
  metrics.py    pass@k, regressions, cost, aggregation (pure functions)
  quality.py    new pyflakes warnings, diff size, out-of-scope files, test edits
  report.py     eval.json, Markdown, plots, comparison
  api.py        ensure_suite, evaluate, and eval_resolved_rate (the RL evaluator's hook)
"""
