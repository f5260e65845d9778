"""The pretraining-loss -> RL-score sweep (`launch.py --experiment=cpt_rl_sweep`): per-cell
results (`cells`), correlation statistics (`stats`) and the written report (`report`)."""
