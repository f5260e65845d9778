"""The lookup variants of issue 27: the level stated in the prompt (difficulty-aware length) and
the long chains that need self-summarisation (scripted episodes through the token agent, no
model)."""
import dataclasses

import pytest

from composer_jax.agent import lookup as lk
from composer_jax.agent import lookup_long as ll
from composer_jax.agent.token_agent import ScriptedPolicy, TokenAgent


def _cfg(family, *extra):
    from composer_jax import registry
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.overrides import apply_overrides
    return apply_overrides(registry.get("rl_async").make_config(),
                           [f"rl.task={family}", *extra], SECTION_PRESETS)


def test_stated_level_prompts_differ_only_in_the_level_and_keep_the_split():
    from composer_jax.rl.tasks.lookup_levels import LookupLevelsFamily
    fam = LookupLevelsFamily(_cfg("composer_jax.rl.tasks.lookup_levels"))
    train, held = fam.make_tasks("train"), fam.make_tasks("eval")
    assert not {fam.task(t).key for t in train} & {fam.task(t).key for t in held}
    for tid in train[:2]:
        t = fam.task(tid)
        assert t.messages()[1]["content"] == f"Level {t.level}. Note {t.key}."
        assert t.messages()[0] == lk.make_tasks(1)[0].messages()[0]      # same system prompt
    assert {fam.task(t).level for t in train} == {"easy", "hard"}


def test_stated_level_episodes_pay_length_on_easy_only():
    """The same scripted episode (a preamble, a read, a finish) on an easy and on a hard task of
    the stated-level family: easy pays the concave length term, hard does not."""
    from tests.rl.test_lookup_episode import ScriptedEngine, _call
    from composer_jax.rl.tasks.lookup_levels import LookupLevelsFamily
    fam = LookupLevelsFamily(_cfg("composer_jax.rl.tasks.lookup_levels",
                                  "rl.task.length_weights=3,0"))
    tok = fam.tokenizer()
    out = {}
    for level in ("easy", "hard"):
        t = next(fam.task(i) for i in fam.make_tasks("train") if fam.task(i).level == level)
        texts = [_call("read_file", {"target_file": k}, n, "Let me read it." if n == 0 else "")
                 for n, k in enumerate(t.chain)]
        texts.append(_call("finish", {"message": t.code, "success": True}, len(t.chain)))
        eng = ScriptedEngine(tok, texts)
        out[level] = fam.episode(eng, t, 1, greedy=False)
        assert tok.decode(eng.fed[0]).count(f"Level {level}. Note {t.key}.") == 1
    easy, hard = out["easy"].reward, out["hard"].reward
    assert easy["resolved"] == hard["resolved"] == 1.0
    assert easy["length"] > 0.5 and hard["length"] == 0.0
    assert hard["effort"] > easy["effort"]          # more tokens on hard, and no penalty


@pytest.fixture(scope="module")
def long_family():
    from composer_jax.rl.tasks.lookup_long import LookupLongFamily
    cfg = _cfg("composer_jax.rl.tasks.lookup_long", "model.vocab_size=640", "rl.seq_len=256",
               "rl.summary_trigger_tokens=176")
    return LookupLongFamily(cfg)


def test_long_hard_chains_need_summaries_and_the_oracle_finishes_with_them(long_family):
    fam = long_family
    max_len = fam.engine_settings()["max_len"]
    tasks = [fam.task(t) for t in fam.make_tasks("eval")[:6]]
    for t in tasks:
        r = fam.scripted_episode(t)
        assert r.reward["resolved"] == 1.0 and r.info["stop_reason"] == "finish"
        assert all(len(s) <= max_len for s in r.segments)
        if t.level == "hard":
            assert len(t.chain) == 4 and r.info["num_summaries"] == 2
            assert r.info["summaries"] == [f"Next note {t.chain[2]}.", f"Code {t.code}."]
            assert r.info["summaries_correct"] == [True, True]
            # each summary is sampled (trainable) tokens of its segment: trained with the reward
            seg = r.segments[0]
            sampled = fam.tokenizer().decode(seg.tokens[seg.trainable].tolist())
            assert f"Next note {t.chain[2]}." in sampled
        else:
            assert r.info["num_summaries"] == 0 and len(r.segments) == 1
    # the same policy truncated at the window: hard chains end with a full context
    off = type(fam)(dataclasses.replace(fam.cfg, rl=dataclasses.replace(
        fam.cfg.rl, summary_trigger_tokens=0)))
    stops = {t.level: off.scripted_episode(t).info["stop_reason"] for t in tasks}
    assert stops == {"easy": "finish", "hard": "context_full"}


def test_a_wrong_summary_loses_the_episode(long_family):
    """The summary is the only way to carry progress across the reset: a summary naming the
    prompt's note again sends the agent back to the start, and the episode is not resolved."""
    fam = long_family
    from composer_jax.agent.forced_engine import ForcedEngine
    from composer_jax.rl.tasks.lookup_long import ll_book
    t = next(fam.task(i) for i in fam.make_tasks("eval") if fam.task(i).level == "hard")
    oracle = ll.Oracle(t)
    agent = TokenAgent(ForcedEngine(fam.engine_settings()["max_len"], 640), fam.tokenizer(),
                       fam.agent_config(True), fam.env_cfg,
                       policy=ScriptedPolicy(oracle, fam.tokenizer(),
                                             lambda m: f"Next note {t.key}."))
    r = agent.run_on(ll_book(t), t.messages(), t.task_id,
                     lambda book, ep: fam._score(agent, t, book, ep))
    assert r.reward["resolved"] == 0.0 and r.info["summaries_correct"][0] is False


def test_decision_thoughts_sit_where_each_level_decides():
    """thought_turn=decision: the optional thought precedes an easy task's only read and a hard
    task's second read (after the pointer); `first` puts it before call 0 on both levels; the
    texts are the plain family's preambles on both levels."""
    import random

    from composer_jax.rl.tasks.lookup_levels import demonstration, stated

    class Longest(random.Random):
        def choice(self, seq):
            return max(seq, key=len)
    for t in lk.make_tasks(4, 0, "train", lk.LEVELS):
        for mode, at in (("decision", len(t.chain) - 1), ("first", 0)):
            turns = [m for m in demonstration(stated(t), Longest(), thought_turn=mode)
                     if m["role"] == "assistant"]
            assert [m["content"] for m in turns] == [
                lk.PREAMBLES[-1] if i == at else "" for i in range(len(t.chain) + 1)]
    with pytest.raises(ValueError, match="thought_turn"):
        demonstration(stated(lk.make_tasks(1)[0]), Longest(), thought_turn="last")


def test_a_context_that_no_longer_fits_a_summary_ends_the_episode_within_the_window(long_family):
    """A policy that rambles fills the window faster than the trigger expects: when not even the
    summary request fits, the episode stops "context_full" and no segment passes rl.seq_len."""
    fam = long_family
    from composer_jax.agent.forced_engine import ForcedEngine
    from composer_jax.rl.tasks.lookup_long import ll_book
    t = next(fam.task(i) for i in fam.make_tasks("eval") if fam.task(i).level == "hard")
    oracle = ll.Oracle(t)

    def rambling(messages):
        return " ".join(["moss lamp reed"] * 30) + oracle(messages)
    agent = TokenAgent(ForcedEngine(fam.engine_settings()["max_len"], 640), fam.tokenizer(),
                       dataclasses.replace(fam.agent_config(True), max_new_tokens=120),
                       fam.env_cfg, policy=ScriptedPolicy(rambling, fam.tokenizer(),
                                                          oracle.summary))
    r = agent.run_on(ll_book(t), t.messages(), t.task_id,
                     lambda book, ep: fam._score(agent, t, book, ep))
    assert r.error is None and r.info["stop_reason"] == "context_full"
    assert max(len(s) for s in r.segments) <= fam.cfg.rl.seq_len


def test_letter_codes_are_key_like_and_the_oracle_reports_them(long_family):
    tasks = ll.make_tasks(6, 0, "eval", letter_codes=True)
    for t in tasks:
        assert len(t.code) == 2 and set(t.code) <= set(lk.LETTERS) and t.code not in t.chain
        assert ll.progress(t, [{"role": "tool", "content": dict(t.notes)[t.chain[-1]]}]) \
            == ("finish", t.code)
        assert ll.summary_text(("finish", t.code)) == f"Code {t.code}."


def test_verify_pays_on_hard_and_costs_on_easy():
    """rl.task.verify: a hard task's last note shows its draft on the first read, so only the
    re-read episode is correct; on easy the re-read is correct either way and costs length; the
    demonstrations re-read as often on both levels."""
    import random

    from tests.rl.test_lookup_episode import ScriptedEngine, _call
    from composer_jax.rl.tasks.lookup_levels import LookupLevelsFamily, verify_demonstration
    fam = LookupLevelsFamily(_cfg("composer_jax.rl.tasks.lookup_levels", "rl.task.verify=0.5",
                                  "rl.task.length_weights=3,0"))
    tok, out = fam.tokenizer(), {}
    for level in ("easy", "hard"):
        t = next(fam.task(i) for i in fam.make_tasks("train") if fam.task(i).level == level)
        assert (t.draft != "" and t.draft != t.code) if level == "hard" else t.draft == ""
        for reread in (False, True):
            reads = list(t.chain) + [t.chain[-1]] * reread
            texts = [_call("read_file", {"target_file": k}, n) for n, k in enumerate(reads)]
            seen = t.draft if (level == "hard" and not reread) else t.code
            texts.append(_call("finish", {"message": seen, "success": True}, len(reads)))
            eng = ScriptedEngine(tok, texts)
            out[level, reread] = fam.episode(eng, t, 1, greedy=False).reward
            assert f"code {seen}" in tok.decode(eng.fed[-1])      # what the last read showed
    assert out["hard", False]["resolved"] == 0.0 and out["hard", True]["resolved"] == 1.0
    assert out["hard", True]["length"] == 0.0
    assert out["easy", False]["resolved"] == out["easy", True]["resolved"] == 1.0
    assert out["easy", True]["total"] < out["easy", False]["total"] - 0.1
    rng, tasks = random.Random(0), [fam.task(i) for i in fam.make_tasks("train")[:200]]
    rate = {lv: [] for lv in ("easy", "hard")}
    for t in tasks:
        demo = verify_demonstration(t, rng, verify=0.5)
        rate[t.level].append(sum(m["role"] == "tool" for m in demo) > len(t.chain))
        assert (demo[-1]["raw"].count(f'"message": "{t.code}"') == 1) == (
            t.level == "easy" or rate[t.level][-1])
    assert all(0.35 < sum(v) / len(v) < 0.65 for v in rate.values())


def test_marked_draft_labels_only_the_draft_read():
    """rl.task.draft_shown=marked: the first read of a hard task's last note says `(draft)`, its
    re-read and every easy read are plain; the demonstrations still re-read as often on both
    levels and finish with the code alone."""
    import random

    from composer_jax.errors import ConfigError
    from composer_jax.rl.tasks.lookup_levels import (DraftBook, LookupLevelsFamily,
                                                     verify_demonstration)
    fam = LookupLevelsFamily(_cfg("composer_jax.rl.tasks.lookup_levels", "rl.task.verify=0.5",
                                  "rl.task.draft_shown=marked"))
    for level in ("easy", "hard"):
        t = next(fam.task(i) for i in fam.make_tasks("train") if fam.task(i).level == level)
        book = DraftBook(t)
        seen = [book.call("read_file", {"target_file": k}).output
                for k in list(t.chain) + [t.chain[-1]]]
        if level == "hard":
            assert seen[-2] == f"code {t.draft} (draft)" and seen[-1] == f"code {t.code}"
        else:
            assert "(draft)" not in " ".join(seen) and seen[-1] == f"code {t.code}"
    rng, n_re = random.Random(0), {"easy": [], "hard": []}
    for i in fam.make_tasks("train")[:200]:
        t = fam.task(i)
        demo = verify_demonstration(t, rng, verify=0.5)
        n_re[t.level].append(sum(m["role"] == "tool" for m in demo) > len(t.chain))
        assert "(draft)" not in demo[-1]["raw"]
    assert all(0.35 < sum(v) / len(v) < 0.65 for v in n_re.values())
    with pytest.raises(ConfigError, match="draft_shown"):
        _cfg("composer_jax.rl.tasks.lookup_levels", "rl.task.draft_shown=marked")
