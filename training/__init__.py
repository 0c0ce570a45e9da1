"""The training loop and its pieces (optimizer, schedule, step, batches, checkpointing, metrics, multi-process).
Imports core, data, model, experiment and evaluation; train.py only calls ``training.loop.train``."""
