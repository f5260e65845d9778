"""A sandbox SIGKILLed during a tool call of a multi-turn coding episode: the episode resumes from
its last completed turn in a fresh workspace restored from the checkpoint (`rl.jobs.run_job`,
`agent.episode_checkpoint`), and finishes resolved.

The episode is the scripted coding family (`rl.tasks.coding_scripted`: run the failing test with
its output written into the workspace by the sandbox, the reference fix by `search_replace`, the
test again printing that note, finish) on a one-task pool, with real bubblewrap sandboxes and the
real grader; the policy server returns the forced tokens (no engine: what is tested is the
sandbox death, the workspace diff and the resume). The kill finds the tool call's bwrap process
in /proc (`env.sandbox.running_sandboxes`), as the chaos benchmark does.
"""
import dataclasses
import json
import os
import signal
import threading
import time

import pytest

from composer_jax.agent.episode_checkpoint import EpisodeCheckpoint
from composer_jax.config import Config, JobConfig, RLConfig, tiny, to_dict
from composer_jax.data.config import SplitPattern
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol as p
from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons
from composer_jax.env.sandbox import bwrap_error, running_sandboxes
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task, unified_patch
from composer_jax.env.tools import TOOL_SPECS

_BWRAP = bwrap_error()
pytestmark = pytest.mark.skipif(bool(_BWRAP), reason=f"bubblewrap is not usable here: {_BWRAP}")

GOOD = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BAD = GOOD.replace("return a + b", "return a - b")
TESTS = ("import time\nimport unittest\nimport mod\n\n\nclass T(unittest.TestCase):\n"
         "    def test_add(self):\n        time.sleep(0.3)\n"         # a window for the kill
         "        self.assertEqual(mod.add(2, 3), 5)\n\n"
         "    def test_sub(self):\n        self.assertEqual(mod.sub(5, 3), 2)\n")


def _program(tmp):
    from composer_jax.rl.task_program import TaskProgram
    from composer_jax.rl.tasks.coding_scripted import ScriptedCodingTaskConfig
    tok = train_tokenizer([json.dumps(list(TOOL_SPECS))] * 3 + [p.SYSTEM_PROMPT, GOOD, TESTS] * 3,
                          512, SplitPattern.KIMI)
    tok.save(tmp / "tokenizer.json")
    version = sorted(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))[-1]
    patch, n = unified_patch({"mod.py": BAD}, {"mod.py": GOOD})
    TaskPool(tmp / "pool").add(
        Task("t1", "bug", "train", version, "mod", "test_add fails; fix mod.py",
             ("test_mod.T.test_add",), ("test_mod.T.test_sub",), ("mod.py",), ("test_mod.py",),
             patch, n, version, version),
        {"mod.py": BAD, "test_mod.py": TESTS}, {"mod.py": GOOD})
    rl = RLConfig(group_size=2, batch_groups=1, steps=1, max_new_tokens=1024, seq_len=4096,
                  job=JobConfig(num_rollout_workers=1),
                  task=ScriptedCodingTaskConfig(num_train_tasks=1,
                                                tokenizer=str(tmp / "tokenizer.json")))
    env = EnvConfig(python_versions=(version,), command_timeout_s=20.0, use_embeddings=False,
                    max_turns=8, pool_dir=str(tmp / "pool"))
    cfg = dataclasses.replace(Config(), model=dataclasses.replace(tiny(), vocab_size=512),
                              rl=rl, env=env)
    return TaskProgram(to_dict(cfg))


class _ForcedServer:
    """A policy server (rpc) that emits each request's forced tokens, log-prob -0.25 each."""

    def rpc(self, method, args, kwargs):
        return getattr(self, method)(*args, **kwargs)

    def submit(self, ids, params, session=None):
        self.last = params
        return 0

    def wait(self, rid, timeout=None):
        toks = list(self.last.forced_tokens)
        return {"tokens": toks, "logprobs": [-0.25] * len(toks),
                "raw_logprobs": [-0.25] * len(toks), "versions": [0] * len(toks),
                "router_indices": [], "prompt_router_indices": None, "prompt_router_start": 0,
                "finish_reason": "stop_token"}

    def end_session(self, session):
        pass


def _kill_sandbox_running(marker: str, killed: list, stop: threading.Event,
                          delay: float = 0.0) -> None:
    """SIGKILLs (once) the bwrap process of this process's sandbox whose command has `marker`
    (after `delay` seconds)."""
    stop.wait(delay)
    while not stop.is_set():
        for sb in running_sandboxes((os.getpid(),)):
            if marker in sb.script and sb.workspace.endswith("/ws"):
                os.kill(sb.pid, signal.SIGKILL)
                killed.append(sb)
                return
        time.sleep(0.005)


def test_sigkilled_sandbox_resumes_from_last_turn_with_its_workspace(tmp_path):
    from composer_jax.rl.jobs import Job, run_job
    from composer_jax.rl.program import LocalClient
    program = _program(tmp_path)
    assert program.resumable
    saved = []
    killed, stop = [], threading.Event()
    th = threading.Thread(target=_kill_sandbox_running, args=("echo before:", killed, stop),
                          daemon=True)
    th.start()
    try:
        r = run_job(program, Job("group-000000", 0, "t1", 3), LocalClient(_ForcedServer()),
                    save=lambda rid, data: saved.append(EpisodeCheckpoint.from_bytes(data)))
    finally:
        stop.set()
        th.join()
    assert len(killed) == 1, "no sandbox was killed"
    # plan: 1 run the test (writes scratch/before.txt), 2 the fix, 3 the test again (killed), 4 finish
    assert r.error is None, r.error
    assert r.info["interruptions"] == 1 and r.info["interrupted_by"] == ["SandboxKilled"]
    assert r.info["resumed_at_turns"] == [2] and r.info["resumed_by"] == ["SandboxKilled"]
    assert r.info["num_turns"] == 4 and r.info["stop_reason"] == "finish"
    assert r.reward["resolved"] == 1.0 and r.info["resolved"]   # the restored fix was graded
    assert r.info["resumed_tokens_saved"] == [saved[1].generated]
    # checkpoints: turns 1, 2 (the first attempt), then 2 again (the resume on record) and 3
    assert [c.turn for c in saved] == [1, 2, 2, 3]
    files = saved[1].state["workspace"]["files"]
    assert saved[2].state["ep"]["resumed_at"] == [2]         # the resume, on record
    assert saved[2].state["workspace"] == saved[1].state["workspace"]   # restored: the same diff
    assert sorted(files) == ["mod.py", "scratch/before.txt"]    # the fix and the sandbox's note
    # the resumed turn 3's test run read the note the dead workspace's sandbox had written
    text = program.family.tokenizer().decode(r.segments[-1].tokens.tolist())
    out = text.split("echo before:")[-1]
    assert "before:" in out and "FAILED (failures=1)" in out, out[-600:]
    assert text.count("FAILED (failures=1)") == 2            # turn 1's output, then the note
    assert tuple(r.segments[-1].turns[:3]) == tuple(saved[-1].segments[-1].turns)


@pytest.mark.parametrize("mode", ["fresh", "persistent"])
def test_only_a_sandbox_killed_from_outside_raises(tmp_path, mode):
    """SandboxKilled for a SIGKILL of the sandbox's bwrap process, in both shell modes; a command
    that kills itself or exits is an ordinary result; the next command runs normally."""
    from composer_jax.env.config import ShellMode
    from composer_jax.env.sandbox import SandboxKilled
    from composer_jax.env.workspace import open_workspace
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "a.txt").write_text("kept\n")
    cfg = EnvConfig(shell_mode=ShellMode(mode), use_embeddings=False)
    with open_workspace(tmp_path / "snap", cfg) as ws:
        own = ws.run_command("kill -9 $$" if mode == "fresh" else "exit 3")
        assert own.exit_code == (137 if mode == "fresh" else 1) and not own.timed_out
        killed, stop = [], threading.Event()
        # the persistent shell's bwrap runs `exec bash`, started before: kill once the command runs
        th = threading.Thread(target=_kill_sandbox_running,
                              args=("", killed, stop, 0.0 if mode == "fresh" else 0.5), daemon=True)
        if mode == "persistent":
            ws.run_command("true")
        th.start()
        try:
            with pytest.raises(SandboxKilled, match="killed from outside"):
                ws.run_command("sleep 20")
        finally:
            stop.set()
            th.join()
        assert len(killed) == 1 and killed[0].workspace == str(ws.root)
        assert "kept" in ws.run_command("cat a.txt").output


def test_drain_kills_what_outlives_its_leader():
    """`procio.drain(leader=...)`: a process in another session still holding the output pipe
    after the leader exited (a sandbox's inner bwrap orphaned by a SIGKILL of the outer one before
    it armed --die-with-parent) is killed, so the read ends at once instead of at the deadline."""
    import subprocess

    from composer_jax.env.procio import drain
    proc = subprocess.Popen(["bash", "-c", "setsid sleep 30 & echo started; exit 0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    kept, _, why, _ = drain(proc.stdout.fileno(), t0 + 20, 1000, 10_000, leader=proc)
    proc.stdout.close()
    assert why == "eof" and kept == b"started\n" and time.monotonic() - t0 < 5
    assert proc.wait() == 0
