"""Length-extrapolation evaluation: perplexity per context length and protocol (the streaming protocol in
streaming.py), key-token perplexity (key_tokens.py), task accuracy and the copy probe, peak memory, attention
statistics, Student-t intervals, the checks of evaluation settings, and the reports and plots.
Imports core, data, model and experiment (never training)."""
