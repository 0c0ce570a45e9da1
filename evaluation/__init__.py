"""Length-extrapolation evaluation: perplexity per context length and protocol, peak memory, and its reports.
Imports core, data, model and experiment (never training)."""
