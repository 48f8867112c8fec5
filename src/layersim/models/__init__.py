"""Models and their layer stacks: the model registry (short names, snapshotting, loading), running an
encoder layer by layer (truncation, skipping), the random-init control and the task heads."""
