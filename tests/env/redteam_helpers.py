"""Shared helpers for the red-team and false-positive suites: scripted episodes on the mini pool."""
from composer_jax.agent.episode import run_episode
from composer_jax.env.protocol import render_assistant


def pick(mini_pool, kind="bug"):
    """(task, task_dir, episode config) of the mini pool's first task of `kind`."""
    pool, cfg = mini_pool
    task = next(t for t in pool.tasks() if t.kind == kind)
    return task, pool.task_dir(task.task_id), cfg


def play(mini_pool, calls, kind="bug", cfg=None, message="Fixed; all tests pass."):
    """Runs an episode whose agent makes `calls` (one per turn) and then finishes."""
    task, d, base = pick(mini_pool, kind)
    plan = list(calls) + [("finish", {"message": message})]
    state = {"i": 0}

    def agent(messages):
        name, args = plan[min(state["i"], len(plan) - 1)]
        state["i"] += 1
        return render_assistant("", [(name, args)], first_index=state["i"] - 1)
    return run_episode(agent, task, d, cfg or base)


def sh(cmd, **kw):
    return ("run_terminal_cmd", {"command": cmd, **kw})


def edit_file(task):
    (rel,) = task.edit_files
    return rel


def texts(mini_pool, kind="bug"):
    """(edit file, the snapshot's broken text, the reference fix's text)."""
    task, d, _ = pick(mini_pool, kind)
    rel = edit_file(task)
    return rel, (d / "snapshot" / rel).read_text(), (d / "solution" / rel).read_text()


# Appended to a module: runs `_attack()` before every call of its public functions and methods
# (so attack code also runs while the tests run, not only at import). No flagged names.
ON_EVERY_CALL = '''
import types as _ty
def _wrap_x(f):
    def w(*a, **k):
        _attack()
        return f(*a, **k)
    return w
for _n, _v in list(globals().items()):
    if isinstance(_v, _ty.FunctionType) and not _n.startswith('_'):
        globals()[_n] = _wrap_x(_v)
    elif isinstance(_v, type) and _v.__module__ == __name__:
        for _m, _f in list(vars(_v).items()):
            if isinstance(_f, _ty.FunctionType):
                setattr(_v, _m, _wrap_x(_f))
'''


def case_task(case_pool, kind="bug"):
    """(task, task_dir, cfg) of the case pool's first task of `kind` with held-back tests and
    secret cases the unfixed code fails."""
    import json
    pool, cfg = case_pool
    for task in pool.tasks():
        d = pool.task_dir(task.task_id)
        cases = json.loads((d / "secret_cases.json").read_text())["cases"]
        if task.kind == kind and task.held_back and any(c["discriminating"] for c in cases):
            return task, d, cfg
    raise AssertionError(f"no {kind} task with held-back tests and telling secret cases")


def play_task(task, d, cfg, calls, message="Fixed; all tests pass."):
    """`play` on a given task."""
    plan = list(calls) + [("finish", {"message": message})]
    state = {"i": 0}

    def agent(messages):
        name, args = plan[min(state["i"], len(plan) - 1)]
        state["i"] += 1
        return render_assistant("", [(name, args)], first_index=state["i"] - 1)
    return run_episode(agent, task, d, cfg)
