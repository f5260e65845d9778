"""A small RL program for testing the orchestration without JAX models: a contextual bandit.

Task i has K arms and one correct arm (i % K). The policy is a table of logits [num_tasks, K];
an episode asks the policy server for one arm (its log-prob and the version that sampled it),
optionally sleeps to stand for environment time (`env_s`, or `latency_scale` x a measured sandbox
episode time drawn by the episode seed: `rl/latency_model.py`, heavy-tailed), and records a one-token `Rollout`. The learner is
REINFORCE with the group-mean baseline on the table (exact gradient of log-softmax), so the mean
reward rises from 1/K. Task ids starting with "crash" raise inside the episode (an error rollout).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from composer_jax.rl.rollout import Rollout, SegmentBuilder


class MemoryStore:
    """An in-process weight store: publish(version, params), fetch(version), latest()."""

    def __init__(self):
        self._lock = threading.Lock()
        self._versions: dict[int, dict] = {}

    def publish(self, version, params):
        with self._lock:
            self._versions[version] = {k: np.array(v, copy=True) for k, v in params.items()}
        nbytes = sum(v.nbytes for v in params.values())
        return {"bytes_sent": nbytes, "full_bytes": nbytes}

    def fetch(self, version):
        with self._lock:
            return self._versions[version]

    def latest(self):
        with self._lock:
            return max(self._versions) if self._versions else None


class BanditPolicy:
    def __init__(self, num_tasks, arms, decode_s):
        self.logits = np.zeros((num_tasks, arms), np.float64)
        self.version = -1
        self.decode_s = decode_s
        self.busy_s = 0.0
        self._lock = threading.Lock()

    def load_from(self, store, version):
        weights = store.fetch(version)
        with self._lock:
            self.logits = np.asarray(weights["logits"], np.float64).copy()
            self.version = version

    def rpc(self, method, args, kwargs):
        if method != "sample":
            raise ValueError(f"unknown policy method {method}")
        return self.sample(*args, **kwargs)

    def sample(self, task_index, seed, greedy=False):
        t0 = time.monotonic()
        with self._lock:            # one "engine step" at a time, like a device
            if self.decode_s:
                time.sleep(self.decode_s)
            z = self.logits[task_index]
            p = np.exp(z - z.max())
            p /= p.sum()
            arm = int(np.argmax(p)) if greedy else int(np.random.default_rng(seed).choice(len(p), p=p))
            out = (arm, float(np.log(p[arm])), self.version)
        self.busy_s += time.monotonic() - t0
        return out

    def stats(self):
        return {"engine_busy_s": self.busy_s}


class BanditLearner:
    def __init__(self, num_tasks, arms, lr, step_s):
        self.num_tasks, self.arms, self.lr, self.step_s = num_tasks, arms, lr, step_s

    def init_state(self):
        return {"logits": np.zeros((self.num_tasks, self.arms), np.float32)}

    def state_template(self):
        return self.init_state()

    def weights(self, state):
        return {"logits": np.asarray(state["logits"])}

    def eval_model(self, state):
        return {"logits": np.array(state["logits"], copy=True)}

    def step(self, state, groups):
        if self.step_s:
            time.sleep(self.step_s)
        logits = np.array(state["logits"], np.float64)
        grad = np.zeros_like(logits)
        n = 0
        for group in groups:
            rewards = np.array([r.total_reward for r in group])
            adv = rewards - rewards.mean()
            for r, a in zip(group, adv):
                if not r.segments:
                    continue
                task, arm = int(r.segments[0].tokens[0]), int(r.segments[0].tokens[1])
                z = logits[task]
                p = np.exp(z - z.max())
                p /= p.sum()
                g = -p
                g[arm] += 1.0
                grad[task] += a * g
                n += 1
        logits += self.lr * grad
        return {"logits": logits.astype(np.float32)}, {"loss": float(-np.abs(grad).sum()),
                                                       "samples": float(n)}


class BanditProgram:
    def __init__(self, num_tasks=8, arms=4, lr=1.0, env_s=0.0, decode_s=0.0, step_s=0.0,
                 crash_tasks=0, num_eval=4, latency_scale=0.0):
        self.num_tasks, self.arms, self.lr = num_tasks, arms, lr
        self.latency_scale = latency_scale
        self.env_s, self.decode_s, self.step_s = env_s, decode_s, step_s
        self.crash_tasks, self.num_eval = crash_tasks, num_eval

    def train_tasks(self):
        return ([f"crash{i}" for i in range(self.crash_tasks)] +
                [f"task{i}" for i in range(self.crash_tasks, self.num_tasks)])

    def eval_tasks(self):
        return [f"task{i}" for i in range(self.crash_tasks, self.crash_tasks + self.num_eval)]

    def run_episode(self, task_id, seed, policy, *, greedy):
        index = int(task_id.lstrip("crashtask"))
        if task_id.startswith("crash"):
            raise OSError(f"sandbox of {task_id} crashed")
        arm, logprob, version = policy.call("sample", index, seed, greedy=greedy)
        if self.env_s:
            time.sleep(self.env_s)
        if self.latency_scale:
            from composer_jax.rl.latency_model import episode_latency
            time.sleep(episode_latency(seed, self.latency_scale))
        b = SegmentBuilder()
        b.feed([index])
        b.sample([arm], [logprob], [logprob], [version])
        b.end_turn("stop_token")
        resolved = arm == index % self.arms
        return Rollout(task_id, "", [b.build()], {"total": float(resolved),
                                                  "resolved": float(resolved)})

    def make_policy(self):
        return BanditPolicy(self.num_tasks, self.arms, self.decode_s)

    def make_learner(self):
        return BanditLearner(self.num_tasks, self.arms, self.lr, self.step_s)


def make(**kw):
    return BanditProgram(**kw)
