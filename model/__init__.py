"""The model: GPT (gpt.py), the attention layer and attention written out (attention.py; the one that merges two
rotations by distance, windowed_attention.py) and its kernels, chosen per layer from one registry (kernels.py; a
kernel's fallback, fallback.py), the attention temperature (temperature.py) and sink (sink.py), documents kept
apart in a row (documents.py), the loss (loss.py), generation with a KV cache (sampling.py), positional schemes (pe/).
Imports only core, and runs without Hydra (the schema registration lives in experiment/)."""

from model.gpt import GPT, KVCache, ModelConfig, validate_model_config

__all__ = ["GPT", "KVCache", "ModelConfig", "validate_model_config"]
