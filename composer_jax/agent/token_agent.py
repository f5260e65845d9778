"""The token-level agent: runs one environment episode on an engine session and records exactly
what the policy saw and sampled as a `Rollout`.

    agent = TokenAgent(engine, tokenizer, AgentConfig.from_config(cfg), cfg.env)
    rollout = agent.run(task, task_dir, group_id="task-3/step-12")

Each turn the agent encodes only the new text (the first prompt; later the tool results and the
next generation prompt, `protocol.render_continuation`) and feeds it to the episode's engine
session, whose cache holds the conversation so far. The sampled ids are recorded as they are and
decoded to the text the environment parses, so the ids of a segment decode to exactly the
conversation the environment saw (assistant turns rendered from their `raw` text). A turn that
does not end with `<|im_end|>` (cut at `max_new_tokens` or by the context) is closed by the agent
with a fed, non-trainable `<|im_end|>`. When the context would pass the summary trigger the
segment ends with a summary turn and a new segment restarts from system prompt + task + summary
(`composer_jax.agent.summarize`). Tools, grading and reward go through the environment's public API
(`open_workspace`, `grade_workspace`, `compute_reward`). A crash becomes an error rollout (reward
0) with the segments recorded so far; one caused outside the policy (`EpisodeInterrupted`: the
engine died; `SandboxKilled`: a tool call's sandbox was killed) says so in `info["interrupted"]`.

Checkpoints and resume (`agent.episode_checkpoint`): with `checkpoint=sink`, every completed turn
hands the sink an `EpisodeCheckpoint`; `resume=checkpoint` continues an episode from one on a
fresh engine session (the recorded prefix is fed as recorded ids) and a fresh workspace (the
checkpoint's state restored), and hands the sink the same turn again with the resume recorded (so
every resume shows, also when an episode resumes from one turn more than once); the rollout's
`info["resumed_at_turns"]` lists where it resumed, `info["resumed_by"]` why (the cause its caller
wrote into the checkpoint's `state["cause"]`, e.g. `rl.jobs.run_job`).

The turns run in the one episode loop (`agent.episode.run_loop`), the same loop as the text-level
episodes. A policy decides how each turn is generated: `sampling_policy` samples with the
configured parameters; `SeededTurns` does so with a PRNG seed fixed per (episode, turn);
`ScriptedPolicy` forces a scripted agent's text (e.g. the oracle) through the engine
as tokens, so its behaviour log-probabilities are real.
"""
from __future__ import annotations

import dataclasses
import inspect
import pathlib
import time
import traceback
import uuid
from typing import Callable

from composer_jax.agent import summarize
from composer_jax.agent.episode import LoopState, initial_messages, run_loop
from composer_jax.agent.episode_checkpoint import (EpisodeCheckpoint, is_interruption,
                                                   restore_workspace, workspace_state)
from composer_jax.agent.policy_client import AgentEngine
from composer_jax.agent.rollout import (END_EPISODE, END_SUMMARIZED, Rollout, Segment,
                                        SegmentBuilder)
from composer_jax.config.env import EnvConfig
from composer_jax.data import special_tokens as st
from composer_jax.env import protocol
from composer_jax.env.grading import grade_workspace
from composer_jax.env.rewards import compute_reward
from composer_jax.env.tasks.task import Task
from composer_jax.env.tools import declared_specs
from composer_jax.env.workspace import open_workspace
from composer_jax.errors import ConfigError
from composer_jax.protocol.params import SamplingParams
from composer_jax.protocol.requests import Completion

try:   # real token counts for the effort penalty (newer env.rewards)
    from composer_jax.env.rewards import EffortCounts
except ImportError:   # pragma: no cover - older env.rewards
    EffortCounts = None


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """max_new_tokens: per assistant turn; temperature/top_k/top_p: the sampling distribution;
    summary_trigger_tokens: self-summarize when context + next feed + max_new_tokens would pass
    this (0 = off; `rl.summary_trigger_tokens`); summary_max_tokens: length of a summary turn;
    max_summaries: per episode (then the episode stops with "context_full" when it no longer
    fits); include_tool_specs: put the tool declarations in the prompt (env.prompt_tools, none with
    env.declare_tools=false); record_messages: keep the per-segment conversation text in
    `Rollout.info["messages"]`; request_timeout_s: longest wait
    for one turn from the engine; resume_replay: a resumed episode replays its recorded turns
    through the engine (forced ids, bit-exact cache) instead of one prefill of the prefix."""
    max_new_tokens: int = 1024
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    summary_trigger_tokens: int = 0
    summary_max_tokens: int = 512
    max_summaries: int = 4
    include_tool_specs: bool = True
    record_messages: bool = True
    request_timeout_s: float = 3600.0
    resume_replay: bool = False

    def __post_init__(self):
        for f in ("max_new_tokens", "summary_max_tokens"):
            if getattr(self, f) < 1:
                raise ConfigError(f"agent {f} must be >= 1, got {getattr(self, f)}")
        if self.summary_trigger_tokens < 0 or self.max_summaries < 0:
            raise ConfigError("agent summary_trigger_tokens and max_summaries must be >= 0")

    @classmethod
    def from_config(cls, cfg, **overrides) -> "AgentConfig":
        """From the whole Config (the summary trigger is `rl.summary_trigger_tokens`); the
        keyword `overrides` set the other fields."""
        kw = {"summary_trigger_tokens": cfg.rl.summary_trigger_tokens}
        kw.update(overrides)
        return cls(**kw)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              max_new_tokens=self.max_new_tokens)


@dataclasses.dataclass(frozen=True)
class TurnRequest:
    """What a policy is asked for: kind "turn" (an assistant turn) or "summary"; messages: the
    current segment's conversation (assistant turns carry `raw`); params: the default sampling
    and stopping for this turn; turn_index: assistant turns so far in the episode."""
    kind: str
    messages: tuple
    params: SamplingParams
    turn_index: int


Policy = Callable[[TurnRequest], SamplingParams]


def sampling_policy(request: TurnRequest) -> SamplingParams:
    """Samples every turn with the agent's configured parameters."""
    return request.params


class SeededTurns:
    """The configured sampling with a PRNG seed fixed per (episode seed, turn), so a sample's
    tokens do not depend on which requests share the engine's batch (and a re-run episode samples
    the same tokens)."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def __call__(self, request: TurnRequest) -> SamplingParams:
        kind = 1 if request.kind == "summary" else 0
        return dataclasses.replace(request.params,
                                   seed=(self.seed * 100_003 + 2 * request.turn_index + kind)
                                   % (2 ** 31))


class ScriptedPolicy:
    """Teacher forcing: a scripted agent (`messages -> assistant text`, e.g. `OracleAgent`) decides
    each turn's text, which is encoded and forced through the engine, so the rollout gets the
    engine's log-probabilities of exactly those tokens. `summary` writes summary texts."""

    def __init__(self, agent: Callable[[list], str], tokenizer,
                 summary: Callable[[list], str] = lambda messages: "Work in progress."):
        self.agent, self.tokenizer, self.summary = agent, tokenizer, summary
        self.im_end = tokenizer.token_to_id(protocol.IM_END)
        self.summary_end = tokenizer.token_to_id(st.SUMMARY_END)

    def __call__(self, request: TurnRequest) -> SamplingParams:
        if request.kind == "summary":
            ids = self.tokenizer.encode(self.summary(list(request.messages))) + [self.summary_end]
        else:
            ids = self.tokenizer.encode(self.agent(list(request.messages))) + [self.im_end]
        return dataclasses.replace(request.params, forced_tokens=tuple(ids))


class _Seg:
    """The open segment: its builder, engine session, conversation and unsent closing ids."""

    def __init__(self, rollout_id: str, index: int, messages: list[dict]):
        self.builder = SegmentBuilder()
        self.session = f"{rollout_id}/{index}"
        self.messages = list(messages)
        self.unsent: list[int] = []      # recorded ids the engine has not been fed yet
        self.fresh = True


class TokenAgent:
    """Runs episodes on an inference engine (module docstring). Thread-safe per call: many
    threads may run episodes on one shared, started engine, each with its own TokenAgent or the
    same one."""

    def __init__(self, engine: AgentEngine, tokenizer, cfg: AgentConfig = AgentConfig(),
                 env_cfg: EnvConfig | None = None, policy: Policy = sampling_policy):
        self.engine, self.tokenizer, self.cfg = engine, tokenizer, cfg
        self.env_cfg = env_cfg if env_cfg is not None else EnvConfig()
        self.policy = policy
        self.tools = (declared_specs(self.env_cfg.prompt_tools)
                      if cfg.include_tool_specs and self.env_cfg.declare_tools else ())
        ids = {name: tokenizer.token_to_id(name) for name in
               (st.BOS, protocol.IM_END, protocol.TOOL_CALLS_BEGIN, protocol.TOOL_CALL_BEGIN,
                st.SUMMARY_BEGIN, st.SUMMARY_END)}
        missing = [k for k, v in ids.items() if v is None]
        if missing:
            raise ConfigError(f"the tokenizer lacks the special tokens {missing}; build it with "
                              f"composer_jax.data.tokenizer (it reserves them)")
        self.im_end, self.summary_end = ids[protocol.IM_END], ids[st.SUMMARY_END]
        self._call_ids = {ids[protocol.TOOL_CALLS_BEGIN], ids[protocol.TOOL_CALL_BEGIN]}
        if tokenizer.vocab_size > engine.model_cfg.vocab_size:
            raise ConfigError(f"tokenizer has {tokenizer.vocab_size} ids, the model's vocabulary "
                              f"{engine.model_cfg.vocab_size}")

    # ------------------------------------------------------------------ the episode

    def run(self, task: Task, task_dir, *, group_id: str = "",
            rollout_id: str | None = None, checkpoint=None,
            resume: EpisodeCheckpoint | None = None) -> Rollout:
        """One episode of `task` (its pool directory `task_dir`) in a sandboxed workspace; never
        raises for an episode failure: a crash returns `Rollout.failed` with the segments
        recorded so far. `checkpoint`/`resume`: module docstring."""
        task_dir = pathlib.Path(task_dir)

        def body(rid: str, ep: _EpisodeState, segs: list[_Seg]) -> dict:
            with open_workspace(task_dir / "snapshot", self.env_cfg,
                                python_version=task.python_version) as ws:
                if resume is not None:
                    restore_workspace(ws, resume.state["workspace"])
                self._episode(ws, initial_messages(task), rid, ep, segs, checkpoint, resume)
                t0 = time.monotonic()
                grade = grade_workspace(ws, task, task_dir / "snapshot")
                ep.timing["grade_s"] += time.monotonic() - t0
                changed = ws.changed_files()
                num_calls, num_invalid = ws.num_calls, ws.num_invalid_calls
            reward = self._reward(task, grade, changed, num_calls, num_invalid, ep)
            ep.info.update({"resolved": bool(grade.resolved), "f2p_passed": grade.f2p_passed,
                            "f2p_total": grade.f2p_total, "p2p_passed": grade.p2p_passed,
                            "p2p_total": grade.p2p_total, "changed_files": list(changed),
                            "num_calls": num_calls, "num_invalid_calls": num_invalid,
                            "grader_ok": bool(grade.ok),
                            "p2p_failed": sorted(t for t in task.pass_to_pass
                                                 if grade.results.get(t) != "pass"),
                            "secret_passed": grade.secret_passed,
                            "secret_total": grade.secret_total,
                            "grade_detail": grade.detail[-300:], "grade_s": round(grade.seconds, 3)})
            return reward
        return self._guarded(task.task_id, group_id, rollout_id, body, resume)

    def run_on(self, ws, messages: list[dict], task_id: str,
               score: Callable[[object, "_EpisodeState"], dict], *, group_id: str = "",
               rollout_id: str | None = None, checkpoint=None,
               resume: EpisodeCheckpoint | None = None) -> Rollout:
        """One episode from `messages` (system prompt + task) on an open tool workspace `ws`
        (anything with `call(name, arguments) -> ToolResult`, `num_calls` and
        `num_invalid_calls`, e.g. a task family's in-process tools), in the same loop and with
        the same recording as `run`. `score(ws, ep) -> reward dict` grades the finished episode
        (`ep`: `stop`, `final`, `turns`, `generated`, `effort_counts(ep)`; it may add facts to
        `ep.info`). Never raises for an episode failure (an error rollout instead).
        `checkpoint`/`resume`: module docstring (`ws` must be fresh; a resume restores it)."""
        def body(rid: str, ep: _EpisodeState, segs: list[_Seg]) -> dict:
            if resume is not None:
                restore_workspace(ws, resume.state["workspace"])
            self._episode(ws, [dict(m) for m in messages], rid, ep, segs, checkpoint, resume)
            return score(ws, ep)
        return self._guarded(task_id, group_id, rollout_id, body, resume)

    def _guarded(self, task_id: str, group_id: str, rollout_id: str | None, body,
                 resume: EpisodeCheckpoint | None = None) -> Rollout:
        """Runs `body(rid, ep, segs) -> reward` into a Rollout; a crash becomes an error rollout
        with the segments recorded so far; every engine session is ended."""
        rid = rollout_id or (resume.rollout_id if resume is not None else uuid.uuid4().hex)
        ep = (_EpisodeState(time.time(), time.monotonic()) if resume is None
              else _EpisodeState.restore(resume))
        ep.task_id = task_id
        seg: list[_Seg] = []
        try:
            reward = body(rid, ep, seg)
            return Rollout(task_id, group_id, ep.segments, reward, rollout_id=rid,
                           timing=ep.finish_timing(), info=ep.finish_info())
        except Exception as exc:   # noqa: BLE001 - a crashed episode becomes an error rollout
            if seg and len(seg[-1].builder):     # the open segment (its session ends below)
                ep.segments.append(seg[-1].builder.build(END_EPISODE))
            if is_interruption(exc):
                ep.info["interrupted"] = True
            why = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
            return Rollout.failed(task_id, group_id, why, ep.segments, rollout_id=rid,
                                  timing=ep.finish_timing(), info=ep.finish_info())
        finally:
            for s in seg:
                self.engine.end_session(s.session)

    def _episode(self, ws, initial: list[dict], rid: str, ep: "_EpisodeState",
                 segs: list[_Seg], checkpoint=None, resume: EpisodeCheckpoint | None = None) -> None:
        turns = _TokenTurns(self, rid, ep, segs, initial)
        state = turns.restore(resume) if resume is not None else LoopState()
        if resume is not None and checkpoint is not None:
            checkpoint(turns.checkpoint(state, ws))   # the resume on record: a later resume from
                                                      # this turn keeps it in resumed_at_turns

        def on_turn(loop: LoopState) -> None:
            checkpoint(turns.checkpoint(loop, ws))
        end = run_loop(ws, turns, self.env_cfg, ep.t0, state,
                       on_turn if checkpoint is not None else None)
        seg = turns.seg
        ep.segments.append(seg.builder.build(END_EPISODE))
        if self.cfg.record_messages:
            ep.messages.append(seg.messages)
        segs.remove(seg)
        self.engine.end_session(seg.session)
        ep.stop, ep.final = end.stop, end.final
        ep.final_from_content = end.stop == "no_tool_call"

    def _feed_ids(self, seg: _Seg, pending: list[dict]) -> list[int]:
        """Ids to feed before the next turn: unsent closing ids, then the new text."""
        if seg.fresh:
            text = st.BOS + protocol.render_prompt(seg.messages + pending, self.tools)
        else:
            text = protocol.render_continuation(pending)
        return seg.unsent + self.tokenizer.encode(text)

    def _generate(self, seg: _Seg, feed: list[int], params: SamplingParams,
                  ep: "_EpisodeState", kind: str = "turn") -> Completion:
        """Feeds `feed` to the segment's session, waits for the turn and records it."""
        t0 = time.monotonic()
        rid = self.engine.submit(feed, params, session=seg.session)
        comp = self.engine.wait(rid, timeout=self.cfg.request_timeout_s)
        ep.timing["generate_s"] += time.monotonic() - t0
        b = seg.builder
        b.feed(feed[len(seg.unsent):])     # the unsent ids are recorded already
        seg.unsent, seg.fresh = [], False
        if comp.prompt_router_indices is not None and len(comp.prompt_router_indices):
            b.set_router(comp.prompt_router_start, comp.prompt_router_indices, overwrite=False)
        start = b.sample(comp.tokens, comp.logprobs, comp.raw_logprobs, comp.versions)
        if comp.router_indices:
            b.set_router(start - 1, comp.router_indices)
        ep.generated += len(comp.tokens)
        return comp

    def _summarize(self, seg: _Seg, pending: list[dict], rid: str, ep: "_EpisodeState",
                   segs: list[_Seg]):
        """Ends `seg` with a summary turn; returns (the new segment, tool messages to feed), or
        None when the request and a summary no longer fit the context (nothing is fed)."""
        cfg = self.cfg
        request = [summarize.request_message()]
        feed = seg.unsent + self.tokenizer.encode(
            protocol.render_continuation(pending + request) + st.SUMMARY_BEGIN)
        deferred = []
        if len(seg.builder) + len(feed) - len(seg.unsent) + cfg.summary_max_tokens \
                >= self.engine.cfg.max_len:
            deferred, pending = pending, []         # results go to the next segment instead
            feed = seg.unsent + self.tokenizer.encode(
                protocol.render_continuation(request) + st.SUMMARY_BEGIN)
            if len(seg.builder) + len(feed) - len(seg.unsent) + cfg.summary_max_tokens \
                    >= self.engine.cfg.max_len:
                return None                         # not even the request fits: context full
        seg.messages += pending + request
        base = SamplingParams(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                              max_new_tokens=cfg.summary_max_tokens)
        params = self.policy(TurnRequest("summary", tuple(seg.messages), base, ep.turns))
        params = dataclasses.replace(params, stop_tokens=tuple(params.stop_tokens)
                                     + (self.summary_end, self.im_end))
        comp = self._generate(seg, feed, params, ep, kind="summary")
        toks = comp.tokens
        closing = ([] if toks and toks[-1] in (self.summary_end, self.im_end)
                   else [self.summary_end])
        if not toks or toks[-1] != self.im_end:
            closing.append(self.im_end)
        seg.builder.feed(closing)
        seg.builder.end_turn(comp.finish_reason, truncated=bool(closing[:-1]), kind="summary")
        text = self.tokenizer.decode(toks)
        summary = summarize.extract_summary(text)
        seg.messages.append({"role": "assistant", "content": summary,
                             "raw": st.SUMMARY_BEGIN + self.tokenizer.decode(
                                 toks[:-1] if toks and toks[-1] == self.im_end else toks)
                             + self.tokenizer.decode(closing[:-1])})
        ep.segments.append(seg.builder.build(END_SUMMARIZED))
        if cfg.record_messages:
            ep.messages.append(seg.messages)
        self.engine.end_session(seg.session)
        segs.remove(seg)
        ep.summaries += 1
        new = _Seg(rid, ep.summaries, summarize.restart_messages(initial_from(seg.messages), summary))
        segs.append(new)
        return new, deferred

    # ------------------------------------------------------------------ reward

    def _reward(self, task: Task, grade, changed, num_calls, num_invalid, ep) -> dict:
        kw = dict(resolved=grade.resolved, f2p_fraction=grade.f2p_fraction, num_calls=num_calls,
                  num_invalid_calls=num_invalid, num_tokens=ep.generated, num_turns=ep.turns,
                  changed_files=changed, editable_files=task.edit_files,
                  final_message=ep.final, cfg=self.env_cfg)
        params = inspect.signature(compute_reward).parameters
        if "tampered" in params:
            kw["tampered"] = bool(getattr(grade, "tampered", False))
        if "claimed" in params:
            kw["claimed"] = ep.claimed       # finish(success=...); False without a finish call
        if "counts" in params and EffortCounts is not None:
            kw["counts"] = self.effort_counts(ep)
        breakdown = compute_reward(**kw)
        return dataclasses.asdict(breakdown)

    def effort_counts(self, ep: "_EpisodeState"):
        """The episode's real token counts for the effort x (`env.rewards.EffortCounts`): content
        (less a final message given as content), tool-call, tool-output and final-message
        tokens."""
        final_tokens = len(self.tokenizer.encode(ep.final)) if ep.final.strip() else 0
        content = ep.content_tokens - (ep.last_content_tokens if ep.final_from_content else 0)
        return EffortCounts(content_tokens=max(content, 0), tool_call_tokens=ep.tool_call_tokens,
                            tool_output_tokens=ep.tool_output_tokens,
                            final_message_tokens=final_tokens)


class _TokenTurns:
    """One TokenAgent episode as the loop's TurnTaker: before a turn, self-summarize or stop on a
    full context; a turn feeds the new ids to the segment's session, samples and records it;
    tool results wait in `pending` until the next turn feeds them."""

    def __init__(self, agent: TokenAgent, rid: str, ep: "_EpisodeState", segs: list[_Seg],
                 initial: list[dict]):
        self.agent, self.rid, self.ep, self.segs = agent, rid, ep, segs
        self.seg = _Seg(rid, 0, initial)
        segs.append(self.seg)
        self.pending: list[dict] = []          # tool messages not fed yet
        self.feed: list[int] = []
        self.comp: Completion | None = None
        self.body: list[int] = []
        self.truncated = False
        self.counted = 0                       # ep.generated already reported to the loop

    def before_turn(self) -> str | None:
        a, cfg = self.agent, self.agent.cfg
        self.feed = a._feed_ids(self.seg, self.pending)
        if (summarize.should_summarize(len(self.seg.builder), len(self.feed), cfg.max_new_tokens,
                                       cfg.summary_trigger_tokens)
                and self.ep.summaries < cfg.max_summaries and not self.seg.fresh):
            out = a._summarize(self.seg, self.pending, self.rid, self.ep, self.segs)
            if out is None:
                return "context_full"
            self.seg, self.pending = out
            self.feed = a._feed_ids(self.seg, self.pending)
        seg = self.seg
        if len(seg.builder) + len(self.feed) - len(seg.unsent) >= a.engine.cfg.max_len:
            return "context_full"
        return None

    def turn(self) -> tuple[str, int]:
        a, seg, ep = self.agent, self.seg, self.ep
        seg.messages += self.pending
        params = a.policy(TurnRequest("turn", tuple(seg.messages), a.cfg.sampling(), ep.turns))
        params = dataclasses.replace(params, stop_tokens=tuple(params.stop_tokens) + (a.im_end,))
        comp = a._generate(seg, self.feed, params, ep)
        ep.tool_output_tokens += sum(len(a.tokenizer.encode(
            protocol.render_continuation([m], False))) for m in self.pending)
        self.pending = []
        body = comp.tokens[:-1] if comp.tokens and comp.tokens[-1] == a.im_end else comp.tokens
        self.truncated = len(body) == len(comp.tokens)
        if self.truncated:                 # close the turn ourselves (fed, not trainable)
            seg.builder.feed([a.im_end])
            seg.unsent = [a.im_end]
        self.comp, self.body = comp, body
        n, self.counted = ep.generated - self.counted, ep.generated
        return a.tokenizer.decode(body), n

    def on_reply(self, text: str, parsed) -> None:
        ep, seg, comp = self.ep, self.seg, self.comp
        ep.turns += 1
        ep.count_turn(self.body, self.agent._call_ids)
        invalid = sum(c.error is not None for c in parsed.tool_calls)
        seg.builder.end_turn(comp.finish_reason, num_tool_calls=len(parsed.tool_calls),
                             num_invalid_calls=invalid, truncated=self.truncated)
        ep.finish_reasons.append(comp.finish_reason)
        seg.messages.append(protocol.assistant_message(text, parsed))

    def on_result(self, call, result, seconds: float) -> None:
        self.ep.timing["tools_s"] += seconds
        if result.finished:           # the structured claim of success: finish's `success`
            self.ep.claimed = bool((call.arguments or {}).get("success", False))
        self.pending.append({"role": "tool", "tool_call_id": call.call_id,
                             "content": result.output, "is_error": bool(result.is_error)})

    # ------------------------------------------------------------------ checkpoint / resume

    def checkpoint(self, loop: LoopState, ws) -> EpisodeCheckpoint:
        """The episode after its last completed turn (`agent.episode_checkpoint`)."""
        seg = self.seg
        state = {"ep": self.ep.to_state(),
                 "seg": {"index": self.ep.summaries, "session": seg.session,
                         "messages": seg.messages, "fresh": seg.fresh},
                 "pending": self.pending, "counted": self.counted,
                 "loop": dataclasses.asdict(loop), "workspace": workspace_state(ws)}
        segments = list(self.ep.segments) + [seg.builder.build(END_EPISODE)]
        return EpisodeCheckpoint(self.rid, self.ep.task_id, loop.turns, segments, state)

    def restore(self, ck: EpisodeCheckpoint) -> LoopState:
        """Continues from `ck` on a fresh engine session: the open segment's recorded ids are
        fed (unsent) before the next turn's new text; the dead attempt's session is ended."""
        st, s = ck.state, ck.state["seg"]
        self.segs.remove(self.seg)
        seg = _Seg(self.rid, s["index"], s["messages"])
        seg.session = f"{self.rid}/{s['index']}.r{len(self.ep.resumed_at)}"
        seg.builder = SegmentBuilder.from_segment(ck.segments[-1])
        seg.fresh = bool(s["fresh"])
        seg.unsent = [] if seg.fresh else list(seg.builder.tokens)
        self.seg = seg
        self.segs.append(seg)
        self.pending, self.counted = [dict(m) for m in st["pending"]], int(st["counted"])
        self.agent.engine.end_session(s["session"])
        if self.agent.cfg.resume_replay and not seg.fresh:
            self._replay(seg)
        return LoopState(**st["loop"])

    def _replay(self, seg: _Seg) -> None:
        """Rebuilds the session's cache as the turns built it: each turn's fed ids prefilled,
        its sampled ids forced through decode (the outputs are not recorded again)."""
        eng, toks, start = self.agent.engine, seg.builder.tokens, 0
        for turn in seg.builder.turns:
            forced = toks[turn.sample_start:turn.sample_end]
            if not forced:
                continue
            params = SamplingParams(forced_tokens=tuple(forced), max_new_tokens=len(forced))
            rid = eng.submit(toks[start:turn.sample_start], params, session=seg.session)
            eng.wait(rid, timeout=self.agent.cfg.request_timeout_s)
            start = turn.sample_end
        seg.unsent = list(toks[start:])


def initial_from(messages: list[dict]) -> list[dict]:
    """The system prompt and task of a segment's conversation (its first two messages)."""
    return [dict(m) for m in messages[:2]]


class _EpisodeState:
    """Counters, timings and finished segments of one episode."""

    _SAVED = ("start_time", "timing", "turns", "generated", "summaries", "content_tokens",
              "tool_call_tokens", "tool_output_tokens", "last_content_tokens",
              "final_from_content", "finish_reasons", "claimed", "info", "messages",
              "resumed_at", "resumed_tokens", "resumed_by")

    def __init__(self, start_time: float, t0: float):
        self.start_time, self.t0 = start_time, t0
        self.task_id = ""
        self.resumed_at: list[int] = []          # completed turns at each resume
        self.resumed_tokens: list[int] = []      # sampled tokens recorded at each resume
        self.resumed_by: list[str] = []          # why each resume happened (ck.state["cause"])
        self.segments: list[Segment] = []
        self.messages: list[list[dict]] = []
        self.timing = {"generate_s": 0.0, "tools_s": 0.0, "grade_s": 0.0}
        self.turns = self.generated = self.summaries = 0
        self.content_tokens = self.tool_call_tokens = self.tool_output_tokens = 0
        self.last_content_tokens = 0
        self.final_from_content = False
        self.finish_reasons: list[str] = []
        self.stop, self.final = "crashed", ""
        self.claimed = False
        self.info: dict = {}

    def to_state(self) -> dict:
        """The JSON-able state of a checkpoint (finished segments travel as segments)."""
        out = {k: getattr(self, k) for k in self._SAVED}
        out["elapsed_s"] = time.monotonic() - self.t0
        return out

    @classmethod
    def restore(cls, ck: EpisodeCheckpoint) -> "_EpisodeState":
        """The state at checkpoint `ck`, resumed now (the elapsed time carries on)."""
        st = ck.state["ep"]
        ep = cls(st["start_time"], time.monotonic() - st["elapsed_s"])
        for k in cls._SAVED:
            if k in st:
                setattr(ep, k, st[k])
        ep.segments = list(ck.segments[:-1])
        ep.resumed_at = list(ep.resumed_at) + [ck.turn]
        ep.resumed_tokens = list(ep.resumed_tokens) + [ep.generated]
        ep.resumed_by = list(ep.resumed_by) + [str(ck.state.get("cause", ""))]
        return ep

    def count_turn(self, body: list[int], call_ids: set[int]) -> None:
        cut = next((i for i, t in enumerate(body) if t in call_ids), len(body))
        self.content_tokens += cut
        self.last_content_tokens = cut
        self.tool_call_tokens += len(body) - cut

    def finish_timing(self) -> dict:
        return {"start_time": self.start_time, "duration_s": time.monotonic() - self.t0,
                **self.timing}

    def finish_info(self) -> dict:
        info = {"stop_reason": self.stop, "final_message": self.final, "claimed": self.claimed,
                "num_turns": self.turns,
                "generated_tokens": self.generated, "num_summaries": self.summaries,
                "finish_reasons": self.finish_reasons, **self.info}
        if self.messages:
            info["messages"] = self.messages
        if self.resumed_at:
            info["resumed_at_turns"] = list(self.resumed_at)
            info["resumed_tokens_saved"] = list(self.resumed_tokens)
            info["resumed_by"] = list(self.resumed_by)
        return info
