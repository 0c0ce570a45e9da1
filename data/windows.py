"""Random training windows, nanoGPT style; or examples of a generated task (data/tasks/); the documents a
window holds (data.document_aware); and the positions a window may be trained at instead of 0..T-1 (randomized
positions, train.random_positions; PoSE's skipped chunks, train.pose)."""

from dataclasses import dataclass

import numpy as np
import torch

from core.domain import domain
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


@dataclass
class PoSEConfig:
    """Positional Skip-wise training (``train.pose``; Zhu et al., ICLR 2024, "PoSE: Efficient Context Window
    Extension of LLMs via Positional Skip-wise Training"): train at train.seq_len with positions that cover
    ``target_len``. See :func:`pose_positions` for the draw."""

    # L_t, the length the positions cover (the paper's target context window); None: PoSE off
    target_len: int | None = domain(None, ge=2, commands=("train", "estimate"))  # estimate: its attention path
    chunks: int = domain(2, ge=2)  # N, the chunks a window is cut into (the paper's and its script's: 2)

    def check(self, seq_len: int) -> None:
        """PosGPTError unless these settings can train windows of ``seq_len`` tokens."""
        if self.target_len is None:
            if self.chunks != PoSEConfig.chunks:
                raise PosGPTError(
                    f"train.pose.chunks={self.chunks} is read only with train.pose.target_len: set it, or drop "
                    "train.pose.chunks"
                )
            return
        if self.target_len <= seq_len:
            raise PosGPTError(
                f"train.pose.target_len={self.target_len} must exceed train.seq_len={seq_len}: PoSE trains a window "
                "of train.seq_len tokens at positions that cover the longer target length"
            )
        if self.chunks > seq_len:
            raise PosGPTError(
                f"train.pose.chunks={self.chunks} cuts a window of train.seq_len={seq_len} tokens into more chunks "
                "than it has tokens; lower train.pose.chunks"
            )


def _uniform(low: torch.Tensor, high: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One whole number per row, uniform over [low, high] (both included, low <= high), from ``generator``."""
    draw = torch.rand(low.shape, generator=generator, dtype=torch.float64)
    return torch.minimum(low + (draw * (high - low + 1)).floor().long(), high)


def _chunk_lengths(lengths: torch.Tensor, chunks: int, generator: torch.Generator) -> torch.Tensor:
    """(B, chunks) the chunks' lengths, each row summing to its length. Two chunks (the reference's training
    script, src/train_pose.py, train_preprocess_function_pose): the first l_0 ~ U{1, ..., floor((n + 1) / 2)}, the
    second the rest. More (the paper's appendix B code, Figure 6): l_i ~ U{1, ..., n - sum_{j<i} l_j - (N - 1 - i)}
    in turn, the last the rest; a row shorter than N tokens (a short task instance) leaves its last chunks empty."""
    rows = []
    remaining = lengths.clone()
    for i in range(chunks - 1):
        low = remaining.clamp(max=1)
        high = (remaining + 1) // 2 if chunks == 2 else remaining - (chunks - 1 - i)
        size = _uniform(low, torch.maximum(high, low), generator)
        rows.append(size)
        remaining = remaining - size
    return torch.stack([*rows, remaining], dim=1)


def pose_positions(
    batch: int, seq_len: int, pose: PoSEConfig, generator: torch.Generator, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """(batch, seq_len) PoSE positions. Each row's n tokens (seq_len; a task instance's own, ``lengths``) are cut
    into N chunks of consecutive positions, chunk i shifted by a skip u_i (the paper's eq. 3-4):

        positions of chunk i = u_i + st_i, ..., u_i + st_i + l_i - 1,   st_i = l_0 + ... + l_{i-1}
        u_0 = 0,  u_i ~ U{u_{i-1}, ..., L_t - n}

    so a row starts at position 0 and ends below L_t = target_len, and every relative distance up to L_t - 1 can
    occur. The chunk lengths are drawn as :func:`_chunk_lengths` says, anew for every row, from ``generator`` after
    the row's tokens (so a resumed run draws the same). The reference's script fixes u_0 = 0 ("this revision makes
    the coverage possibility more uniform for large relative positions"), as the paper's text does. Only the
    positions move: a row's tokens stay the window as drawn, consecutive text, the paper's variant v_i = 0 of the
    chunks' content (its Table 4: little effect); the reference draws the second chunk's text from further on in
    the document. Pads past a task instance's n tokens repeat its last position, as :func:`random_positions`'s."""
    n = torch.full((batch,), seq_len) if lengths is None else lengths.long()
    sizes = _chunk_lengths(n, pose.chunks, generator)
    skips = [torch.zeros(batch, dtype=torch.long)]
    for _ in range(pose.chunks - 1):
        skips.append(_uniform(skips[-1], pose.target_len - n, generator))
    starts = sizes.cumsum(dim=1) - sizes
    slots = torch.arange(seq_len)
    chunk = (slots[None, :, None] >= starts[:, None, 1:]).sum(dim=-1)  # the chunk each slot lies in
    positions = slots[None, :] + torch.stack(skips, dim=1).gather(1, chunk)
    last = positions.gather(1, (n.clamp(min=1) - 1)[:, None])
    return torch.where(slots[None, :] < n[:, None], positions, last)


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


def check_documents(tokens: TokenArray, corpus: str, chunk: int = 1 << 24) -> None:
    """Refuse data.document_aware for a training split of one document: its windows never hold two, so the run
    would train exactly as without the setting. Reads until a second <|endoftext|> is found (at once for a corpus
    of many documents)."""
    ends = 0
    for start in range(0, len(tokens), chunk):
        ends += int(np.count_nonzero(tokens.read(start, min(chunk, len(tokens) - start)) == EOT_TOKEN))
        if ends >= 2:
            return
    raise PosGPTError(
        f"data.document_aware=true keeps a window's documents apart at their <|endoftext|> tokens, and the "
        f"{tokens.name} split of data {corpus!r} is one document ({len(tokens):,} tokens, {ends} <|endoftext|>): "
        "it would train as without it; give a corpus of several documents or drop data.document_aware"
    )


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
