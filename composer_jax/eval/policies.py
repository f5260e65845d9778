"""Policies the evaluation runs: reference agents and language models.

`eval.policy` is one of
  oracle      the environment's scripted oracle (replays the reference fix through the tools)
  null        finishes at once
  heuristic   the scripted mutation-repair baseline (`composer_jax.eval.heuristic`)
  PATH        a training run's workdir (config.json + tokenizer.json + checkpoints/, the newest
              checkpoint) or a Hugging Face checkpoint directory (config.json + safetensors, with a
              tokenizer.json beside them)

A `Policy` makes one agent per episode (`agent(task, task_dir, seed)`) and meters every turn
(`Meter`): prompt tokens, the part of them already sent in the previous turn of the episode
(cacheable), and generated tokens. Reference agents are metered with the environment's
characters/4 estimate on the rendered prompt; models with their tokenizer's real counts.
"""
from __future__ import annotations

import dataclasses
import pathlib
import threading
from typing import Callable

from composer_jax.env.agents import OracleAgent, null_agent
from composer_jax.env.episode import approx_tokens
from composer_jax.env.protocol import render_prompt
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.eval.heuristic import HeuristicAgent
from composer_jax.eval.metrics import common_prefix_len

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
    """A model served by the inference engine; episodes share one engine (its driver batches the
    concurrent requests when it has one, else requests are run one at a time under a lock)."""
    kind = "model"

    def __init__(self, name: str, model, tokenizer, *, max_new_tokens: int, temperature: float,
                 max_context: int, concurrency: int, seed: int, describe: dict | None = None):
        from composer_jax.data import special_tokens as st
        from composer_jax.env import protocol
        from composer_jax.inference import EngineConfig
        from composer_jax.inference.engine import Engine

        self.name, self.tokenizer, self._info = name, tokenizer, describe or {}
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.max_context = max_context
        end = tokenizer.token_to_id(protocol.IM_END)
        eos = tokenizer.token_to_id(st.EOS) if hasattr(st, "EOS") else None
        self.stop = tuple(t for t in (end, eos) if t is not None)
        self.engine = Engine.from_model(model, EngineConfig(max_batch=max(1, concurrency),
                                                            max_len=max_context, seed=seed))
        self._lock = threading.Lock()
        self._service = hasattr(self.engine, "request") and hasattr(self.engine, "start")
        if self._service:
            self.engine.start()

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, **self._info}

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def _generate(self, ids: list[int], seed: int):
        from composer_jax.inference import SamplingParams
        params = SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens,
                                stop_tokens=self.stop, seed=seed)
        if self._service:
            return self.engine.request(ids, params).result()
        with self._lock:
            rid = self.engine.submit(ids, params)
            return self.engine.run()[rid]

    def agent(self, task, task_dir, seed):
        from composer_jax.data.chat import encode_prompt
        meter = Meter()
        turn = [0]

        def run(messages):
            ids = encode_prompt(self.tokenizer, list(messages), list(TOOL_SPECS))
            if len(ids) + self.max_new_tokens > self.max_context:
                meter.add(ids, 0)
                return "Context limit reached (eval.max_context); stopping."
            c = self._generate(ids, seed * 1000 + turn[0])
            turn[0] += 1
            meter.add(ids, len(c.tokens))
            text = self.tokenizer.decode([t for t in c.tokens if t not in self.stop])
            return text
        return run, meter

    def close(self) -> None:
        if self._service:
            self.engine.stop()


def load_model(path: pathlib.Path, cfg=None):
    """(model, tokenizer, info) from a training run's workdir (newest checkpoint) or a Hugging Face
    directory, through the one weight loader (`composer_jax.train.weights.load_weights`); the
    tokenizer is the run's tokenizer.json (or one placed in the HF directory)."""
    from composer_jax.config import Config
    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.errors import ComposerError
    from composer_jax.train.weights import load_weights

    path = pathlib.Path(path)
    try:
        weights = load_weights(str(path), cfg or Config())
    except ComposerError as e:
        raise PolicyError(f"eval.policy={str(path)!r}: {e}") from None
    tok = weights.tokenizer_path or path / "tokenizer.json"
    if not pathlib.Path(tok).is_file():
        raise PolicyError(f"{path} has no tokenizer.json; copy the tokenizer.json the model was "
                          f"trained with into it")
    info = {"path": str(path), "source": weights.kind, "model": weights.model_cfg.name}
    if weights.step is not None:
        info["step"] = int(weights.step)
    return weights.model(), load_tokenizer(tok), info


def make_policy(spec: str, cfg=None, *, max_new_tokens: int = 512, temperature: float = 0.0,
                max_context: int = 8192, concurrency: int = 4, seed: int = 0) -> Policy:
    """The policy `eval.policy` names (see the module docstring)."""
    if spec in REFERENCE_POLICIES:
        return ReferencePolicy(spec)
    path = pathlib.Path(spec).expanduser()
    if not path.exists():
        raise PolicyError(f"eval.policy={spec!r}: not one of {REFERENCE_POLICIES} and no such "
                          f"directory (give a training run's workdir or a Hugging Face directory)")
    model, tokenizer, info = load_model(path, cfg)
    return ModelPolicy(path.name, model, tokenizer, max_new_tokens=max_new_tokens,
                       temperature=temperature, max_context=max_context, concurrency=concurrency,
                       seed=seed, describe=info)


AgentFactory = Callable[[object, pathlib.Path, int], tuple]
