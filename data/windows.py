"""Random training windows, nanoGPT style; or examples of a generated task (data/tasks/); and the documents a
window holds (data.document_aware)."""

import numpy as np
import torch

from core.errors import PosGPTError
from data.tasks import Task
from data.tokenizer import EOT_TOKEN
from data.tokens import TokenArray

IGNORED = -100  # a target the loss leaves out (model/loss.py's ignore_index)


def random_positions(
    batch: int, seq_len: int, n_positions: int, generator: torch.Generator, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """(batch, seq_len) positions, each row a sorted random subset of [0, n_positions) (Ruoss et al. 2023: an
    instance of n tokens takes n of the N positions, uniformly, in order). ``lengths`` (batch,): the tokens of each
    row's instance, right-padded to seq_len (a task's training batch); its first lengths[b] positions are then a
    sorted uniform subset of all N, not the smallest of seq_len draws, and its pads (never seen by the instance,
    never scored) repeat its last position. Without ``lengths`` every row is seq_len tokens long."""
    order = torch.rand(batch, n_positions, generator=generator).argsort(dim=1)[:, :seq_len]  # a random subset
    if lengths is None:
        return order.sort(dim=1).values
    slots = torch.arange(seq_len)
    instance = slots < lengths[:, None]
    ranked = order.masked_fill(~instance, n_positions).sort(dim=1).values  # the instance's own, sorted, first
    last = ranked.gather(1, (lengths.clamp(min=1) - 1)[:, None])
    return torch.where(instance, ranked, last)


def check_split_length(tokens: TokenArray, seq_len: int) -> None:
    """A split too short for one training window: seq_len + 1 tokens, and torch.randint's upper bound in
    :func:`sample_batch` must stay positive."""
    if len(tokens) < seq_len + 2:
        raise PosGPTError(
            f"the {tokens.name} split has {len(tokens):,} tokens, fewer than seq_len+2={seq_len + 2}; "
            "lower train.seq_len or add data"
        )


def sample_batch(
    tokens: TokenArray, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_size windows at random starts: inputs x and next-token targets y, int64 of shape (batch_size, seq_len).

    The starts come from `generator` alone, so saving and restoring its state resumes the exact sequence
    of batches.
    """
    check_split_length(tokens, seq_len)
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=generator)
    windows = torch.from_numpy(np.stack([tokens.read(int(start), seq_len + 1) for start in starts]).astype(np.int64))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def draw_batch(
    source: TokenArray | Task, batch_size: int, seq_len: int, generator: torch.Generator, training: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch from either kind of data source: random windows of a token split, or examples of a task
    (targets -100 except on its answers). Either way drawn from ``generator`` alone. ``training``: a task's
    training batch (Task.training_batch: the lengths and settings the task trains on); otherwise instances of
    exactly seq_len tokens at the task's own settings, as evaluated."""
    if training:
        return draw_training_batch(source, batch_size, seq_len, generator)[:2]
    if isinstance(source, Task):
        return source.sample(batch_size, seq_len, generator)
    return sample_batch(source, batch_size, seq_len, generator)


def draw_training_batch(
    source: TokenArray | Task, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A training batch (x, y) and the input tokens of each row's instance (a task's right-padded instances;
    None for windows of a token split, whose every token is the row's)."""
    if isinstance(source, Task):
        return source.training_instances(batch_size, seq_len, generator)
    return *sample_batch(source, batch_size, seq_len, generator), None


def separate_documents(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents of a batch of windows (``data.document_aware``): each token's document, (B, T) int64 counted
    from 0 along each row, and the targets with the ones another document would predict left out (-100).

    Every document of the token stream ends with <|endoftext|> (data/cache.py). That token belongs to the document it
    ends, and the token after it starts the next one, so a document and its <|endoftext|> are what the cache stored
    for it, and a document's first token is at position 0. The target of an <|endoftext|> is the next document's
    first token, which only the ended document's context would predict: it is the one target per boundary left out.
    Every other target keeps its context within its own document, the <|endoftext|> that ends it included."""
    ends = x == EOT_TOKEN
    documents = ends.cumsum(dim=1) - ends.long()  # the ends counted before each token: the end is its document's
    return documents, y.masked_fill(ends, IGNORED)
