"""The training loop and its pieces (optimizer, schedule, step, batch stream, checkpointing, starting from a parent
run's weights, metrics, multi-process).
Imports core, data, model, experiment and evaluation; train.py only calls ``training.loop.train``."""
