"""Training: fine-tuning with resumable checkpoints, evaluation, the convergence check and the probe
heads trained on frozen layers."""
