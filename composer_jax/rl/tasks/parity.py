"""rl.task=parity: the known-optimum task family (`composer_jax.agent.parity`) as a single-turn
family. With `rl.task.env_latency_scale > 0` each episode also spends a modelled environment time
drawn from measured sandboxed episodes (`rl/latency_model.py`), half before and half after its
reply."""
from __future__ import annotations

import time

from composer_jax.agent import parity as tt
from composer_jax.agent.tasks import SingleTurnFamily
from composer_jax.config.rl import ParityTaskConfig
from composer_jax.rl.latency_model import episode_latency
from composer_jax.rl.tasks.registry import register


@register
class ParityFamily(SingleTurnFamily):
    name = "parity"
    config_cls = ParityTaskConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        t, kinds = self.task_cfg, tuple(self.task_cfg.kinds)
        self._split = {"train": tt.make_tasks(t.num_train_tasks, cfg.seed, "train", kinds),
                       "eval": tt.make_tasks(t.num_eval_tasks, cfg.seed, "eval", kinds)}
        self._tasks = {x.task_id: x for split in self._split.values() for x in split}

    def make_tasks(self, split: str) -> list[str]:
        return [t.task_id for t in self._split[split]]

    def messages(self, task_id: str) -> list[dict]:
        return self._tasks[task_id].messages()

    def score(self, task_id: str, reply: str) -> tuple[float, bool]:
        return tt.grade(self._tasks[task_id], reply)

    def info(self, task_id: str) -> dict:
        return {"kind": self._tasks[task_id].kind}

    def run_episode(self, task_id, seed, policy, *, greedy):
        wait = episode_latency(seed, self.task_cfg.env_latency_scale)   # 0 unless modelled
        time.sleep(wait / 2)                # modelled exploring tool calls (env side, engine free)
        r = super().run_episode(task_id, seed, policy, greedy=greedy)
        time.sleep(wait / 2)                # modelled test runs and grading
        if wait:
            r.timing["modelled_env_s"] = wait
        return r
