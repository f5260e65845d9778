"""An RL task family in one module: "reply with only the letter X" (docs/rl.md "Adding an RL task").

    python launch.py --experiment=rl_async --set rl.task=examples.rl_task_letter --set rl.steps=5
"""
import dataclasses
import random

from composer_jax.agent.tasks import SingleTurnFamily
from composer_jax.config import TaskConfig
from composer_jax.rl.tasks import register


@dataclasses.dataclass(frozen=True)
class LetterConfig(TaskConfig):
    """The family's section `rl.task` (set with --set rl.task.letters=abc)."""
    family: str = __name__                 # a plug-in family is named by its module path
    letters: str = "abcdefgh"


@register
class LetterFamily(SingleTurnFamily):
    name = __name__
    config_cls = LetterConfig

    def make_tasks(self, split: str) -> list[str]:
        """Task ids `letter/nonce`; train and held-out ("eval") ids never overlap."""
        t = self.task_cfg
        n = t.num_train_tasks if split == "train" else t.num_eval_tasks
        rng = random.Random(self.cfg.seed + (split == "eval"))
        return [f"{rng.choice(t.letters)}/{split}{i}" for i in range(n)]

    def messages(self, task_id: str) -> list[dict]:
        letter = task_id.split("/")[0]
        return [{"role": "system", "content": "Reply with the requested letter only."},
                {"role": "user", "content": letter}]

    def score(self, task_id: str, reply: str) -> tuple[float, bool]:
        """Reward: the fraction of the reply's characters that are the letter."""
        letter, text = task_id.split("/")[0], reply.replace("<|im_end|>", "").strip()
        reward = sum(c == letter for c in text) / len(text) if text else 0.0
        return reward, reward == 1.0
