"""The streaming protocol (evaluation/streaming.py): the cache it keeps, its losses against a recomputation from the
sinks and the window at positions 0 .. L-1, batching across streams, row keys and labels, config refusals, and
one tiny eval next to the other protocols."""

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_runs import assert_one_line_error

from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.results import setting_label
from evaluation.store import row_key
from evaluation.streaming import StreamingCache, stream_count, stream_losses
from model import GPT, ModelConfig
from model.pe import SCHEMES

CPU = torch.device("cpu")


class Tokens:
    """The part of data.TokenArray the evaluation reads."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def read(self, start: int, length: int) -> np.ndarray:
        assert 0 <= start and start + length <= len(self.ids)
        return self.ids[start : start + length]


def tiny(pe: str, layers: int) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=layers, n_head=2, n_embd=32, vocab_size=64, fused_ce="never")
    model = GPT(cfg, SCHEMES[pe].config_class(), train_seq_len=8).eval()
    with torch.no_grad():  # peaked attention: at initialisation it is nearly uniform, and positions barely matter
        for block in model.blocks:
            block.attn.qkv.weight *= 20
    return model


def test_the_cache_keeps_the_sinks_and_the_recent_tokens():
    cache = StreamingCache(sinks=2, window=3)
    t = torch.arange(7.0).view(1, 1, 7, 1)
    assert cache.kept(t).flatten().tolist() == [0, 1, 5, 6]  # 2 sinks, window - 1 recent: the next token makes 3
    assert cache.kept(t[:, :, :4]).flatten().tolist() == [0, 1, 2, 3]  # nothing to drop yet
    assert StreamingCache(sinks=0, window=1).kept(t).numel() == 0


@pytest.mark.parametrize("pe", ["rope", "alibi", "none"])
def test_one_layer_losses_equal_a_recomputation_from_sinks_and_window(pe):
    """With one layer a cached key and value depend on the token alone (keys unrotated), so the streaming loss of
    target t is the loss of a forward pass over [k sinks, the w tokens before t] at positions 0 .. L-1."""
    model = tiny(pe, 1)
    ids = np.random.default_rng(0).integers(0, 64, 80)
    length, sinks, first, n_targets = 8, 2, 8, 30
    loss_sum, counts = stream_losses(model, Tokens(ids), first, n_targets, length, sinks, length, CPU, torch.float32)
    assert stream_count(n_targets, length, length) == 1 and counts.sum() == n_targets
    assert counts[:-1].sum() == 0  # every scored query sits at cache position L - 1
    start = first - length  # the stream's first token: its sinks
    total = 0.0
    with torch.no_grad():
        for t in range(first, first + n_targets):
            context = np.concatenate([ids[start : start + sinks], ids[t - (length - sinks) : t]])
            logits = model(torch.from_numpy(context)[None])[0, -1]
            total += F.cross_entropy(logits[None], torch.tensor([int(ids[t])])).item()
    assert loss_sum.sum().item() == pytest.approx(total, rel=1e-5)


def test_streams_in_a_batch_equal_streams_run_alone():
    model = tiny("rope", 2)
    ids = np.random.default_rng(1).integers(0, 64, 200)
    length, sinks, first, n_targets = 8, 2, 8, 64
    batched, counts = stream_losses(model, Tokens(ids), first, n_targets, length, sinks, 4 * length, CPU, torch.float32)
    streams = stream_count(n_targets, length, 4 * length)
    run = n_targets // streams
    assert streams == 4 and counts.sum() == n_targets
    alone = sum(
        stream_losses(model, Tokens(ids), first + r * run, run, length, sinks, length, CPU, torch.float32)[0].sum()
        for r in range(streams)
    )
    assert batched.sum().item() == pytest.approx(float(alone), rel=1e-6)


def test_rows_and_labels_tell_streaming_apart():
    common = {"length": 16, "stride": None, "ppl": 3.0, "split_digest": "d", "target_range": [16, 32]}
    streaming = {**common, "protocol": "streaming", "sinks": 4, "window": 12}
    other_k = {**streaming, "sinks": 2, "window": 14}
    plain = {**common, "protocol": "nonoverlapping"}
    assert len({row_key(row, PERPLEXITY_ROWS) for row in (streaming, other_k, plain)}) == 3
    assert setting_label(streaming) == "streaming (k=4)"
    assert setting_label({**plain, "attn_temperature": {"type": "logn"}}) == "nonoverlapping logn"


@pytest.mark.slow
def test_refusals_and_an_eval_beside_the_other_protocols(cli, reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    refused = cli.eval_here(run, "eval.protocols=[streaming]", "eval.streaming_sinks=16")
    assert_one_line_error(refused, "eval.streaming_sinks=16 leaves no window")
    refused = cli.eval_here(run, "eval.protocols=[streaming]", "eval.streaming_sinks=-1")
    assert_one_line_error(refused, "eval.streaming_sinks=-1 is out of its domain")
    refused = cli.eval_here(run, "eval.protocols=[streamin]")
    assert_one_line_error(refused, "nonoverlapping, sliding, streaming")
    done = cli.eval_here(run, "eval.length_multipliers=[1]", "eval.protocols=[nonoverlapping,sliding,streaming]")
    assert done.returncode == 0, done.stderr
    assert "streaming (k=4)" in done.stdout
    rows = json.loads((run / "eval" / "extrapolation.json").read_text())["results"]
    streaming = [row for row in rows if row["protocol"] == "streaming"]
    assert [(row["sinks"], row["window"]) for row in streaming] == [(4, 12)] and streaming[0]["ppl"] is not None
