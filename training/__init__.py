"""The training loop and its pieces (optimizer, schedule, step, batches); train.py only calls ``train``."""
