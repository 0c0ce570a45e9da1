"""Pieces shared by train.py and eval.py: config schema, errors, run directories, checkpoints, logging."""
