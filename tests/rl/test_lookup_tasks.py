"""The lookup task family: disjoint splits on rendered tokens, in-process tools with the repository's
schemas, the rule grade, the structured claim and the behaviour reward terms."""
import random

import pytest

from composer_jax.env import protocol
from composer_jax.env.rewards import EffortCounts, compute_reward
from composer_jax.agent import lookup as lt


@pytest.fixture(scope="module")
def tok():
    return lt.lookup_tokenizer()


def test_train_and_heldout_prompts_are_disjoint_on_rendered_tokens(tok):
    from composer_jax.data.chat import encode_prompt
    train = lt.make_tasks(400, 0, "train", lt.LEVELS)
    held = lt.make_tasks(200, 0, "eval", lt.LEVELS)
    tr = {tuple(encode_prompt(tok, t.messages())) for t in train}
    ev = {tuple(encode_prompt(tok, t.messages())) for t in held}
    assert not tr & ev
    assert len(ev) == len(lt.keys_of("eval")) == 18 and len(lt.keys_of("train")) == 72
    assert {t.key for t in train} <= set(lt.keys_of("train"))
    # every letter occurs in both splits; each key is two one-letter tokens in the prompt and in
    # a call, in both splits (a held-out key is a new combination, not a new token)
    assert set("".join(lt.keys_of("eval"))) == set("".join(lt.keys_of("train"))) == set(lt.LETTERS)
    letters = {tok.encode(c)[0] for c in lt.LETTERS}
    assert len(letters) == 10
    for t in train[:20] + held[:20]:
        ids = encode_prompt(tok, t.messages())
        pos = [i for i, x in enumerate(ids) if x in letters]
        assert [tok.decode([ids[i]]) for i in pos] == list(t.key)
        call = tok.encode(protocol.render_tool_call("read_file", {"target_file": t.key}, 0))
        assert [tok.decode([x]) for x in call if x in letters] == list(t.key)


def test_tasks_are_deterministic_and_need_the_prompt_and_the_tools():
    a = lt.make_tasks(50, 3, "train", lt.LEVELS)
    assert a == lt.make_tasks(50, 3, "train", lt.LEVELS)
    assert a != lt.make_tasks(50, 4, "train", lt.LEVELS)
    for t in a:
        notes = dict(t.notes)
        assert len(notes) == 4 and t.key in notes
        codes = [v for v in notes.values() if v.startswith("code ")]
        assert len(set(codes)) == len(codes)                 # a distractor never has the answer
        assert len(t.chain) == (1 if t.level == "easy" else 2)
        assert notes[t.chain[-1]] == f"code {t.code}"
    # the answer is not a function of the prompt: the same key gets different codes
    by_key = {}
    for t in lt.make_tasks(400, 0, "train"):
        by_key.setdefault(t.key, set()).add(t.code)
    assert max(len(v) for v in by_key.values()) >= 3


def test_notebook_uses_the_repository_tool_schemas():
    t = lt.make_tasks(1, 0, "train", ("hard",))[0]
    book = lt.NoteBook(t)
    r = book.call("read_file", {"target_file": t.key})
    assert r.output.startswith("see ") and not r.is_error
    assert book.call("read_file", {"target_file": "ZZ"}).is_error
    assert book.call("read_file", {"path": t.key}).output.startswith("Error: read_file: missing")
    assert book.call("run_terminal_cmd", {"command": "ls"}).is_error
    assert book.call("finish", {"message": "1", "success": "yes"}).is_error    # typed schema
    assert (book.num_calls, book.num_invalid_calls) == (5, 4)
    assert book.call("finish", {"message": t.code, "success": True}).finished
    g = lt.grade(t, book)
    assert g.correct and g.claimed and g.finished


def test_demonstration_is_an_optimal_episode():
    rng = random.Random(0)
    for t in lt.make_tasks(20, 0, "eval", lt.LEVELS):
        msgs = lt.demonstration(t, rng)
        book = lt.NoteBook(t)
        calls = 0
        for m in msgs:
            if m["role"] == "assistant":
                for c in protocol.parse_assistant(m["raw"], first_index=calls).tool_calls:
                    book.execute(c)
                    calls += 1
        assert lt.grade(t, book).correct and book.num_invalid_calls == 0
        assert calls == len(t.chain) + 1 >= 2


def _reward(correct, claimed, message="7", content=0, level_weight=1.0):
    from composer_jax.rl.tasks.lookup import lookup_env_config
    cfg = lookup_env_config()
    return compute_reward(resolved=correct, f2p_fraction=0.0, num_calls=2, num_invalid_calls=0,
                          num_tokens=30 + content, num_turns=2, changed_files=(),
                          editable_files=(), final_message=message, cfg=cfg,
                          counts=EffortCounts(content, 30, 10, 1), claimed=claimed,
                          length_weight=level_weight)


def test_false_claim_and_communication_come_from_the_structured_claim():
    wrong_claimed = _reward(False, True, "Fixed; the failing tests pass now.")
    assert wrong_claimed.false_claim == 0.2 and wrong_claimed.communication == 0.0
    wrong_honest = _reward(False, False, "Fixed; the failing tests pass now.")
    assert wrong_honest.false_claim == 0.0
    right = _reward(True, True, "Fixed; the failing tests pass now.")  # prose the regex doubted
    assert right.communication == 0.05 and right.false_claim == 0.0
    assert _reward(True, False).communication == 0.0     # not reported as done: no bonus
    assert wrong_claimed.total < wrong_honest.total < right.total


def test_length_term_is_concave_and_difficulty_aware():
    short, mid, long_ = (_reward(True, True, content=c) for c in (0, 20, 40))
    assert short.length < mid.length < long_.length
    assert (mid.length - short.length) > (long_.length - mid.length) > 0       # concave
    assert mid.length - short.length > 0.02                                    # it matters
    assert _reward(True, True, content=40, level_weight=0.0).length == 0.0    # hard: no penalty
