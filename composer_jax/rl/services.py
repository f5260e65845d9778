"""The RL services, one module each; they talk only through the rollout stream (`rl/stream.py`)
and the weight store (`publish(version, params)`, `fetch(version)`, `latest()`); the backend
(`rl/backend.py`) decides where each one runs.

- `rl/inference_service.py`  InferenceService: the policy server, new versions applied in flight
- `rl/jobs.py`               Job, run_job: a rollout worker's episode (crash -> error rollout)
- `rl/trainer.py`            TrainerService: B groups -> learner step -> publish, checkpoint, log
- `rl/evaluators.py`         EvaluatorService, CheckpointEvaluator: held-out evaluation
- `rl/batch_metrics.py`      staleness, behaviour and weight-sync metrics

This module re-exports them under their old import path.
"""
from composer_jax.rl.batch_metrics import (BEHAVIOUR_TERMS, behaviour_metrics,  # noqa: F401
                                           error_metrics, group_staleness, level_metrics,
                                           resolved_of, staleness, standard_error, sync_stats,
                                           tree_nbytes)
from composer_jax.rl.evaluators import CheckpointEvaluator, EvaluatorService  # noqa: F401
from composer_jax.rl.inference_service import InferenceService  # noqa: F401
from composer_jax.rl.jobs import EVAL, TRAIN, Job, run_job  # noqa: F401
from composer_jax.rl.trainer import TrainerProgress, TrainerService  # noqa: F401
