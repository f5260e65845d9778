"""Which earlier messages switch a policy's file-name lookup off (issue 41, results section 25).

For the first N held-out level-1 tasks of a pool, the oracle's demonstration is cut after the
edit call's `"file_path": "` and scored teacher-forced with some of the messages before the edit
turn removed; printed per variant: the mean probability of the file name's first token and the
argmax at that position. A lookup that reads the traceback gives the same p whatever comes
before the tool output; one that only works right after a short output drops when any message
precedes it.

  python benchmarks/ladder_context_probe.py --policy runs/tsft_l1g@400 --pool runs/ladder1/pool [--tasks 12]
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib

import numpy as np

# variant name -> which messages before the edit turn to keep (system, task statement, first call, tool output)
VARIANTS = {
    "whole": ("system", "user", "call", "tool"),
    "no system prompt": ("user", "call", "tool"),
    "no task statement": ("system", "call", "tool"),
    "no first call": ("system", "user", "tool"),
    "first call + output": ("call", "tool"),
    "task statement + output": ("user", "tool"),
    "output alone": ("tool",),
}


def _parts(messages: list[dict], edit: int) -> dict[str, dict]:
    """The short episode's messages before its edit turn at index `edit`, by part."""
    system, user, call, tool = messages[edit - 4:edit]
    assert (system["role"], user["role"], call["role"], tool["role"]) == ("system", "user", "assistant", "tool")
    return {"system": system, "user": user, "call": call, "tool": tool}


def probe(policy: str, pool_dir: str, n: int) -> list[str]:
    import jax
    import jax.numpy as jnp

    from composer_jax.agent.episode import run_episode
    from composer_jax.data import chat
    from composer_jax.data.sft_env import episode_messages
    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.env.tasks.ladder_plan import oracle_agent
    from composer_jax.env.tasks.pool import TaskPool
    from composer_jax.rl.family_eval import run_config
    from composer_jax.train.run_checkpoint import parse_run_source
    from composer_jax.train.weights import load_weights

    cfg = run_config(policy)
    tok = load_tokenizer(pathlib.Path(parse_run_source(policy)[0]) / "tokenizer.json")
    pool = TaskPool(pathlib.Path(pool_dir))
    env = dataclasses.replace(cfg.env, use_embeddings=False, pool_dir=pool_dir)
    model = load_weights(policy, cfg).model()
    forward = jax.jit(lambda x: jax.nn.log_softmax(model(x, with_mtp=False).logits[0], -1))
    scores: dict[str, list[tuple[float, str]]] = {k: [] for k in VARIANTS}
    for task in [t for t in pool.tasks() if t.split == "eval"][:n]:
        episode = run_episode(oracle_agent(task, pool.task_dir(task.task_id)), task, pool.task_dir(task.task_id), env)
        messages = episode_messages(episode)
        edit = next((i for i, m in enumerate(messages or []) if m["role"] == "assistant"
                     and any(c["name"] == "search_replace" for c in m.get("tool_calls") or ())), None)
        if edit != 4:            # not the short plan (run the suite, edit): nothing to compare
            continue
        parts = _parts(messages, edit)
        for name, keep in VARIANTS.items():
            ids, _ = chat.encode_messages(tok, [parts[k] for k in keep] + [messages[edit]], (), mark_values=True)
            k = next(i for i in range(len(ids)) if tok.decode(list(ids[max(0, i - 6):i + 1])).endswith('"file_path": "'))
            lp = np.asarray(forward(jnp.asarray([ids[:k + 2]], jnp.int32)))[k]
            scores[name].append((float(np.exp(lp[ids[k + 1]])), tok.decode([int(lp.argmax())])))
    return [f"policy {policy}: p of the file name's first token after the edit call's file_path opening, "
            f"{len(scores['whole'])} held-out short-plan demonstrations"] + [
        f"  {name:24s} mean p {np.mean([p for p, _ in v]):.3f}  argmax {[a for _, a in v]}"
        for name, v in scores.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", required=True, help="WORKDIR or WORKDIR@STEP of an sft run")
    ap.add_argument("--pool", required=True, help="the ladder pool (env_ladder's WORKDIR/pool)")
    ap.add_argument("--tasks", type=int, default=12)
    args = ap.parse_args()
    print("\n".join(probe(args.policy, args.pool, args.tasks)))


if __name__ == "__main__":
    main()
