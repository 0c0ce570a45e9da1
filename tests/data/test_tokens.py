"""Token arrays (data/tokens.py): reads across shards."""

import numpy as np
import pytest
from data_files import token_array

from data import (
    TokenArray,
)

pytestmark = pytest.mark.usefixtures("cache_dir")  # every test writes its token cache under its own tmp_path


def test_token_array_reads_across_shards(tmp_path):
    tokens, expected = token_array(tmp_path, [5, 1, 7, 3])
    assert len(tokens) == 16
    for start in range(16):
        for length in range(17 - start):
            assert np.array_equal(tokens.read(start, length), expected[start : start + length])
    view = TokenArray(tokens.shards, 4, 14)
    assert len(view) == 10 and np.array_equal(view.read(0, 10), expected[4:14])
    with pytest.raises(IndexError):
        view.read(5, 6)
