"""rl.task=composer_jax.rl.tasks.stdlib_completion: complete held-out standard-library code.

A task is a position in the source of one of the held-out stdlib modules
(`composer_jax.heldout.HELDOUT_MODULES`, never in the pretraining corpus): the prompt is the
`prompt_tokens` tokens before it (raw code, no chat template: the policy is a pretrained code model,
not an SFT one) and the policy samples exactly `target_tokens` tokens. Reward: the fraction of the
true next tokens reproduced before the first mistake (token-level prefix match); resolved: all of
them. Training and held-out tasks come from disjoint modules (`train_modules`, `eval_modules`).

Why it depends on pretraining: the answer is the next tokens of real Python the model has never
seen, so the reward is exactly what next-token prediction on code trains for; a short RL run
cannot teach Python (a few thousand sampled tokens), it can only sharpen what the pretrained
model already puts probability on. A model with a lower code loss starts with more reward and
more non-zero advantages in a group, so the experiment `cpt_rl_sweep` asks whether held-out
pretraining loss predicts the held-out score after RL.

The family is a plug-in named by its module path (README "Adding an RL task"); it needs
`rl.task.init_from` (a pretraining run's workdir: its weights, tokenizer.json and architecture,
resolved by `prepare`). No JAX here (rollout workers import it).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import pathlib
import random

from composer_jax.agent.policy_client import EngineClient
from composer_jax.agent.tasks import TaskFamily, single_turn_rollout
from composer_jax.config import TaskConfig
from composer_jax.config.checks import _check
from composer_jax.data.tokenizer import load_tokenizer
from composer_jax.errors import ConfigError
from composer_jax.heldout import HELDOUT_MODULES
from composer_jax.protocol.params import SamplingParams
from composer_jax.rl.tasks.registry import register
from composer_jax.train.run_checkpoint import run_config

NAME = __name__


@dataclasses.dataclass(frozen=True)
class StdlibCompletionConfig(TaskConfig):
    """The section rl.task of this family: init_from, the pretrained policy's run workdir;
    prompt_tokens / target_tokens: context and answer length in tokens; train_modules /
    eval_modules: disjoint held-out stdlib modules the training and held-out tasks come from;
    task_seed: draws the task positions (independent of the run's seed, so runs with different
    seeds score the same held-out tasks)."""
    family: str = NAME
    num_train_tasks: int = 64
    num_eval_tasks: int = 32
    init_from: str = ""
    prompt_tokens: int = 48
    target_tokens: int = 4
    train_modules: tuple[str, ...] = ("bisect", "colorsys", "fractions", "heapq")
    eval_modules: tuple[str, ...] = ("difflib", "shlex", "statistics", "textwrap")
    task_seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        _check(self.prompt_tokens >= 1 and self.target_tokens >= 1,
               f"rl.task.prompt_tokens and target_tokens must be >= 1, got "
               f"{self.prompt_tokens}, {self.target_tokens}")
        for f in ("train_modules", "eval_modules"):
            mods = getattr(self, f)
            _check(bool(mods) and set(mods) <= HELDOUT_MODULES,
                   f"rl.task.{f} must be a non-empty subset of the held-out modules "
                   f"{sorted(HELDOUT_MODULES)} (never pretrained on), got {mods}")
        _check(not set(self.train_modules) & set(self.eval_modules),
               f"rl.task.train_modules and eval_modules overlap: "
               f"{sorted(set(self.train_modules) & set(self.eval_modules))}")


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    return load_tokenizer(pathlib.Path(path))


def module_source(name: str) -> str:
    """The source text of stdlib module `name` (of the running interpreter)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ConfigError(f"stdlib module {name!r} has no Python source here")
    return pathlib.Path(spec.origin).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=8)
def make_split(tokenizer_path: str, modules: tuple[str, ...], n: int, prompt: int, target: int,
               seed: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """n tasks `module:position` -> (prompt ids, target ids), positions drawn without repetition
    from every module's token stream (seeded; positions whose target is whitespace only are
    skipped: nothing there depends on code knowledge)."""
    tok = _tokenizer(tokenizer_path)
    streams = {m: tok.encode(module_source(m)) for m in modules}
    cands = [(m, p) for m in modules for p in range(prompt, len(streams[m]) - target + 1)]
    rng = random.Random(seed)
    rng.shuffle(cands)
    out: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for m, p in cands:
        ids = streams[m]
        tgt = tuple(ids[p:p + target])
        if tok.decode(tgt).strip():
            out[f"{m}:{p}"] = (tuple(ids[p - prompt:p]), tgt)
        if len(out) == n:
            break
    if len(out) < n:
        raise ConfigError(f"only {len(out)} completion tasks in {modules}; lower num tasks")
    return out


def prefix_score(sampled, target) -> tuple[float, bool]:
    """(fraction of `target` reproduced before the first wrong token, all of it reproduced)."""
    k = 0
    for a, b in zip(sampled, target):
        if int(a) != int(b):
            break
        k += 1
    return k / len(target), k == len(target)


@register
class StdlibCompletionFamily(TaskFamily):
    name = NAME
    config_cls = StdlibCompletionConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        t = self.task_cfg
        if not t.init_from:
            raise ConfigError("rl.task.init_from is empty: set it to a pretraining run's workdir "
                              "(e.g. a cpt_debug run), which gives the policy and tokenizer.json")
        self.tokenizer_path = str(pathlib.Path(t.init_from) / "tokenizer.json")
        args = (self.tokenizer_path, t.prompt_tokens, t.target_tokens, t.task_seed)
        self._split = {
            "train": make_split(args[0], tuple(t.train_modules), t.num_train_tasks, *args[1:]),
            "eval": make_split(args[0], tuple(t.eval_modules), t.num_eval_tasks, *args[1:])}

    def make_tasks(self, split: str) -> list[str]:
        return list(self._split[split])

    def tokenizer(self):
        return _tokenizer(self.tokenizer_path)

    def task(self, task_id: str):
        split = "eval" if task_id in self._split["eval"] else "train"
        return self._split[split][task_id]

    def run_episode(self, task_id, seed, policy, *, greedy):
        prompt, target = self.task(task_id)
        params = SamplingParams(temperature=0.0 if greedy else self.cfg.rl.temperature,
                                max_new_tokens=len(target), stop_tokens=(), seed=seed)
        c = EngineClient(policy, self.cfg.rl.seq_len, self.cfg.model.vocab_size).generate(
            prompt, params)
        reward, resolved = prefix_score(c.tokens, target)
        return single_turn_rollout(task_id, "", prompt, c, reward, resolved,
                                   {"reply": self.tokenizer().decode(c.tokens)})

    def initial_model(self):
        from composer_jax.train.weights import load_weights  # JAX: not in rollout workers
        return load_weights(self.task_cfg.init_from, self.cfg).model()

    @classmethod
    def prepare(cls, cfg):
        """The run's model is the pretrained policy's architecture (its seed stays the run's);
        rows must hold a prompt and its answer."""
        t = cfg.rl.task
        if not t.init_from or not (pathlib.Path(t.init_from) / "tokenizer.json").exists():
            raise ConfigError(f"rl.task.init_from={t.init_from!r} must be a pretraining run's "
                              f"workdir with tokenizer.json (e.g. a cpt_debug run)")
        if cfg.rl.seq_len < t.prompt_tokens + t.target_tokens:
            raise ConfigError(f"rl.seq_len={cfg.rl.seq_len} < rl.task.prompt_tokens + "
                              f"target_tokens = {t.prompt_tokens + t.target_tokens}; raise it")
        return dataclasses.replace(run_config(pathlib.Path(t.init_from), cfg), seed=cfg.seed)
