"""The model: GPT (gpt.py), attention kernels (attention.py), positional schemes (pe/)."""

from model.gpt import GPT, KVCache, ModelConfig, validate_model_config

__all__ = ["GPT", "KVCache", "ModelConfig", "validate_model_config"]
