"""SFT samples from the environment: the oracle agent's resolved episodes, in the policy's template.

For each training task of a task pool (`env_generate` writes one; tasks whose `split` is not "train"
-- evaluation tasks from held-out modules -- are never used), the scripted oracle agent
(`env.agents.OracleAgent`; for ladder tasks `env.tasks.ladder_plan.LadderOracleAgent`, which runs the
tests and reads the failure before it edits) applies the reference fix through the tools in a sandboxed workspace
(the agent's episode loop, `agent.episode.run_episode`, which the caller passes in: the data layer
sits below the agent and does not import it; bubblewrap, or the fallback with its loud warning). A
resolved episode
that ended with `finish` and made no invalid call becomes one sample: tool declarations, system
prompt, the user's problem statement, the assistant turns with their tool calls, the tool results
and the final `finish` call, rendered and masked by `composer_jax.data.chat` (loss on the assistant
bodies only). Other episodes are skipped and counted. With `data.sft_hasty` > 0, that fraction of a ladder
pool's training tasks (by a hash of the task id) also gives a hasty sample (`hasty_messages`: the
first tool call and its result, then `finish` with nothing edited), the planted habit RL removes.
With `data.sft_recovery` > 0, that fraction (another hash of the id) also gives each whole careful
and renamed demonstration as a recovery (`recovery_messages`): the first edit call made with the
broken text in new_string as well (the copy mistake a small policy makes most), the tool's error, then
the careful edit and the rest; the mistaken turn is not trained, only the recovery after it.
With `data.sft_renames` = K, each careful ladder demonstration also gives K renamed copies
(`data.sft_rename.renamed_messages`: the names its calls copy and the line it reads replaced
consistently by identifiers of the training tasks' sources, `replacement_names`), which can be
imitated only by copying from the context.

Samples are cached like the docstring ones (`<cache>/sft_env/<key>/`, one TokenStore "sft" with a
trainable mask whose code is `chat.VALUE_START` on each argument value's first token, which the
pipeline weighs by `data.sft_value_weight`, plus `info.json` with the counts), keyed by the pool's manifest, the tokenizer, the
tool declarations, the chat template, `sft_max_samples` (> 0: only the first that many training
tasks), `sft_hasty`, `sft_recovery` and `sft_renames` (when > 0), so the episodes run once per pool and
tokenizer. The environment settings (sandbox, limits) shape only tool-output text and are not part
of the key.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from composer_jax.data import chat, shards
from composer_jax.data.cache import build_once, stable_hash
from composer_jax.data.config import DataConfig, TurnWindows, resolved_cache_dir
from composer_jax.data.errors import DataError
from composer_jax.data.sft_rename import name_pool, renamed_messages
from composer_jax.env.config import EnvConfig
from composer_jax.env.protocol import parse_assistant, render_assistant
from composer_jax.env.tasks.ladder_plan import LADDER_KINDS, PLAN_VERSION, oracle_agent
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tools import declared_specs
from composer_jax.env.tools.files import IDENTICAL_STRINGS
from composer_jax.env.tools.result import error

TRAIN_SPLIT = "train"
EDIT_TOOLS = frozenset({"search_replace", "write_file"})   # the tools whose calls change a file's text
MANIFEST = "manifest.json"


def pool_error(path: str | Path, why: str) -> DataError:
    """The error for an unusable `data.sft_pool`, with the two ways forward."""
    return DataError(f"data.sft_pool={str(path)!r}: {why}. Build a task pool with `python launch.py "
                     "--experiment=env_generate --workdir=W` (it writes W/pool) and pass --set "
                     "data.sft_pool=W/pool, or use --set data.sft_source=docstrings.")


def pool_manifest(path: str | Path) -> dict:
    """The manifest of the task pool at `path`; a DataError (see `pool_error`) when it is unusable."""
    manifest, why = _read_pool(path)
    if manifest is None:
        raise pool_error(path, why)
    return manifest


def pool_problem(path: str | Path) -> str | None:
    """Why `path` is not a usable task pool (with training tasks), or None when it is one."""
    return _read_pool(path)[1] or None


def _read_pool(path: str | Path) -> tuple[dict | None, str]:
    """`(manifest, "")` for a task pool with training tasks, else `(None, why not)`; never creates
    anything (TaskPool would create the directory)."""
    if not str(path):
        return None, "no task pool given for data.sft_source=env_oracle"
    root = Path(path).expanduser()
    if not root.is_dir():
        return None, "no such directory"
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        return None, f"not a task pool (no {MANIFEST})"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"unreadable {MANIFEST}: {e}"
    tasks = manifest.get("tasks") if isinstance(manifest, dict) else None
    if not isinstance(tasks, list) or not tasks:
        return None, "the pool holds no tasks"
    if not any(isinstance(t, dict) and t.get("split") == TRAIN_SPLIT for t in tasks):
        return None, "the pool holds only evaluation tasks (held-out modules are never trained on)"
    return manifest, ""


def episode_messages(episode) -> list[dict] | None:
    """The conversation of an episode worth imitating, or None: it must be resolved, stop on
    `finish` and have no invalid call. Tool results after the last assistant turn (the `finish`
    echo) carry no training signal and are dropped."""
    if not episode.grade.resolved or episode.stop_reason != "finish" or episode.num_invalid_calls:
        return None
    messages = [dict(m) for m in episode.messages]
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages or None


def episode_sample(tokenizer, episode, tools: Sequence[dict]) -> tuple[list[int], list[int]] | None:
    """`(ids, trainable)` of one episode (see `episode_messages`), or None when it is skipped."""
    messages = episode_messages(episode)
    return None if messages is None else chat.encode_messages(tokenizer, messages, tools, mark_values=True)


HASTY_FINISH = {"message": "Fixed; the failing tests pass now."}


def is_hasty(task_id: str, fraction: float) -> bool:
    """Whether `task_id` gets a hasty demonstration (`sft_hasty`): a hash of the id below the fraction."""
    return fraction > 0 and int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 2**32 < fraction


def hasty_messages(messages: list[dict]) -> list[dict] | None:
    """The hasty variant of a careful episode's conversation (`episode_messages`): system, task, the
    first tool call and its result, then `finish` claiming a fix with nothing edited (the habit of
    `data.sft_hasty`); None when the episode has no first tool result."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "tool"), None)
    if first is None or messages[first - 1]["role"] != "assistant":
        return None
    turn = parse_assistant(render_assistant("", [("finish", HASTY_FINISH)], first_index=1), first_index=1)
    return [*messages[:first + 1], {"role": "assistant", "content": turn.content,
                                    "tool_calls": [c.to_json() for c in turn.tool_calls]}]


def is_recovery(task_id: str, fraction: float) -> bool:
    """Whether `task_id`'s demonstrations also come as recoveries (`sft_recovery`): a hash of the id
    (salted, so the tasks picked are not the hasty ones) below the fraction."""
    return is_hasty(f"{task_id}/recovery", fraction)


def recovery_messages(messages: list[dict]) -> list[dict] | None:
    """A careful conversation with a failed edit before its first `search_replace` turn: the same call
    with new_string = old_string (the broken text copied twice), not trained (`"trained": False`),
    and the tool's error for it; the later calls' ids move up by one. None when no turn edits."""
    k = next((i for i, m in enumerate(messages) if m["role"] == "assistant"
              and any(c["name"] == "search_replace" for c in m.get("tool_calls") or ())), None)
    if k is None:
        return None
    call = next(c for c in messages[k]["tool_calls"] if c["name"] == "search_replace")
    first = int(call["call_id"].rsplit(":", 1)[1])
    same = {**call["arguments"], "new_string": call["arguments"]["old_string"]}
    mistake = {"role": "assistant", "content": messages[k].get("content", ""), "trained": False,
               "tool_calls": [{**call, "arguments": same, "raw": "", "error": None}]}
    answer = {"role": "tool", "tool_call_id": call["call_id"], "content": error(IDENTICAL_STRINGS).output}
    return [*messages[:k], mistake, answer, *(_ids_moved_up(m, first) for m in messages[k:])]


def _ids_moved_up(message: dict, first: int) -> dict:
    """`message` with every tool-call id `functions.NAME:i`, i >= first, renumbered i + 1."""
    def moved(cid: str) -> str:
        name, i = cid.rsplit(":", 1)
        return f"{name}:{int(i) + 1}" if int(i) >= first else cid
    if message.get("raw") is not None:
        raise ValueError("recovery_messages renumbers parsed tool calls; an assistant message with its raw text "
                         "would keep the old ids")
    if message["role"] == "tool":
        return {**message, "tool_call_id": moved(message["tool_call_id"])}
    if message.get("tool_calls"):
        return {**message, "tool_calls": [{**c, "call_id": moved(c["call_id"])} for c in message["tool_calls"]]}
    return dict(message)


def turn_windows(messages: list[dict], edits_only: bool = False, context: int = 0) -> list[list[dict]]:
    """`[message before it, assistant turn]` for each assistant turn of a conversation after the
    first message (`data.sft_turn_windows`): the turn with only the text it answers, short samples
    that each train one turn (an edit call right after the traceback it copies from). They are
    encoded without tool declarations, and without the system prompt unless `context` reaches it.
    `edits_only`: only the turns that call an
    edit tool (`EDIT_TOOLS`). `context` K > 0 (`data.sft_window_context`): each window also with
    the 1..K messages before it, the system prompt included (a window that reaches back to it is the
    demonstration up to that turn), as K more windows (fewer where the conversation has fewer)."""
    return [messages[k - 1 - c:k + 1] for k in range(1, len(messages))
            if messages[k]["role"] == "assistant" and messages[k - 1]["role"] != "system"
            and (not edits_only or any(c["name"] in EDIT_TOOLS for c in messages[k].get("tool_calls") or ()))
            for c in range(context + 1) if k - 1 - c >= 0]


def traceback_tail(text: str) -> str | None:
    """The last traceback frame of a tool output and the error line under it (`data.sft_turn_windows=
    edit_tails`): from the last line that starts with `  File "` through the first line after it
    that is not indented; None when there is no such frame."""
    lines = text.split("\n")
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if not frames:
        return None
    end = next((j for j in range(frames[-1] + 1, len(lines)) if lines[j] and not lines[j][0].isspace()), None)
    return None if end is None else "\n".join(lines[frames[-1]:end + 1])


def tail_window(window: list[dict]) -> list[dict] | None:
    """An edit window with the tool output its turn answers cut to `traceback_tail` (the messages
    before it kept whole); None when it has none."""
    *before, answered, turn = window
    tail = traceback_tail(str(answered.get("content", ""))) if answered["role"] == "tool" else None
    return None if tail is None else [*before, {**answered, "content": tail}, turn]


WINDOWS_ONLY = (TurnWindows.EDIT_ONLY, TurnWindows.EDIT_TAILS)    # modes without whole demonstrations


def _windows_key(mode: TurnWindows) -> dict:
    """The store-key entries of a windows mode (`all` keeps the key stores built when it was a bool)."""
    if mode == TurnWindows.NONE:
        return {}
    return {"turn_windows": 1} if mode == TurnWindows.ALL else {"turn_windows": mode.value, "windows_v": 2}


def _window_renames(cfg: DataConfig) -> int:
    """How many renamed copies of a demonstration give windows (`data.sft_window_renames`, 0 = as
    many as give whole demonstrations; DataConfig refuses it without windows)."""
    return cfg.sft_window_renames or cfg.sft_renames


def window_samples(conversations: Sequence[list[dict]], mode: TurnWindows, context: int = 0) -> list[list[dict]]:
    """The single-turn samples `data.sft_turn_windows=mode` adds for a ladder task's conversations
    (its careful demonstration and renamed copies): every turn's window (all), the edit turns'
    (edit_only), or those cut to their traceback tail (edit_tails, episodes_and_edit_tails);
    `context`: `turn_windows`'s."""
    if mode == TurnWindows.NONE:
        return []
    tails = mode in (TurnWindows.EDIT_TAILS, TurnWindows.EPISODES_AND_EDIT_TAILS)
    windows = [w for m in conversations for w in turn_windows(m, mode != TurnWindows.ALL, context)]
    return [t for t in map(tail_window, windows) if t is not None] if tails else windows


def oracle_episodes(pool_dir: str | Path, episode_loop, env_cfg=None, workers: int = 1, limit: int = 0,
                    progress: bool = False):
    """`(task, episode)` for the first `limit` (0 = all) training tasks of the pool, in task-id order,
    each episode the oracle agent's run of the task by `episode_loop` (`agent.episode.run_episode`:
    `(agent, task, task_dir, env_cfg) -> Episode`; threads run `workers` episodes at once). An
    episode that raised comes back as its exception, so one broken task cannot stop the others."""
    pool_manifest(pool_dir)
    env_cfg = env_cfg or EnvConfig(use_embeddings=False)
    pool = TaskPool(Path(pool_dir).expanduser())
    tasks = [t for t in pool.tasks() if t.split == TRAIN_SPLIT]
    tasks = tasks[:limit] if limit else tasks

    def run(task):
        task_dir = pool.task_dir(task.task_id)
        try:
            return episode_loop(oracle_agent(task, task_dir), task, task_dir, env_cfg)
        except Exception as e:  # noqa: BLE001 -- reported per task by the caller
            return e

    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        runs = ex.map(run, tasks)
        yield from tqdm(zip(tasks, runs), total=len(tasks), desc="sft oracle episodes", disable=not progress)


def build_or_load_env_sft(cfg: DataConfig, tokenizer, env_cfg=None, episode_loop=None) -> shards.TokenStore:
    """The tokenized oracle samples of `cfg.sft_pool` (a TokenStore "sft" with a trainable mask).
    Building them runs the episodes with `episode_loop` (`agent.episode.run_episode`, passed by
    whoever owns the loop: the `sft` experiment) and `env_cfg` (an `EnvConfig`; default: the
    environment defaults without embeddings); without a loop only a cached store is read, and a
    missing one is a DataError. `info.json` next to the store counts tasks, samples and skipped
    episodes."""
    manifest_bytes = json.dumps(pool_manifest(cfg.sft_pool), sort_keys=True).encode("utf-8")
    window_renames = _window_renames(cfg)
    tools = declared_specs(cfg.sft_prompt_tools) if cfg.sft_declare_tools else ()
    key = stable_hash({"pool": hashlib.sha256(manifest_bytes).hexdigest(), "tokenizer": tokenizer.fingerprint,
                       "tools": tools, "template": chat.template_fingerprint(),
                       "max_samples": cfg.sft_max_samples, "v": 2, "plan": PLAN_VERSION,
                       **({"hasty": cfg.sft_hasty} if cfg.sft_hasty else {}),
                       **({"recovery": cfg.sft_recovery} if cfg.sft_recovery else {}),
                       **({"renames": cfg.sft_renames, "rename_v": 2} if cfg.sft_renames else {}),
                       **_windows_key(cfg.sft_turn_windows),
                       **({"window_renames": window_renames} if window_renames != cfg.sft_renames else {}),
                       **({"window_context": cfg.sft_window_context} if cfg.sft_window_context else {})})

    def build(out: Path) -> None:
        if episode_loop is None:
            raise DataError(f"the oracle SFT samples of {cfg.sft_pool} are not built yet, and building "
                            "them runs the agent's episode loop, which was not given: run `python "
                            "launch.py --experiment=sft` with this data config (it builds them), or pass "
                            "episode_loop=composer_jax.agent.episode.run_episode")
        counts = {"tasks": 0, "samples": 0, "skipped": 0, "sample_tokens": 0, "trained_tokens": 0,
                  "value_start_tokens": 0, "hasty": 0, "windows": 0,
                  "renamed": 0, "recovery": 0}
        skipped: list[str] = []
        names = replacement_names(cfg.sft_pool) if max(cfg.sft_renames, window_renames) else []

        def docs():
            workers = cfg.build_workers or 2
            for task, episode in oracle_episodes(cfg.sft_pool, episode_loop, env_cfg, workers, cfg.sft_max_samples, cfg.progress):
                counts["tasks"] += 1
                sample = None if isinstance(episode, Exception) else episode_sample(tokenizer, episode, tools)
                if sample is None:
                    counts["skipped"] += 1
                    skipped.append(f"{task.task_id} ({_why_skipped(episode)})")
                    continue
                ladder = task.kind in LADDER_KINDS
                windows_only = ladder and cfg.sft_turn_windows in WINDOWS_ONLY
                samples = [] if windows_only else [sample]
                careful = episode_messages(episode)
                conversations = [careful]
                if ladder and not windows_only and is_hasty(task.task_id, cfg.sft_hasty):
                    hasty = hasty_messages(careful)
                    if hasty is not None:
                        counts["hasty"] += 1
                        samples.append(chat.encode_messages(tokenizer, hasty, tools, mark_values=True))
                recover = ladder and not windows_only and is_recovery(task.task_id, cfg.sft_recovery)
                whole = [careful]
                if ladder:
                    for k in range(max(cfg.sft_renames, window_renames)):
                        renamed = renamed_messages(careful, names, random.Random(f"{task.task_id}/rename/{k}"))
                        counts["renamed"] += 1
                        conversations.append(renamed)
                        if k < cfg.sft_renames and not windows_only:
                            whole.append(renamed)
                            samples.append(chat.encode_messages(tokenizer, renamed, tools, mark_values=True))
                for recovery in (recovery_messages(m) for m in (whole if recover else ())):
                    if recovery is not None:
                        counts["recovery"] += 1
                        samples.append(chat.encode_messages(tokenizer, recovery, tools, mark_values=True))
                if ladder:
                    for window in window_samples(conversations[:1 + window_renames], cfg.sft_turn_windows,
                                                  cfg.sft_window_context):
                        counts["windows"] += 1
                        samples.append(chat.encode_messages(tokenizer, window, (), mark_values=True))
                for s in samples:
                    counts["samples"] += 1
                    counts["sample_tokens"] += len(s[0])
                    counts["trained_tokens"] += sum(1 for t in s[1] if t)
                    counts["value_start_tokens"] += sum(1 for t in s[1] if t == chat.VALUE_START)
                    yield s

        shards.write_store(out, "sft", docs(), shards.token_dtype(tokenizer.vocab_size))
        if counts["samples"] == 0:
            raise DataError(f"no resolved oracle episode in the {counts['tasks']} training tasks of "
                            f"{cfg.sft_pool}; skipped: {skipped[:5]}")
        (out / "info.json").write_text(json.dumps({
            "dtype": shards.token_dtype(tokenizer.vocab_size).name, "key": key,
            "pool": str(Path(cfg.sft_pool).expanduser().resolve()), **counts, "skipped_tasks": skipped}))

    directory, _ = build_once(resolved_cache_dir(cfg), "sft_env", key, build)
    return shards.TokenStore(directory, "sft")


def replacement_names(pool_dir: str | Path) -> list[str]:
    """The names renamed demonstrations draw from (`data.sft_rename.name_pool`): identifiers of the
    training tasks' snapshots, none containing a held-out module's name."""
    pool = TaskPool(Path(pool_dir).expanduser())
    tasks = pool.tasks()
    heldout = {part for t in tasks if t.split != TRAIN_SPLIT for part in re.split(r"[./]", t.module)}
    texts = (p.read_text(encoding="utf-8", errors="replace") for t in tasks if t.split == TRAIN_SPLIT
             for p in sorted((pool.task_dir(t.task_id) / "snapshot").rglob("*.py")))
    return name_pool(texts, heldout)


def _why_skipped(episode) -> str:
    if isinstance(episode, Exception):
        return f"error: {type(episode).__name__}: {episode}"[:300]
    return (f"stop={episode.stop_reason}, resolved={bool(episode.grade.resolved)}, "
            f"invalid_calls={episode.num_invalid_calls}")


def store_info(store: shards.TokenStore) -> dict:
    """The counts written next to a store by its builder (`{}` when there are none)."""
    path = Path(store.directory) / "info.json"
    return json.loads(path.read_text()) if path.is_file() else {}
