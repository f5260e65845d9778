"""SFT samples from the environment: protocol markers as special tokens, the assistant-only mask of a
rendered oracle transcript, skipped episodes, the env_oracle source end to end, bad pool paths."""

from __future__ import annotations

import dataclasses
import json
import types

import numpy as np
import pytest

from composer_jax.data import chat, sft_env, targets
from composer_jax.data import special_tokens as st
from composer_jax.data.config import SftSource
from composer_jax.data.errors import DataError
from composer_jax.data.loaders import make_sft_iterator
from composer_jax.data.sft import build_or_load_sft, resolve_source
from composer_jax.env import protocol
from composer_jax.env.tools import TOOL_SPECS, dispatch

GOOD = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BAD = GOOD.replace("return a + b", "return a - b")
TESTS = ("import unittest\nimport mod\n\n\nclass T(unittest.TestCase):\n"
         "    def test_add(self):\n        self.assertEqual(mod.add(2, 3), 5)\n\n"
         "    def test_sub(self):\n        self.assertEqual(mod.sub(5, 3), 2)\n")


def _transcript() -> list[dict]:
    """An oracle-like conversation: two tool-call turns with results, then `finish` and its echo."""
    def call(name, args, index):
        return {"call_id": protocol.call_id(name, index), "name": name, "arguments": args, "raw": "",
                "error": None}
    return [
        {"role": "system", "content": protocol.SYSTEM_PROMPT},
        {"role": "user", "content": "test_add fails; fix mod.py"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("search_replace", {"file_path": "mod.py", "old_string": "a - b\n\n\ndef sub",
                                    "new_string": "a + b\n\n\ndef sub"}, 0)]},
        {"role": "tool", "tool_call_id": "functions.search_replace:0", "content": "Edited mod.py"},
        {"role": "assistant", "content": "Now the tests.", "tool_calls": [
            call("run_terminal_cmd", {"command": "python -m unittest -q test_mod"}, 1)]},
        {"role": "tool", "tool_call_id": "functions.run_terminal_cmd:1", "content": "OK\n[exit code 0]"},
        {"role": "assistant", "content": "", "tool_calls": [call("finish", {"message": "Fixed."}, 2)]},
    ]


def _assistant_bodies(messages) -> list[str]:
    """What the policy generates for each assistant turn: content + tool-call section + <|im_end|>."""
    return [protocol.render_assistant(m["content"], [(c["name"], c["arguments"]) for c in m["tool_calls"]],
                                      first_index=int(m["tool_calls"][0]["call_id"].rsplit(":", 1)[1]))
            + protocol.IM_END for m in messages if m["role"] == "assistant"]


def _trained_runs(ids, trainable) -> list[list[int]]:
    """The maximal runs of consecutive trainable ids."""
    mask = np.asarray(trainable) != 0
    edges = np.flatnonzero(np.diff(np.r_[0, mask, 0]))
    return [list(ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]


def test_protocol_markers_are_single_reserved_ids(small_data):
    _, _, tok = small_data
    for marker in protocol.SPECIAL_TOKENS:
        assert marker in st.ALL_SPECIAL_TOKENS
        assert tok.encode(marker) == [tok.special.by_token[marker]]
        assert tok.decode(tok.encode(f"x{marker}y")) == f"x{marker}y"
    assert st.ALL_SPECIAL_TOKENS[:3] == (st.PAD, st.BOS, st.EOS)  # ids 0..2 never move


def test_mask_covers_exactly_the_assistant_turns(small_data):
    _, _, tok = small_data
    messages = _transcript()
    ids, trainable = chat.encode_messages(tok, messages, TOOL_SPECS)
    assert len(ids) == len(trainable)
    full = st.BOS + protocol.render_prompt(messages, TOOL_SPECS, add_generation_prompt=False)
    assert tok.decode(ids) == full
    assert ids == tok.encode(full)  # piecewise encoding equals encoding the whole text
    runs = _trained_runs(ids, trainable)
    assert [tok.decode(r) for r in runs] == _assistant_bodies(messages)
    untrained = tok.decode([i for i, t in zip(ids, trainable) if not t])
    expected = full
    for body in _assistant_bodies(messages):
        expected = expected.replace(body, "", 1)
    assert untrained == expected
    for marker in (protocol.TOOL_CALLS_BEGIN, protocol.TOOL_CALL_BEGIN, protocol.TOOL_CALL_END):
        assert untrained.count(marker) == 0  # every tool call is trained
    assert protocol.SYSTEM_PROMPT in untrained and "test_add fails" in untrained and "[exit code 0]" in untrained
    assert untrained.count(chat.ASSISTANT_HEADER) == 3  # headers are the generation prompt, untrained
    # the prefix before each trained run is exactly the policy's prompt at that turn
    starts = np.flatnonzero(np.diff(np.r_[0, trainable]) == 1)
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    for start, k in zip(starts, turns):
        assert ids[:start] == chat.encode_prompt(tok, messages[:k], TOOL_SPECS)


def test_argument_value_starts():
    args = {"file_path": "a.py", "n": 3, "e": "", "u": "\u00e9\u65e5 x", "q": '"hi"', "f": None}
    text = "pre" + protocol.render_assistant("thinking", [("edit", args), ("finish", {"message": "ok"})])
    assert [text[s] for s in chat.argument_value_starts(text)] == ["a", "\u00e9", "\\", "o"]
    broken = (protocol.TOOL_CALL_BEGIN + "functions.x:0" + protocol.TOOL_CALL_ARG_BEGIN + '{"a": "b"'
              + protocol.TOOL_CALL_END)
    assert len(chat.argument_value_starts(broken + text)) == 4      # the malformed call adds none
    spaced = text.replace('"file_path": ', '"file_path":  ')        # not how calls are rendered
    assert len(chat.argument_value_starts(spaced)) == 1             # that call is skipped, not mis-marked


def test_argument_values_first_tokens_are_marked(small_data):
    """mark_values: the same ids and trained tokens; code VALUE_START exactly on the token holding
    each string argument value's first character."""
    _, _, tok = small_data
    messages = _transcript()
    plain_ids, plain = chat.encode_messages(tok, messages, TOOL_SPECS)
    ids, marked = chat.encode_messages(tok, messages, TOOL_SPECS, mark_values=True)
    assert ids == plain_ids and [t != 0 for t in marked] == [t != 0 for t in plain]
    assert set(plain) == {0, 1} and set(marked) == {0, chat.TRAINED, chat.VALUE_START}
    assert targets.VALUE_START == chat.VALUE_START            # the pipeline weighs the code chat writes
    values = [v for m in messages if m["role"] == "assistant" for c in m["tool_calls"]
              for v in c["arguments"].values()]
    firsts = [i for i, t in enumerate(marked) if t == chat.VALUE_START]
    assert len(firsts) == len(values) == 5
    for i, value in zip(firsts, values):
        before, through = tok.decode(ids[:i]), tok.decode(ids[:i + 1])
        assert before.rsplit('": ', 1)[1] in ("", '"')               # the value has not begun
        started = through.rsplit('": "', 1)[1]
        assert started and value.startswith(started)                 # it has, with this token


def test_turn_windows_train_one_turn_after_what_it_answers(small_data):
    _, _, tok = small_data
    messages = _transcript()
    windows = sft_env.turn_windows(messages)
    assert windows == [messages[1:3], messages[3:5], messages[5:7]]
    for window, body in zip(windows, _assistant_bodies(messages)):
        ids, trainable = chat.encode_messages(tok, window, (), mark_values=True)
        assert [tok.decode(r) for r in _trained_runs(ids, trainable)] == [body]
        assert tok.decode(ids).startswith(st.BOS + protocol.render_prompt([window[0]], add_generation_prompt=False))


def test_edit_windows_keep_only_the_turns_that_edit():
    messages = _transcript()
    assert sft_env.turn_windows(messages, edits_only=True) == [messages[1:3]]   # the search_replace turn
    no_edit = [m for m in messages if not m.get("tool_calls") or m["tool_calls"][0]["name"] != "search_replace"]
    assert sft_env.turn_windows(no_edit, edits_only=True) == []


def test_edit_tails_keep_the_last_frame_and_its_error():
    out = ("----\nTraceback (most recent call last):\n  File \"/workspace/test_m.py\", line 9, in test_a\n"
           "    m.f()\n  File \"/workspace/m.py\", line 3, in f\n    return _nrm(x)\n           ^^^^\n"
           "NameError: name '_nrm' is not defined. Did you mean: '_norm'?\n\n----\nRan 2 tests\n\nFAILED (errors=1)")
    tail = ("  File \"/workspace/m.py\", line 3, in f\n    return _nrm(x)\n           ^^^^\n"
            "NameError: name '_nrm' is not defined. Did you mean: '_norm'?")
    assert sft_env.traceback_tail(out) == tail
    assert sft_env.traceback_tail("OK\n[exit code 0]") is None
    assert sft_env.traceback_tail('  File "/workspace/m.py", line 3') is None       # no error line under it
    turn = {"role": "assistant", "content": "", "tool_calls": []}
    assert sft_env.tail_window([{"role": "tool", "content": out}, turn]) == [{"role": "tool", "content": tail}, turn]
    assert sft_env.tail_window([{"role": "user", "content": out}, turn]) is None       # only tool outputs


def test_window_samples_per_mode():
    """What each data.sft_turn_windows mode adds for a conversation whose edit answers a traceback."""
    from composer_jax.data.config import TurnWindows

    m = _transcript()
    traceback = ('Traceback (most recent call last):\n  File "/workspace/mod.py", line 2, in add\n'
                 "    return a - b\nAssertionError: -1 != 5\n\nFAILED (failures=1)")
    run = {"role": "assistant", "content": "", "tool_calls": [
        {"call_id": protocol.call_id("run_terminal_cmd", 0), "name": "run_terminal_cmd",
         "arguments": {"command": "python -m unittest"}, "raw": "", "error": None}]}
    conv = [*m[:2], run, {"role": "tool", "tool_call_id": run["tool_calls"][0]["call_id"], "content": traceback}, *m[2:]]
    edit_turn = conv[4]
    assert sft_env.window_samples([conv], TurnWindows.NONE) == []
    assert [w[1] for w in sft_env.window_samples([conv], TurnWindows.ALL)] == [conv[2], conv[4], conv[6], conv[8]]
    assert sft_env.window_samples([conv], TurnWindows.EDIT_ONLY) == [[conv[3], edit_turn]]
    tail = {**conv[3], "content": sft_env.traceback_tail(traceback)}
    for mode in (TurnWindows.EDIT_TAILS, TurnWindows.EPISODES_AND_EDIT_TAILS):
        assert sft_env.window_samples([conv, conv], mode) == [[tail, edit_turn]] * 2
    assert sft_env.window_samples([m], TurnWindows.EDIT_TAILS) == []        # that edit answers no traceback
    assert set(sft_env.WINDOWS_ONLY) == {TurnWindows.EDIT_ONLY, TurnWindows.EDIT_TAILS}
    # data.sft_window_context=K: the same windows with 1..K earlier messages too, up to the system
    # prompt (conv[0]), the traceback cut in each
    assert conv[0]["role"] == "system" and conv[1]["role"] == "user"
    assert sft_env.window_samples([conv], TurnWindows.EDIT_TAILS, context=5) == [
        [tail, edit_turn], [conv[2], tail, edit_turn], [conv[1], conv[2], tail, edit_turn],
        [conv[0], conv[1], conv[2], tail, edit_turn]]
    assert sft_env.window_samples([conv], TurnWindows.EDIT_ONLY, context=1) == [[conv[3], edit_turn],
                                                                                [conv[2], conv[3], edit_turn]]
    assert len(sft_env.window_samples([conv], TurnWindows.ALL, context=1)) == 4 + 4


def _episode(resolved=True, stop="finish", invalid=0):
    return types.SimpleNamespace(grade=types.SimpleNamespace(resolved=resolved), stop_reason=stop,
                                 num_invalid_calls=invalid, messages=_transcript() + [
                                     {"role": "tool", "tool_call_id": "functions.finish:2", "content": "Fixed."}])


def test_unresolved_or_unfinished_episodes_are_skipped(small_data):
    _, _, tok = small_data
    messages = sft_env.episode_messages(_episode())
    assert messages == _transcript()  # the trailing finish echo is dropped
    assert sft_env.episode_sample(tok, _episode(), TOOL_SPECS) == chat.encode_messages(tok, messages, TOOL_SPECS,
                                                                                     mark_values=True)
    for bad in (_episode(resolved=False), _episode(stop="max_turns"), _episode(invalid=1)):
        assert sft_env.episode_messages(bad) is None
        assert sft_env.episode_sample(tok, bad, TOOL_SPECS) is None


def test_hasty_demonstration_runs_once_then_finishes_without_an_edit(small_data):
    _, _, tok = small_data
    careful = _transcript()
    hasty = sft_env.hasty_messages(careful)
    assert hasty[:4] == careful[:4] and len(hasty) == 5          # the first call and its result kept
    (call,) = hasty[-1]["tool_calls"]
    assert call["name"] == "finish" and call["call_id"] == protocol.call_id("finish", 1)
    assert call["arguments"] == sft_env.HASTY_FINISH and call["error"] is None
    ids, trainable = chat.encode_messages(tok, hasty, TOOL_SPECS)
    runs = [tok.decode(r) for r in _trained_runs(ids, trainable)]
    assert runs == _assistant_bodies(hasty) and "finish" in runs[-1] and "search_replace" in runs[0]
    assert sft_env.hasty_messages(careful[:3]) is None          # no tool result yet: no variant
    # the share of tasks picked follows the fraction, deterministically by task id
    picked = [sft_env.is_hasty(f"level1-task-{i}", 0.3) for i in range(2000)]
    assert 0.27 < sum(picked) / 2000 < 0.33
    assert picked == [sft_env.is_hasty(f"level1-task-{i}", 0.3) for i in range(2000)]
    assert not any(sft_env.is_hasty(f"level1-task-{i}", 0.0) for i in range(200))
    assert all(sft_env.is_hasty(f"level1-task-{i}", 1.0) for i in range(200))


def test_recovery_demonstration_trains_the_edit_after_a_failed_one_and_not_the_failure(small_data, tmp_path):
    _, _, tok = small_data
    careful = _transcript()
    recovery = sft_env.recovery_messages(careful)
    mistake, answer = recovery[2], recovery[3]
    assert recovery[:2] == careful[:2] and len(recovery) == len(careful) + 2
    (bad,) = mistake["tool_calls"]
    args = careful[2]["tool_calls"][0]["arguments"]
    assert bad["name"] == "search_replace" and bad["arguments"] == {**args, "new_string": args["old_string"]}
    # the error is the one the real tool gives for that call
    (tmp_path / "mod.py").write_text(BAD)
    real = dispatch(types.SimpleNamespace(root=tmp_path), "search_replace", bad["arguments"])
    assert real.is_error and answer["content"] == real.output and (tmp_path / "mod.py").read_text() == BAD
    # every later call moves up one id, its result with it; the conversation is otherwise the careful one
    ids = [c["call_id"] for m in recovery if m["role"] == "assistant" for c in m["tool_calls"]]
    assert ids == ["functions.search_replace:0", "functions.search_replace:1", "functions.run_terminal_cmd:2",
                   "functions.finish:3"]
    assert [m["tool_call_id"] for m in recovery if m["role"] == "tool"] == ids[:3]
    def without_ids(messages):
        return [{**m, "tool_call_id": "", "tool_calls": [{**c, "call_id": ""} for c in m.get("tool_calls", ())]}
                for m in messages]
    assert without_ids(recovery[4:]) == without_ids(careful[2:])
    # trained: the right edit and every turn after it; the mistaken call never
    ids_, trainable = chat.encode_messages(tok, recovery, TOOL_SPECS)
    runs = [tok.decode(r) for r in _trained_runs(ids_, trainable)]
    assert runs == _assistant_bodies([m for m in recovery if m.get("trained", True)])
    assert len(runs) == 3 and '"new_string": "a + b' in runs[0]
    assert sft_env.recovery_messages(careful[:2]) is None            # no edit: no variant
    picked = [sft_env.is_recovery(f"level1-task-{i}", 0.5) for i in range(2000)]
    hasty = [sft_env.is_hasty(f"level1-task-{i}", 0.5) for i in range(2000)]
    assert 0.46 < sum(picked) / 2000 < 0.54 and 0.4 < np.mean(np.equal(picked, hasty)) < 0.6   # not the hasty ones


# --- a tiny task pool: one fixable training task, one whose "reference" does not fix the bug, one
# evaluation task (never used for training) ---

def _pool(root):
    from composer_jax.env.pythons import find_pythons
    from composer_jax.env.tasks.pool import TaskPool
    from composer_jax.env.tasks.task import Task, unified_patch

    version = max(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))
    pool = TaskPool(root)
    not_a_fix = BAD.replace("a - b\n\n\n", "a - b  # unchanged\n\n\n")
    for task_id, split, fixed in (("a-good", "train", GOOD), ("b-nofix", "train", not_a_fix),
                                  ("c-eval", "eval", GOOD)):
        patch, n = unified_patch({"mod.py": BAD}, {"mod.py": fixed})
        task = Task(task_id, "bug", split, version, "mod", "test_add fails; fix mod.py",
                    ("test_mod.T.test_add",), ("test_mod.T.test_sub",), ("mod.py",), ("test_mod.py",),
                    patch, n, version, version)
        pool.add(task, {"mod.py": BAD, "test_mod.py": TESTS}, {"mod.py": fixed})
    return version


@pytest.fixture(scope="module")
def tiny_pool(tmp_path_factory):
    from composer_jax.env.sandbox import bwrap_works

    if not bwrap_works():
        pytest.skip("bubblewrap is not usable here")
    root = tmp_path_factory.mktemp("sftpool") / "pool"
    _pool(root)
    return root


def test_env_oracle_source_end_to_end(small_data, tiny_pool):
    from composer_jax.agent.episode import run_episode
    from composer_jax.env.config import EnvConfig

    cfg, corpus, tok = small_data
    cfg = dataclasses.replace(cfg, sft_source=SftSource.ENV_ORACLE, sft_pool=str(tiny_pool), seq_len=4096,
                              global_batch_size=1)
    env_cfg = EnvConfig(command_timeout_s=10.0, use_embeddings=False)
    with pytest.raises(DataError, match="not built yet.*episode loop"):
        build_or_load_sft(cfg, corpus, tok, env_cfg)      # the data layer runs no episodes itself
    store = build_or_load_sft(cfg, corpus, tok, env_cfg, run_episode)
    info = sft_env.store_info(store)
    assert (info["tasks"], info["samples"], info["skipped"]) == (2, 1, 1)  # the eval task is never run
    assert info["skipped_tasks"][0].startswith("b-nofix")
    ids, trainable = store.doc(0).tolist(), store.trainable(0).tolist()
    bodies = [tok.decode(r) for r in _trained_runs(ids, trainable)]
    assert [b.split(protocol.TOOL_CALL_ARG_BEGIN)[0] for b in bodies] == [
        protocol.TOOL_CALLS_BEGIN + protocol.TOOL_CALL_BEGIN + protocol.call_id(name, i)
        for i, name in enumerate(("search_replace", "run_terminal_cmd", "finish"))]
    assert all(b.endswith(protocol.TOOL_CALLS_END + protocol.IM_END) for b in bodies)
    text = tok.decode(ids)
    assert text.startswith(st.BOS + protocol.IM_SYSTEM + "tool_declare") and "test_add fails" in text
    # cached: a second call builds nothing (no episodes run) and returns the same store
    assert build_or_load_sft(cfg, corpus, tok).directory == store.directory
    # the iterator trains exactly on the assistant bodies
    batch = next(make_sft_iterator(cfg, tok, 1, 0, 1, corpus=corpus))
    mask = batch["loss_mask"][0] > 0
    assert tok.decode(batch["targets"][0][mask]) == "".join(bodies)
    # argument values' first tokens are marked in the store and weigh data.sft_value_weight
    firsts = [ids[i] for i, t in enumerate(trainable) if t == chat.VALUE_START]
    assert info["value_start_tokens"] == len(firsts) == 5
    weighted = next(make_sft_iterator(dataclasses.replace(cfg, sft_value_weight=4.0), tok, 1, 0, 1, corpus=corpus))
    assert sorted(set(weighted["loss_mask"][0].tolist())) == [0.0, 1.0, 4.0]
    assert weighted["targets"][0][weighted["loss_mask"][0] == 4].tolist() == firsts
    assert ((weighted["loss_mask"][0] > 0) == mask).all()


def test_edit_only_store_holds_just_the_edit_windows(small_data, tiny_pool, monkeypatch, tmp_path):
    """data.sft_turn_windows=edit_only on a ladder pool: no whole demonstration, one sample per edit
    turn (the turn after only the message it answers); the store has its own cache key. (The tiny
    pool's "bug" task stands in for a ladder kind.)"""
    from composer_jax.agent.episode import run_episode
    from composer_jax.env.config import EnvConfig

    cfg, corpus, tok = small_data
    monkeypatch.setattr(sft_env, "LADDER_KINDS", ("bug",))
    monkeypatch.setattr(sft_env, "replacement_names", lambda pool: [f"name{i}" for i in range(40)])
    cfg = dataclasses.replace(cfg, sft_source=SftSource.ENV_ORACLE, sft_pool=str(tiny_pool), seq_len=4096,
                              global_batch_size=1, sft_turn_windows="edit_only", sft_renames=2,
                              cache_dir=str(tmp_path))
    store = build_or_load_sft(cfg, corpus, tok, EnvConfig(command_timeout_s=10.0, use_embeddings=False), run_episode)
    info = sft_env.store_info(store)
    # the careful demonstration and its 2 renamed copies each give one edit window, and nothing else
    assert (info["tasks"], info["renamed"], info["samples"], info["windows"], info["skipped"]) == (2, 2, 3, 3, 1)
    ids, trainable = store.doc(0).tolist(), store.trainable(0).tolist()
    text = tok.decode(ids)
    assert protocol.SYSTEM_PROMPT not in text and "test_add fails" in text       # the user's message only
    assert all(protocol.SYSTEM_PROMPT not in tok.decode(store.doc(i).tolist()) for i in range(3))
    [body] = [tok.decode(r) for r in _trained_runs(ids, trainable)]
    assert body.split(protocol.TOOL_CALL_ARG_BEGIN)[0].endswith(protocol.call_id("search_replace", 0))
    assert sum(t == chat.VALUE_START for t in trainable) == 3                  # file, old text, new text
    whole = dataclasses.replace(cfg, sft_turn_windows="none")
    assert build_or_load_sft(whole, corpus, tok, EnvConfig(command_timeout_s=10.0, use_embeddings=False),
                             run_episode).directory != store.directory


def test_window_renames_add_windows_without_whole_demonstrations(small_data, tiny_pool, monkeypatch, tmp_path):
    """data.sft_window_renames=3 beside sft_renames=1: the careful demonstration and one renamed copy
    as whole samples, the windows of the careful one and three renamed copies; its own cache key."""
    from composer_jax.agent.episode import run_episode
    from composer_jax.env.config import EnvConfig

    cfg, corpus, tok = small_data
    monkeypatch.setattr(sft_env, "LADDER_KINDS", ("bug",))
    monkeypatch.setattr(sft_env, "replacement_names", lambda pool: [f"name{i}" for i in range(40)])
    env = EnvConfig(command_timeout_s=10.0, use_embeddings=False)
    cfg = dataclasses.replace(cfg, sft_source=SftSource.ENV_ORACLE, sft_pool=str(tiny_pool), seq_len=4096,
                              global_batch_size=1, sft_turn_windows="all", sft_renames=1, cache_dir=str(tmp_path))
    same = build_or_load_sft(cfg, corpus, tok, env, run_episode)
    more = build_or_load_sft(dataclasses.replace(cfg, sft_window_renames=3), corpus, tok, env, run_episode)
    one, three = sft_env.store_info(same), sft_env.store_info(more)
    assert (one["renamed"], three["renamed"]) == (1, 3)
    per_conversation = one["windows"] // 2                            # careful + 1 renamed copy
    assert per_conversation > 0 and one["samples"] == 2 + 2 * per_conversation
    assert three["windows"] == 4 * per_conversation and three["samples"] == 2 + 4 * per_conversation
    assert more.directory != same.directory
    # sft_window_renames equal to sft_renames is the store without it (the key of earlier stores)
    assert build_or_load_sft(dataclasses.replace(cfg, sft_window_renames=1), corpus, tok, env,
                             run_episode).directory == same.directory


def test_oracle_text_is_what_the_sample_trains(small_data, tiny_pool):
    """The trained text of each assistant turn is exactly what the agent emitted, plus <|im_end|>."""
    from composer_jax.env.agents import OracleAgent
    from composer_jax.env.config import EnvConfig
    from composer_jax.agent.episode import run_episode
    from composer_jax.env.tasks.pool import TaskPool

    _, _, tok = small_data
    pool = TaskPool(tiny_pool)
    task = next(t for t in pool.tasks() if t.task_id == "a-good")
    oracle, emitted = OracleAgent(task, pool.task_dir(task.task_id)), []

    def recording(messages):
        emitted.append(oracle(messages))
        return emitted[-1]

    episode = run_episode(recording, task, pool.task_dir(task.task_id), EnvConfig(use_embeddings=False))
    ids, trainable = sft_env.episode_sample(tok, episode, TOOL_SPECS)
    assert [tok.decode(r) for r in _trained_runs(ids, trainable)] == [e + protocol.IM_END for e in emitted]


def test_bad_pool_paths_give_a_clear_error(small_data, tmp_path):
    cfg, corpus, tok = small_data
    (tmp_path / "empty").mkdir()
    evals = tmp_path / "evalpool"
    evals.mkdir()
    (evals / "manifest.json").write_text(json.dumps({"num_tasks": 1, "tasks": [{"task_id": "x", "split": "eval"}]}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    cases = {"": "no task pool given", str(tmp_path / "missing"): "no such directory",
             str(tmp_path / "empty"): "no manifest.json", str(evals): "only evaluation tasks",
             str(tmp_path / "broken"): "unreadable manifest.json"}
    for path, why in cases.items():
        bad = dataclasses.replace(cfg, sft_source="env_oracle", sft_pool=path)
        for call in (lambda: resolve_source(bad), lambda: build_or_load_sft(bad, corpus, tok)):
            with pytest.raises(DataError, match=why) as err:
                call()
            assert "--experiment=env_generate --workdir=W" in str(err.value)
            assert "--set data.sft_source=docstrings" in str(err.value)
    assert not (tmp_path / "missing").exists()  # checking a path never creates it


def test_auto_source_picks_a_pool_else_docstrings(small_data, tiny_pool, tmp_path):
    cfg, _, _ = small_data
    for pool, why in (("", "no task pool given"), (str(tmp_path / "missing"), "missing: no such directory"),
                      (str(tmp_path), "no manifest.json")):
        resolved, line = resolve_source(dataclasses.replace(cfg, sft_source="auto", sft_pool=pool))
        assert resolved.sft_source == SftSource.DOCSTRINGS and "docstring -> function" in line
        assert why in line and "env_generate" in line
    resolved, line = resolve_source(dataclasses.replace(cfg, sft_source="auto", sft_pool=str(tiny_pool)))
    assert resolved.sft_source == SftSource.ENV_ORACLE and "oracle" in line
    resolved, _ = resolve_source(dataclasses.replace(cfg, sft_source="docstrings", sft_pool=str(tiny_pool)))
    assert resolved.sft_source == SftSource.DOCSTRINGS
