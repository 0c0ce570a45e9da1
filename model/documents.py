"""Documents packed into one row (``data.document_aware``): attention and positions that keep each document apart.

A row's documents come as an id per token, (B, T), equal within a document and growing along the row
(data/windows.py separate_documents: the <|endoftext|> that ends a document belongs to it). With them, query i
attends key j only where j <= i and both lie in one document, a block-diagonal causal mask per row, and each
token's position is its index within its document (0 at a document's first token). Each document is then computed
as if it were alone in the row, whatever the scheme.

Every attention kernel takes the mask (model/attention.py, model/kernels.py): the written-out path and sdpa's
blockwise masks put -inf across documents (:func:`same_document`), the windowed path of remapped distances leaves
those pairs out, and FlexAttention gets a block mask whose mask_mod compares the two tokens' documents
(:func:`document_block_mask`). The paths that run without a mask (sdpa's fused causal kernel, a pair term folded into
q and k, the CPU sink kernel) are not taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


def within_document_index(documents: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids -> each token's index within its document, (B, T): the tokens before it in its document,
    which are its position and one less than the keys it attends."""
    index = torch.arange(documents.shape[-1], device=documents.device).expand_as(documents)
    first = torch.ones_like(documents[..., :1], dtype=torch.bool)
    starts = torch.cat((first, documents[..., 1:] != documents[..., :-1]), dim=-1)  # a document's first token
    # the index of the latest start at or before each token: the first token of its document
    return index - torch.where(starts, index, 0).cummax(dim=-1).values


def same_document(documents: torch.Tensor, queries: slice, keys: slice) -> torch.Tensor:
    """(B, Tq, Tk) bool: whether each query (indices ``queries``) and key (indices ``keys``) lie in one document."""
    return documents[:, queries, None] == documents[:, None, keys]


def document_block_mask(documents: torch.Tensor, window: int | None = None) -> BlockMask:
    """FlexAttention's BlockMask of the block-diagonal causal mask of (B, T) document ids, within a sliding window of
    ``window`` keys if not None (i - W < j <= i): key blocks wholly in another document (or outside the window) are
    skipped. create_block_mask evaluates the mask at every (row, query, key), B x T x T: the
    price of masks that differ by row (the causal one alone is built from its block structure, model/kernels.py)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (documents[b, q_idx] == documents[b, kv_idx])

    def windowed_mask_mod(b, h, q_idx, kv_idx):
        return mask_mod(b, h, q_idx, kv_idx) & (q_idx - kv_idx < window)

    B, T = documents.shape
    chosen = mask_mod if window is None else windowed_mask_mod
    return create_block_mask(chosen, B=B, H=None, Q_LEN=T, KV_LEN=T, device=str(documents.device))
