"""The `eval` section: the evaluation suite and runner."""
from __future__ import annotations

import dataclasses

from composer_jax.config.checks import _check


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """The evaluation suite and runner (`composer_jax.eval`, `launch.py --experiment=eval`).

    policy: oracle | null | heuristic | a training run's workdir | a Hugging Face directory.
    num_tasks: run only the first N suite tasks; samples: K episodes per task and prompt style
    (pass@k); styles: prompt styles scored (terse, detailed). concurrency: episodes at once (for a
    model, also the engine's decode slots; >= samples x styles runs a task's samples together);
    max_context: a model episode's context (the engine's max_len). suite_dir / pool_dir: "" =
    under the cache (`<cache>/eval_suite/<name>-<size>-<pool key>-<builder hash>`,
    `<cache>/eval_pool/<pool key>`; the pool key hashes the task generators' code). price_*:
    dollars per million prompt / cached-prompt / generated tokens. compare: eval.json files for
    `eval_compare`. show_token_ids: `generate` also prints each completion's token ids (it
    prints decoded text). suite: "" = the held-out split of the policy run's own task family when
    eval.policy is an RL run of a family with one (rl.task=lookup|parity; the task set, seeds and
    weights of that run), else the coding suite; "cjbench" = always the coding suite."""
    num_tasks: int = 50
    max_turns: int = 80                 # assistant turns per evaluation episode
    max_new_tokens: int = 512           # tokens per assistant turn
    temperature: float = 0.0            # sampling temperature (0 = greedy)
    policy: str = "oracle"
    samples: int = 1
    styles: tuple[str, ...] = ("terse", "detailed")
    concurrency: int = 2
    max_context: int = 8192
    suite_name: str = "cjbench"         # name of the held-out suite
    suite_dir: str = ""
    pool_dir: str = ""
    suite_size: int = 20                # tasks in the suite
    min_median_lines: int = 50          # suite modules must have at least this median size (lines)
    pool_tasks: int = 120               # candidate tasks generated for the suite
    price_prompt_per_mtok: float = 0.5  # dollars per million prompt tokens
    price_cached_per_mtok: float = 0.05  # dollars per million cached prompt tokens
    price_generated_per_mtok: float = 2.5  # dollars per million generated tokens
    compare: tuple[str, ...] = ()
    show_token_ids: bool = False
    suite: str = ""

    def __post_init__(self):
        _check(self.num_tasks >= 1 and self.max_turns >= 1 and self.max_new_tokens >= 1,
               "eval.num_tasks, eval.max_turns and eval.max_new_tokens must be >= 1")
        _check(self.temperature >= 0, "eval.temperature must be >= 0")
        _check(self.samples >= 1 and self.concurrency >= 1 and self.suite_size >= 1
               and self.pool_tasks >= 1, "eval.samples, eval.concurrency, eval.suite_size and "
               "eval.pool_tasks must be >= 1")
        _check(len(self.styles) >= 1 and all(s in ("terse", "detailed") for s in self.styles)
               and len(set(self.styles)) == len(self.styles),
               f"eval.styles must be a non-empty subset of (terse, detailed), got {self.styles}")
        _check(self.max_context > self.max_new_tokens,
               "eval.max_context must be larger than eval.max_new_tokens")
        _check(min(self.price_prompt_per_mtok, self.price_cached_per_mtok,
                   self.price_generated_per_mtok) >= 0, "eval.price_* must be >= 0")
        _check(bool(self.policy), "eval.policy must be oracle, null, heuristic or a directory")
        _check(self.suite in ("", "cjbench"),
               f"eval.suite must be '' (the policy run's own held-out split) or 'cjbench', got "
               f"{self.suite!r}")
