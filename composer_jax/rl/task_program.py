"""The RL program of a task family (`rl.task`): the family's episodes on the env side, the engine
policy server on the inference side, `rl_step` on the trainer side, all on the family's initial
model. Built from the run's resolved config (`config.to_dict`), so every process rebuilds the
same program; importing this module imports no JAX (rollout workers)."""
from __future__ import annotations

from composer_jax.config import Config, from_dict, to_dict
from composer_jax.rl.program import ProgramSpec
from composer_jax.rl.tasks import family_of


class TaskProgram:
    """An `RLProgram` (rl/program.py) of the task family `cfg.rl.task.family`."""

    def __init__(self, config: dict):
        self.cfg = from_dict(Config, config)
        self.family = family_of(self.cfg)
        self.eval_name = "heldout_" + self.family.name.rsplit(".", 1)[-1]   # metrics prefix
        self.resumable = bool(getattr(self.family, "resumable", False))

    def train_tasks(self) -> list[str]:
        return self.family.make_tasks("train")

    def eval_tasks(self) -> list[str]:
        return self.family.make_tasks("eval")

    def run_episode(self, task_id: str, seed: int, policy, *, greedy: bool, **resume_kw):
        """`resume_kw` (checkpoint=, resume=) only when the family is `resumable`."""
        return self.family.run_episode(task_id, seed, policy, greedy=greedy, **resume_kw)

    def initial_model(self):
        """The run's initial policy (`rl.initial_policy`: train.init_from, else the family's)."""
        from composer_jax.rl.initial_policy import initial_model  # JAX: not in rollout workers
        return initial_model(self.cfg, self.family)

    def make_policy(self, model=None):
        """The engine policy server on `model` (default: the run's initial policy; a checkpoint's
        evaluation passes the checkpoint's model, so no initial policy is built or trained)."""
        from composer_jax.rl.policy_server import EnginePolicyServer  # JAX: not in rollout workers
        model = self.initial_model() if model is None else model
        return EnginePolicyServer(self.cfg, model, self.family.engine_settings())

    def make_learner(self):
        from composer_jax.rl.learner import ModelLearner  # JAX: not in rollout workers
        return ModelLearner(self.cfg, self.initial_model)


def make(config: dict) -> TaskProgram:
    return TaskProgram(config)


def task_program_spec(cfg) -> ProgramSpec:
    """The ProgramSpec of cfg's task family (after the family's `prepare`)."""
    return ProgramSpec("composer_jax.rl.task_program:make", {"config": to_dict(cfg)})
