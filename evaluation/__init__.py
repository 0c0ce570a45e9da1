"""Length-extrapolation evaluation: perplexity per context length and protocol, peak memory, attention statistics,
Student-t intervals, the checks of evaluation settings, and the reports and plots.
Imports core, data, model and experiment (never training)."""
