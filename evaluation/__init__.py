"""Length-extrapolation evaluation: perplexity per context length and protocol, and its reports."""
