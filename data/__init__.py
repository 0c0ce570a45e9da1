"""Text in, token batches out: corpus sources, the GPT-2 tokenizer, the token cache and batch sampling; and
the synthetic tasks (data/tasks/), the other kind of data source.
Imports only core (never model, experiment, evaluation or training).

cfg = DataConfig(source="text", files=["book.txt"])
splits = load_splits(cfg)                  # tokenized once, cached under $POSGPT_CACHE_DIR
x, y = sample_batch(splits["train"], 8, 256, torch.Generator().manual_seed(0))
"""

from data.cache import check_corpus, corpus_identity, describe_corpus, eval_tokens, load_split, load_splits
from data.config import DataConfig, resolve_cache_dir, validate_data_config
from data.tokenizer import EOT_TOKEN, gpt2_encoding
from data.tokens import TokenArray
from data.windows import check_documents, check_split_length, draw_batch, sample_batch, separate_documents

__all__ = [
    "EOT_TOKEN",
    "DataConfig",
    "TokenArray",
    "check_corpus",
    "check_documents",
    "check_split_length",
    "corpus_identity",
    "describe_corpus",
    "draw_batch",
    "eval_tokens",
    "gpt2_encoding",
    "load_split",
    "load_splits",
    "resolve_cache_dir",
    "sample_batch",
    "separate_documents",
    "validate_data_config",
]
