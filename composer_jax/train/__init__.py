"""Pretraining / SFT: pure losses, the pure jitted train step, optimizers, checkpoints, the loop."""
