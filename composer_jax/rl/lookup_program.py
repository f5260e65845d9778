"""The RL program of `rl.tasks=lookup` (the default of `rl_async`): multi-turn, tool-using episodes
of the lookup family (`rl/lookup_tasks.py`) on the engine service, with a held-out split of
unseen prompt keys.

Sides (see `rl/program.py`):
- env side (no JAX): `run_lookup_episode`, a token-level episode loop over one engine session:
  encode the prompt, sample a turn (stops at `<|im_end|>`), parse its tool calls with the real
  protocol parser, run them on the task's `NoteBook` (the repository's `read_file` / `finish`
  interfaces served in-process), feed the results back as `## Return of ...` tool messages, until
  `finish`, a turn without calls, `rl.max_turns` or the context. The `Rollout` is exact: fed and
  sampled ids, behaviour log-probs, versions, routed experts per position.
- inference side: `CodingPolicy` (the engine with multi-turn sessions) holding the initial policy.
- trainer side: `ParityLearner` (`rl_step`) on the same initial weights.

The initial policy is a fresh `tiny` MoE with the family's tokenizer after a short SFT
(`rl.lookup_sft_steps` steps of the "lm" loss on optimal demonstrations of *training* tasks only:
it teaches the protocol; held-out prompts are never trained on). The SFT is deterministic in
(config, seed) and cached in the data cache (`lookup_sft/<key>.npz`).

Reward (`env.rewards.compute_reward`): resolved = finish message is the code; the claim of
success is finish's `success` argument (false-claim penalty, communication bonus); the length
term is concave in real generated tokens, scaled per level by `rl.lookup_length_weights`
(difficulty-aware: easy tasks pay for length, hard ones do not).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import random
import threading
import time
import uuid

import numpy as np

from composer_jax.data import special_tokens as st
from composer_jax.env import protocol
from composer_jax.rl import lookup_tasks as lt
from composer_jax.rl.rollout import END_EPISODE, Rollout, SegmentBuilder

VOCAB_SIZE = 448


@functools.lru_cache(maxsize=2)
def lookup_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE (the project's `train_tokenizer`) on key-free demonstrations; deterministic."""
    from composer_jax.data.config import SplitPattern
    from composer_jax.data.tokenizer import train_tokenizer
    return train_tokenizer(lt.tokenizer_texts(0), vocab_size, SplitPattern.KIMI)


def lookup_model_config(vocab_size: int = VOCAB_SIZE):
    """The `tiny` MoE with the family's vocabulary and no MTP (the RL step skips it)."""
    from composer_jax.config import tiny
    return dataclasses.replace(tiny(), name="tiny_lookup", vocab_size=vocab_size, mtp_depth=0)


def reward_env(cfg):
    """The EnvConfig whose reward weights the family uses: the run's `env` section."""
    return cfg.env


def lookup_env_config():
    """The `env` section of lookup runs: the effort x is the real generated tokens (content, tool
    calls, final message; tool outputs, calls and turns weigh 0), with C(x) concave (q = 0.5,
    k = 0.05) and a weight that matters at this scale: 0.01 * C(x) is 0.29 for a minimal easy
    episode (40 tokens) and grows by ~0.03 per 5 extra tokens there."""
    from composer_jax.env.config import EnvConfig
    return dataclasses.replace(
        EnvConfig(), reward_length_coef=0.01, reward_length_k=0.05, reward_length_q=0.5,
        reward_length_token_weight=1.0, reward_length_tool_call_token_weight=1.0,
        reward_length_final_weight=1.0, reward_length_tool_output_weight=0.0,
        reward_length_call_weight=0.0, reward_length_turn_weight=0.0)


# ------------------------------------------------------------------------------- the episode


@dataclasses.dataclass
class _Counts:
    turns: int = 0
    generated: int = 0
    content: int = 0
    call_tokens: int = 0
    tool_output: int = 0


def run_lookup_episode(engine, tokenizer, task: lt.LookupTask, *, max_turns: int,
                       max_new_tokens: int, temperature: float, seed: int, env_cfg,
                       length_weight: float, max_len: int, session: str | None = None) -> Rollout:
    """One episode of `task` through `engine` (`submit(ids, params, session)`, `wait(id)`,
    `end_session(session)`: a local Engine or `coding_program.EngineClient`) -> its Rollout,
    graded and rewarded. Never raises for an episode failure: a crash returns an error rollout
    with the segment recorded so far."""
    from composer_jax.env.rewards import EffortCounts, compute_reward
    from composer_jax.inference.sampling import SamplingParams
    session = session or uuid.uuid4().hex
    im_end = tokenizer.token_to_id(protocol.IM_END)
    call_ids = {tokenizer.token_to_id(protocol.TOOL_CALLS_BEGIN),
                tokenizer.token_to_id(protocol.TOOL_CALL_BEGIN)}
    b = SegmentBuilder()
    book = lt.NoteBook(task)
    n = _Counts()
    index, unsent, stop, final = 0, [], "max_turns", ""
    feed = tokenizer.encode(st.BOS + protocol.render_prompt(task.messages()))
    info: dict = {"level": task.level, "key": task.key}
    try:
        while n.turns < max_turns:
            if len(b) + len(feed) - len(unsent) + 1 >= max_len:
                stop = "context_full"
                break
            params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                    stop_tokens=(im_end,),
                                    seed=(seed * 100_003 + n.turns) % (2 ** 31))
            rid = engine.submit(feed, params, session=session)
            comp = engine.wait(rid)
            b.feed(feed[len(unsent):])
            unsent = []
            if comp.prompt_router_indices is not None and len(comp.prompt_router_indices):
                b.set_router(comp.prompt_router_start, comp.prompt_router_indices, overwrite=False)
            start = b.sample(comp.tokens, comp.logprobs, comp.raw_logprobs, comp.versions)
            if comp.router_indices:
                b.set_router(start - 1, comp.router_indices)
            toks = list(comp.tokens)
            body = toks[:-1] if toks and toks[-1] == im_end else toks
            truncated = len(body) == len(toks)
            if truncated:                       # close the turn (fed, not trainable)
                b.feed([im_end])
                unsent = [im_end]
            n.turns += 1
            n.generated += len(toks)
            cut = next((i for i, t in enumerate(body) if t in call_ids), len(body))
            n.content += cut
            n.call_tokens += len(body) - cut
            parsed = protocol.parse_assistant(tokenizer.decode(body), first_index=index)
            index += len(parsed.tool_calls)
            invalid = sum(c.error is not None for c in parsed.tool_calls)
            b.end_turn(comp.finish_reason, num_tool_calls=len(parsed.tool_calls),
                       num_invalid_calls=invalid, truncated=truncated)
            if not parsed.tool_calls:
                stop, final = "no_tool_call", parsed.content
                break
            pending, finished = [], False
            for call in parsed.tool_calls:
                result = book.execute(call)
                pending.append({"role": "tool", "tool_call_id": call.call_id,
                                "content": result.output})
                if result.finished:
                    final, finished = result.output, True
                    break
            if finished:
                stop = "finish"
                break
            text = protocol.render_continuation(pending)
            new = tokenizer.encode(text)
            n.tool_output += len(new)
            feed = unsent + new
        g = lt.grade(task, book)
        final_tokens = len(tokenizer.encode(final)) if final.strip() else 0
        counts = EffortCounts(content_tokens=n.content, tool_call_tokens=n.call_tokens,
                              tool_output_tokens=n.tool_output, final_message_tokens=final_tokens)
        r = compute_reward(resolved=g.correct, f2p_fraction=0.0, num_calls=book.num_calls,
                           num_invalid_calls=book.num_invalid_calls, num_tokens=n.generated,
                           num_turns=n.turns, changed_files=(), editable_files=(),
                           final_message=g.message, cfg=env_cfg, counts=counts, claimed=g.claimed,
                           length_weight=length_weight)
        info.update({"stop_reason": stop, "final_message": final, "num_turns": n.turns,
                     "num_calls": book.num_calls, "num_invalid_calls": book.num_invalid_calls,
                     "generated_tokens": n.generated, "reads": list(book.reads),
                     "claimed": g.claimed, "resolved": g.correct, "finished": g.finished})
        return Rollout(task.task_id, "", [b.build(END_EPISODE)], dataclasses.asdict(r),
                       rollout_id=session, info=info)
    except Exception as exc:  # noqa: BLE001 - a crashed episode is data (an error rollout)
        try:
            segs = [b.build(END_EPISODE)] if len(b) else []
        except Exception:  # noqa: BLE001 - an unbuildable record: the error rollout has none
            segs = []
        return Rollout.failed(task.task_id, "", f"{type(exc).__name__}: {exc}", segs,
                              rollout_id=session, info=info)
    finally:
        engine.end_session(session)


# ------------------------------------------------------------------------------- initial policy


def sft_batches(tokenizer, tasks, *, steps: int, batch: int, seq_len: int, seed: int,
                hasty: float = 0.0):
    """`steps` LM batches ([batch, seq_len], loss on assistant tokens) of demonstrations of
    `tasks` (`lookup_tasks.demonstration`: optimal episodes with random preambles, or with
    probability `hasty` a guess without reading), sampled with a seeded generator."""
    from composer_jax.data.chat import encode_messages
    from composer_jax.data.targets import add_targets
    rng = random.Random(seed)
    for _ in range(steps):
        rows = {k: np.zeros((batch, seq_len), np.int32)
                for k in ("tokens", "segment_ids", "positions", "trainable")}
        for i in range(batch):
            ids, tr = encode_messages(tokenizer, lt.demonstration(rng.choice(tasks), rng, hasty))
            if len(ids) > seq_len:
                raise ValueError(f"a demonstration of {len(ids)} tokens exceeds seq_len={seq_len}")
            t = len(ids)
            rows["tokens"][i, :t], rows["trainable"][i, :t] = ids, tr
            rows["segment_ids"][i, :t], rows["positions"][i, :t] = 1, np.arange(t)
        yield add_targets(rows, 0)


def sft_policy(cfg, train_tasks, steps: int, lr: float = 3e-3, batch: int = 16):
    """A fresh `cfg.model` (seed rl.lookup_sft_seed) after `steps` Adam steps of the "lm" loss on
    demonstrations of `train_tasks` (sampled with rl.lookup_sft_seed) -> (params, buffers) as
    numpy pure dicts."""
    import jax
    from flax import nnx

    from composer_jax.config import Schedule
    from composer_jax.model import init_model
    from composer_jax.train.step import build
    model = init_model(cfg.model, cfg.rl.lookup_sft_seed, cfg.execution, cfg.train.init_std)
    if steps == 0:
        _, p, b = nnx.split(model, nnx.Param, ...)
        return jax.device_get(nnx.to_pure_dict(p)), jax.device_get(nnx.to_pure_dict(b))
    tcfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, lr=lr, warmup_steps=0, schedule=Schedule.CONSTANT, weight_decay=0.0,
        grad_clip=1.0, steps=steps, loss="lm"))
    fns, state = build(model, tcfg, loss="lm")
    tok = lookup_tokenizer(cfg.model.vocab_size)
    for b in sft_batches(tok, train_tasks, steps=steps, batch=batch,
                         seq_len=sft_length(tok, train_tasks, cfg.rl.seq_len),
                         seed=cfg.rl.lookup_sft_seed,
                         hasty=cfg.rl.lookup_sft_hasty):
        state, _ = fns.train_step(state, b)
    return jax.device_get(state.params), jax.device_get(state.buffers)


def sft_length(tokenizer, tasks, limit: int) -> int:
    """The SFT row length: the longest demonstration of `tasks` (longest preamble), rounded up to
    a multiple of 16, at most `limit` (shorter rows: a cheaper SFT step)."""
    from composer_jax.data.chat import encode_messages

    class _Longest(random.Random):
        def choice(self, seq):
            return max(seq, key=len)

        def random(self):
            return 1.0
    longest = max(len(encode_messages(tokenizer, lt.demonstration(t, _Longest()))[0])
                  for t in tasks)
    return min(limit, -(-longest // 16) * 16)


_SFT_LOCK = threading.Lock()
_SFT_MEM: dict[str, tuple] = {}


def initial_weights(cfg, train_tasks) -> tuple[dict, dict]:
    """The SFT policy's (params, buffers), cached in memory and in the data cache by a key of
    the model, execution, SFT seed and steps, demonstrations and task set. The training tasks
    (and so the demonstrations) are those of the run's seed: pass the SFT seed's tasks to share
    one initial policy between runs of different seeds."""
    from composer_jax.config import to_dict
    from composer_jax.data.config import resolved_cache_dir
    rl = cfg.rl
    key = hashlib.sha256(json.dumps([to_dict(cfg.model), to_dict(cfg.execution), rl.lookup_sft_seed,
                                     rl.lookup_sft_steps, rl.seq_len, list(rl.lookup_levels),
                                     rl.num_train_tasks, cfg.train.init_std, lt.SYSTEM,
                                     lt.PREAMBLES, rl.lookup_sft_hasty, "v2"],
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]
    with _SFT_LOCK:
        if key in _SFT_MEM:
            return _SFT_MEM[key]
        path = pathlib.Path(resolved_cache_dir(cfg.data)) / "lookup_sft" / f"{key}.npz"
        if path.exists():
            flat = dict(np.load(path))
            out = (_unflatten(flat, "p/"), _unflatten(flat, "b/"))
        else:
            t0 = time.monotonic()
            out = sft_policy(cfg, train_tasks, rl.lookup_sft_steps)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{uuid.uuid4().hex[:6]}.npz")
            np.savez(tmp, **_flatten(out[0], "p/"), **_flatten(out[1], "b/"))
            tmp.replace(path)
            print(f"rl.tasks=lookup: SFT warm start ({rl.lookup_sft_steps} steps) in "
                  f"{time.monotonic() - t0:.0f}s, cached in {path}", flush=True)
        _SFT_MEM[key] = out
        return out


def _flatten(tree, prefix: str) -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _unflatten(flat: dict, prefix: str) -> dict:
    out: dict = {}
    for k, v in flat.items():
        if not k.startswith(prefix):
            continue
        node = out
        *parents, leaf = k[len(prefix):].split("/")
        for p in parents:
            node = node.setdefault(int(p) if p.isdigit() else p, {})
        node[int(leaf) if leaf.isdigit() else leaf] = v
    return out


# ------------------------------------------------------------------------------- the program


class LookupProgram:
    heldout_name = "heldout_lookup"        # the evaluator's metric prefix

    def __init__(self, config: dict):
        from composer_jax.rl.parity_program import _config
        self.cfg_dict = config
        self.cfg = _config(config)
        rl = self.cfg.rl
        levels = tuple(rl.lookup_levels)
        self._train = lt.make_tasks(rl.num_train_tasks, self.cfg.seed, "train", levels)
        self._eval = lt.make_tasks(rl.num_eval_tasks, self.cfg.seed, "eval", levels)
        self._tasks = {t.task_id: t for t in self._train + self._eval}

    def train_tasks(self) -> list[str]:
        return [t.task_id for t in self._train]

    def eval_tasks(self) -> list[str]:
        return [t.task_id for t in self._eval]

    def task(self, task_id: str) -> lt.LookupTask:
        return self._tasks[task_id]

    def run_episode(self, task_id: str, seed: int, policy, *, greedy: bool):
        from composer_jax.rl.coding_program import EngineClient
        rl = self.cfg.rl
        task = self._tasks[task_id]
        max_len = rl.seq_len - 1
        engine = EngineClient(policy, max_len, self.cfg.model.vocab_size)
        weights = dict(zip(lt.LEVELS, rl.lookup_length_weights))
        return run_lookup_episode(engine, lookup_tokenizer(self.cfg.model.vocab_size), task,
                                  max_turns=rl.max_turns, max_new_tokens=rl.max_new_tokens,
                                  temperature=0.0 if greedy else rl.temperature, seed=seed,
                                  env_cfg=reward_env(self.cfg), length_weight=weights[task.level],
                                  max_len=max_len)

    def _model(self):
        from flax import nnx

        from composer_jax.model import init_model
        rl = self.cfg.rl
        sft_tasks = lt.make_tasks(rl.num_train_tasks, rl.lookup_sft_seed, "train",
                                  tuple(rl.lookup_levels))
        params, buffers = initial_weights(self.cfg, sft_tasks)
        model = init_model(self.cfg.model, self.cfg.seed, self.cfg.execution,
                           self.cfg.train.init_std)
        graphdef, p, b = nnx.split(model, nnx.Param, ...)
        nnx.replace_by_pure_dict(p, params)
        nnx.replace_by_pure_dict(b, buffers)
        return nnx.merge(graphdef, p, b)

    def make_policy(self):
        from composer_jax.rl.coding_program import CodingPolicy
        return CodingPolicy(self.cfg, self._model())

    def make_learner(self):
        from composer_jax.rl.parity_program import ParityLearner
        return ParityLearner(self.cfg, make_model=self._model)


def make(config: dict) -> LookupProgram:
    return LookupProgram(config)
