"""Policies the evaluation runs: reference agents and language models.

`eval.policy` is one of
  oracle      the environment's scripted oracle (replays the reference fix through the tools)
  null        finishes at once
  heuristic   the scripted mutation-repair baseline (`composer_jax.eval.heuristic`)
  PATH        a run's workdir (pretraining, SFT or RL: config.json + tokenizer.json +
              checkpoints/, the newest checkpoint; PATH@STEP for one checkpoint, an RL run's
              policy version) or a Hugging Face checkpoint directory (config.json + safetensors,
              with a tokenizer.json beside them)

A `Policy` runs one episode per call (`episode(task, task_dir, env_cfg, seed) -> EpisodeFacts`).
Reference agents run in the environment's text loop, one agent per episode (`agent(task,
task_dir, seed)`), metered turn by turn (`Meter`) with the characters/4 estimate on the rendered
prompt: prompt tokens, the part already sent in the previous turn (cacheable), generated tokens.
Models (`ModelPolicy`) run the token-level agent (`composer_jax.agent.token_agent`, as RL does) on the inference engine service, and are
metered in real tokens from the rollout (`episodes.rollout_prompt_tokens`).
"""
from __future__ import annotations

import dataclasses
import pathlib
import uuid
import zlib
from typing import Callable

from composer_jax.agent.episode import approx_tokens, run_episode
from composer_jax.agent.token_agent import AgentConfig, ScriptedPolicy, SeededTurns, TokenAgent
from composer_jax.config import Config
from composer_jax.data.tokenizer import load_tokenizer
from composer_jax.env.agents import OracleAgent, null_agent
from composer_jax.env.protocol import render_prompt
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.errors import ComposerError
from composer_jax.eval.episodes import EpisodeFacts, facts_from_episode, facts_from_rollout
from composer_jax.eval.heuristic import HeuristicAgent
from composer_jax.eval.metrics import common_prefix_len
from composer_jax.inference import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.train.run_checkpoint import parse_run_source
from composer_jax.train.weights import load_weights

REFERENCE_POLICIES = ("oracle", "null", "heuristic")


class PolicyError(ValueError):
    """eval.policy names nothing usable (the message lists what is accepted)."""


@dataclasses.dataclass
class Meter:
    """Per-episode token accounting, filled turn by turn."""
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    turns: int = 0
    _last_prompt: object = None

    def add(self, prompt, generated: int) -> None:
        """`prompt`: the turn's prompt (a token list or a string counted at ~4 chars/token)."""
        if isinstance(prompt, str):
            n = approx_tokens(prompt)
            cached = (approx_tokens(prompt[:common_prefix_len(self._last_prompt, prompt)])
                      if self._last_prompt is not None else 0)
        else:
            n = len(prompt)
            cached = common_prefix_len(self._last_prompt, prompt) if self._last_prompt is not None else 0
        self.prompt_tokens += n
        self.cached_prompt_tokens += min(cached, n)
        self.generated_tokens += generated
        self.turns += 1
        self._last_prompt = prompt


class Policy:
    """Base: `name`, `kind` ("reference" | "model"), `agent(...)` -> (agent callable, Meter),
    `count_tokens(text)` for the episode's generated-token count; `close()`."""
    name = ""
    kind = "reference"

    def agent(self, task, task_dir: pathlib.Path, seed: int):
        raise NotImplementedError

    def episode(self, task, task_dir: pathlib.Path, env_cfg, seed: int) -> EpisodeFacts:
        """Runs one episode of `task` (its problem statement already set to the prompt style) in
        the environment's text loop with this policy's agent; thread-safe."""
        agent, meter = self.agent(task, task_dir, seed)
        ep = run_episode(agent, task, task_dir, env_cfg, count_tokens=self.count_tokens)
        return facts_from_episode(ep, meter, task.pass_to_pass)

    def count_tokens(self, text: str) -> int:
        return approx_tokens(text)

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind}


class ReferencePolicy(Policy):
    def __init__(self, name: str):
        self.name = name

    def agent(self, task, task_dir, seed):
        inner = {"oracle": lambda: OracleAgent(task, task_dir), "null": lambda: null_agent,
                 "heuristic": HeuristicAgent}[self.name]()
        meter = Meter()

        def run(messages):
            text = inner(messages)
            meter.add(render_prompt(list(messages), list(TOOL_SPECS)), approx_tokens(text))
            return text
        return run, meter


class ModelPolicy(Policy):
    """A model sampled exactly as RL samples it: each episode is an `agent.token_agent.TokenAgent` run on one
    shared inference engine service (`inference.Engine`, started with a background driver), in its
    own engine session, so the conversation's prefix stays in the cache across turns and only new
    tokens (tool results, the next turn's header) are fed. Concurrent episodes (the runner's
    threads: K samples of a task and other tasks) are batched by the engine's driver.

    engine: an already started engine to reuse (e.g. the RL trainer's); it is left running by
    `close`. Otherwise one is built from `model` with `engine_cfg` (max_batch = concurrency,
    max_len = max_context) and stopped by `close`. Sampling: `temperature` (0 = greedy), one PRNG
    stream per (episode seed, turn) so results do not depend on scheduling. `scripted`: a test
    hook, `(task, task_dir) -> (messages -> text)`, whose text is forced through the engine
    instead of sampling (`agent.token_agent.ScriptedPolicy`)."""
    kind = "model"

    def __init__(self, name: str, model, tokenizer, *, max_new_tokens: int, temperature: float,
                 max_context: int, concurrency: int, seed: int, describe: dict | None = None,
                 engine=None, engine_cfg=None, summary_trigger_tokens: int = 0,
                 scripted: Callable | None = None):
        self.name, self.tokenizer, self._info = name, tokenizer, describe or {}
        self.max_context, self._scripted = max_context, scripted
        self.agent_cfg = AgentConfig(max_new_tokens=max_new_tokens, temperature=temperature,
                                     summary_trigger_tokens=summary_trigger_tokens,
                                     record_messages=True)
        self._own = engine is None
        if engine is None:
            base = engine_cfg if engine_cfg is not None else EngineConfig()
            engine = Engine.from_model(model, dataclasses.replace(
                base, max_batch=max(1, concurrency), max_len=max_context, seed=seed))
        self.engine = engine.start()

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, **self._info}

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def agent(self, task, task_dir, seed):
        raise PolicyError("a model policy runs whole episodes on the engine (ModelPolicy.episode)")

    def episode(self, task, task_dir, env_cfg, seed: int) -> EpisodeFacts:
        """One `TokenAgent` episode on the shared engine -> its EpisodeFacts (a crashed episode is
        scored unresolved, its error kept in `EpisodeFacts.error`)."""
        if self._scripted is not None:
            turn_policy = ScriptedPolicy(self._scripted(task, task_dir), self.tokenizer)
        else:
            turn_policy = SeededTurns(zlib.crc32(f"{task.task_id}:{seed}".encode()))
        agent = TokenAgent(self.engine, self.tokenizer, self.agent_cfg, env_cfg, turn_policy)
        rollout = agent.run(task, task_dir, group_id=f"eval/{task.task_id}",
                            rollout_id=f"eval-{uuid.uuid4().hex}")
        return facts_from_rollout(rollout, task.pass_to_pass)

    def close(self) -> None:
        if self._own:
            self.engine.stop()


def load_model(path: pathlib.Path, cfg=None):
    """(model, tokenizer, info) from a training run's workdir (newest checkpoint) or a Hugging Face
    directory, through the one weight loader (`composer_jax.train.weights.load_weights`); the
    tokenizer is the run's tokenizer.json (or one placed in the HF directory)."""
    source = str(path)
    path, _ = parse_run_source(source)
    try:
        weights = load_weights(source, cfg or Config())
    except ComposerError as e:
        raise PolicyError(f"eval.policy={source!r}: {e}") from None
    tok = weights.tokenizer_path or path / "tokenizer.json"
    if not pathlib.Path(tok).is_file():
        raise PolicyError(f"{path} has no tokenizer.json; copy the tokenizer.json the model was "
                          f"trained with into it")
    info = {"path": source, "source": weights.kind, "model": weights.model_cfg.name}
    if weights.step is not None:
        info["step"] = int(weights.step)
    return weights.model(), load_tokenizer(tok), info


def make_policy(spec: str, cfg=None, *, max_new_tokens: int = 512, temperature: float = 0.0,
                max_context: int = 8192, concurrency: int = 4, seed: int = 0) -> Policy:
    """The policy `eval.policy` names (see the module docstring)."""
    if spec in REFERENCE_POLICIES:
        return ReferencePolicy(spec)
    path, step = parse_run_source(spec)
    if not path.exists():
        raise PolicyError(f"eval.policy={spec!r}: not one of {REFERENCE_POLICIES} and no such "
                          f"directory (give a run's workdir, WORKDIR@STEP, or a Hugging Face "
                          f"directory)")
    model, tokenizer, info = load_model(spec, cfg)
    name = path.name + (f"@{step}" if step is not None else "")
    return ModelPolicy(name, model, tokenizer, max_new_tokens=max_new_tokens,
                       temperature=temperature, max_context=max_context, concurrency=concurrency,
                       seed=seed, describe=info, engine_cfg=cfg.inference if cfg else None,
                       summary_trigger_tokens=cfg.rl.summary_trigger_tokens if cfg else 0)


AgentFactory = Callable[[object, pathlib.Path, int], tuple]
