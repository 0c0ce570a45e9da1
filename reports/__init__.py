"""Comparing runs over seeds, for scripts/compare.py: which runs are seeds of one setting (runs.py), mean ± 95% CI
tables and the differences claimed (tables.py), perplexity (perplexity.py), validation curves (curves.py), task
accuracy and the copy probe (task_tables.py), key-token perplexity (key_tokens.py).
Imports core, model, experiment and evaluation (never training, nor training it)."""
