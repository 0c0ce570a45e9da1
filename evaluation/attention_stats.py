"""Attention diagnostics: where each head looks, and how spread out its attention is, at 1x and past the
training length (scripts/inspect_attention.py).

For one head, p[i, j] is query i's attention probability on key j <= i (each row sums to 1, or less: below). Three
statistics, per layer and head, accumulated over evaluation windows of length T:

- weight by distance: w_i(d) = p[i, i - d] for d = 0 .. i, so each row's weights sum to 1 over the distances
  it can see. The mean weight at distance d is the mean of w_i(d) over every query with i >= d; it is reported
  in log-spaced bins of d (the mean over every (query, distance) pair in the bin). A linear distance penalty
  of slope m_h shows as a decay ~exp(-m_h d); a head that breaks past the training length shows as weight at
  distances it never saw. The mean distance of a head, E_i[sum_d d w_i(d)], summarises the curve in one number.
- entropy by query position: H_i = -sum_j p[i, j] ln p[i, j] (nats), between 0 (one key) and ln(i + 1)
  (uniform over the i + 1 keys), in log-spaced bins of the 1-based position i + 1. Its growth with length
  dilutes attention; YaRN's temperature (rope_scaling.py) counteracts it.
- attended mass by query position: m_i = sum_j p[i, j], 1 for a softmax; a scheme whose own weights replace the
  softmax (stick-breaking) may leave part of a row unattended. The entropy and the mean distance are then those of
  the row's weights normalised to sum 1 (what the attended part looks like), and m_i says how much there is of it.

The probabilities come from the math path (``GPT.hidden_states(..., capture=probs)``, model/gpt.py), one window
at a time; each layer's (H, T, T) block is reduced to O(H T) numbers as soon as the window is done, so
memory is n_layer * H * T^2 floats for one window (8 MB for the tiny model at 8x its length of 64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from core.errors import PosGPTError
from core.files import read_json
from core.host_memory import available_bytes
from core.runtime import autocast
from evaluation.plots import add_titles, new_figure, save, scheme_colour
from evaluation.run import EVAL_DIR

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from data import TokenArray

BINS_PER_OCTAVE = 4
ATTENTION_FILE = "attention.json"  # in <run_dir>/eval/; "attention_<variation>.json" for a scheme's variation


def log_bins(n: int, per_octave: int = BINS_PER_OCTAVE) -> list[tuple[int, int]]:
    """Bins [lo, hi) of the integers 1 .. n, log-spaced (~per_octave per doubling, each at least one wide)."""
    count = max(1, math.ceil(per_octave * math.log2(n + 1)))
    edges = np.unique(np.geomspace(1, n + 1, count + 1).round().astype(int))
    return [(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:])]


def weights_by_distance(probs: torch.Tensor) -> torch.Tensor:
    """(..., Tq, Tk) causal probabilities, queries at Tk - Tq .. Tk - 1 -> (..., Tq, Tk) weights w[i, d] =
    p[i, i - d], zero where d > i (distances the query cannot see)."""
    Tq, Tk = probs.shape[-2:]
    query = torch.arange(Tk - Tq, Tk, device=probs.device)[:, None]
    key = query - torch.arange(Tk, device=probs.device)[None, :]
    gathered = probs.gather(-1, key.clamp(min=0).expand(*probs.shape[:-2], Tq, Tk))
    return gathered.masked_fill(key < 0, 0.0)


@dataclass
class LayerSums:
    """Running sums over windows for one layer (float64): enough for every reported mean."""

    weight: torch.Tensor  # (H, T): sum over queries of w_i(d)
    entropy: torch.Tensor  # (H, T): sum over windows of H_i (of the normalised row)
    distance: torch.Tensor  # (H,): sum over queries of sum_d d w_i(d) (of the normalised row)
    mass: torch.Tensor  # (H, T): sum over windows of m_i
    windows: int = 0

    @classmethod
    def zeros(cls, n_head: int, length: int) -> LayerSums:
        z = torch.zeros
        return cls(
            z(n_head, length, dtype=torch.float64),
            z(n_head, length, dtype=torch.float64),
            z(n_head, dtype=torch.float64),
            z(n_head, length, dtype=torch.float64),
        )

    def add(self, probs: torch.Tensor) -> None:
        """probs: (B, H, T, T) for B windows of length T."""
        weights = weights_by_distance(probs)
        distances = torch.arange(probs.shape[-1], device=probs.device, dtype=probs.dtype)
        mass = probs.sum(-1)
        share = 1 / mass.clamp_min(torch.finfo(probs.dtype).tiny)  # a row that attends nothing adds 0, not NaN
        self.weight += weights.sum(dim=(0, 2)).double().cpu()
        self.distance += ((weights * distances).sum(-1) * share).sum(dim=(0, 2)).double().cpu()
        self.entropy += torch.special.entr(probs * share[..., None]).sum(-1).sum(0).double().cpu()
        self.mass += mass.sum(0).double().cpu()
        self.windows += probs.shape[0]


@dataclass
class LengthStats:
    length: int
    layers: list[LayerSums] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """The documented JSON entry for this length (see scripts/inspect_attention.py)."""
        T, windows = self.length, self.layers[0].windows
        bins = log_bins(T)
        # Pairs (query, distance d) over all windows: queries d .. T-1 can see distance d.
        pairs = windows * (T - torch.arange(T, dtype=torch.float64))
        queries = torch.full((T,), float(windows), dtype=torch.float64)  # one query per position and window
        positions = torch.arange(1, T + 1, dtype=torch.float64)

        def binned(values: torch.Tensor, weights: torch.Tensor) -> list:
            """Weighted mean of values (..., T) within each bin of the last axis."""
            return torch.stack(
                [values[..., lo - 1 : hi - 1].sum(-1) / weights[lo - 1 : hi - 1].sum() for lo, hi in bins], dim=-1
            ).tolist()

        return {
            "length": T,
            "windows": windows,
            "reason": None,
            "distance_bins": [[lo - 1, hi - 1] for lo, hi in bins],
            "mean_weight": [binned(layer.weight, pairs) for layer in self.layers],
            "mean_distance": [(layer.distance / (windows * T)).tolist() for layer in self.layers],
            "position_bins": [[lo, hi] for lo, hi in bins],
            "entropy": [binned(layer.entropy, queries) for layer in self.layers],
            "uniform_entropy": binned(positions.log(), torch.ones(T, dtype=torch.float64)),
            "attended_mass": [binned(layer.mass, queries) for layer in self.layers],
        }


@torch.no_grad()
def attention_statistics(
    model: torch.nn.Module, tokens: TokenArray, length: int, windows: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """Statistics over up to ``windows`` consecutive windows of ``length`` tokens from the start of ``tokens``;
    an entry with a ``reason`` (and nothing else) where the scheme, the data or the memory left cannot provide one
    window."""
    if reason := model.pe.beyond_reach(length):
        return {"length": length, "windows": 0, "reason": reason}
    if reason := _beyond_memory(model, length, device):
        return {"length": length, "windows": 0, "reason": reason}
    n_windows = min(windows, len(tokens) // length)
    if n_windows == 0:
        return {
            "length": length,
            "windows": 0,
            "reason": f"the validation split has {len(tokens)} tokens, fewer than one window",
        }
    stats = LengthStats(length)
    for w in range(n_windows):
        window = torch.from_numpy(tokens.read(w * length, length).astype(np.int64)).to(device)
        probs: list[torch.Tensor] = []
        with autocast(device, dtype):
            model.hidden_states(window[None], capture=probs)  # no logits: the output head is not needed
        if not stats.layers:
            stats.layers = [LayerSums.zeros(p.shape[1], length) for p in probs]
        for sums in stats.layers:
            sums.add(probs.pop(0))  # reduce, then free this layer's T x T block
    return stats.report()


def _beyond_memory(model: torch.nn.Module, length: int, device: torch.device) -> str | None:
    """Every layer's T x T attention weights per head are captured at once (fp32), and about two more layers' worth
    while one is computed: where the system has not that much memory left, the process would be killed."""
    available = available_bytes() if device.type == "cpu" else None
    layers, heads = model.cfg.n_layer, model.cfg.n_head
    need = (layers + 2) * heads * length**2 * 4
    if available is None or need <= available:
        return None
    return (
        f"its attention weights need about {need / 2**30:,.1f} GiB ({layers} layers x {heads} heads x {length}^2), "
        f"and {available / 2**30:.1f} GiB of memory is available"
    )


def _bin_centres(bins: list[list[int]], offset: int = 0) -> np.ndarray:
    """Geometric centre of each [lo, hi) bin of the 1-based quantity (distance + 1 or position)."""
    return np.array([math.sqrt((lo + offset) * (hi - 1 + offset)) for lo, hi in bins])


def _grid(n_rows: int, n_cols: int) -> tuple[Figure, np.ndarray]:
    fig = new_figure(2.8 * n_rows + 0.6, 4.2 * n_cols)
    return fig, np.atleast_2d(fig.subplots(n_rows, n_cols, squeeze=False))


def plot_distance(document: dict[str, Any], path) -> None:
    """Mean attention weight vs query-key distance: a row per layer, a column per length, a line per head."""
    entries = [e for e in document["lengths"] if e["reason"] is None]
    fig, axes = _grid(len(entries[0]["mean_weight"]), len(entries))
    for col, entry in enumerate(entries):
        x = _bin_centres(entry["distance_bins"], offset=1) - 1  # distance 0 stays at 0 (symlog axis)
        for layer, heads in enumerate(entry["mean_weight"]):
            ax = axes[layer, col]
            for head, values in enumerate(heads):
                ax.plot(x, values, label=f"head {head} (mean d {entry['mean_distance'][layer][head]:.1f})")
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlim(left=0)
            ax.set_yscale("log")
            ax.set_ylim(bottom=max(ax.get_ylim()[0], 1e-8))  # below 1e-8 (ALiBi's far tails) nothing is seen
            _finish_panel(ax, document, layer, entry)
    for ax in axes[-1]:
        ax.set_xlabel("query-key distance (log scale)")
    for ax in axes[:, 0]:
        ax.set_ylabel("mean attention weight")
    add_titles(fig, f"pe={document['pe']}: attention by distance", _caption(document, "a line per head"))
    save(fig, path)


def plot_entropy(document: dict[str, Any], path) -> None:
    """Attention entropy vs query position: a row per layer, a column per length, a line per head."""
    entries = [e for e in document["lengths"] if e["reason"] is None]
    fig, axes = _grid(len(entries[0]["entropy"]), len(entries))
    for col, entry in enumerate(entries):
        x = _bin_centres(entry["position_bins"])
        for layer, heads in enumerate(entry["entropy"]):
            ax = axes[layer, col]
            for head, values in enumerate(heads):
                ax.plot(x, values, label=f"head {head}")
            ax.plot(x, entry["uniform_entropy"], color="black", linestyle=":", label="uniform, ln(i+1)")
            ax.set_xscale("log")
            _finish_panel(ax, document, layer, entry)
    for ax in axes[-1]:
        ax.set_xlabel("query position (log scale)")
    for ax in axes[:, 0]:
        ax.set_ylabel("entropy (nats)")
    add_titles(fig, f"pe={document['pe']}: attention entropy by position", _caption(document, "a line per head"))
    save(fig, path)


def _finish_panel(ax, document: dict[str, Any], layer: int, entry: dict[str, Any]) -> None:
    """The training length (dashed), the panel's title, grid and legend."""
    ax.axvline(document["train_seq_len"], color="grey", linestyle="--", linewidth=1)
    ax.set_title(f"layer {layer}, windows of {entry['length']}", fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small")


def _caption(document: dict[str, Any], lines: str) -> str:
    """What the title leaves out: the variation, the training length and step, what the lines and dashes are."""
    variation = f"{document['variation']}, " if document.get("variation") else ""
    trained = f"trained at length {document['train_seq_len']} (step {document['step']})"
    return f"{variation}{trained}; {lines}; dashed: the training length"


def plot_entropy_comparison(documents: list[tuple[str, dict[str, Any]]], path) -> None:
    """Entropy by position, averaged over heads, one panel per layer and one line per run, coloured by scheme;
    each run at the longest length it was inspected at."""
    n_layers = max(len(_longest(doc)["entropy"]) for _, doc in documents)
    fig, axes = _grid(1, n_layers)
    for label, document in documents:
        entry = _longest(document)
        x = _bin_centres(entry["position_bins"])
        for layer, heads in enumerate(entry["entropy"]):
            axes[0, layer].plot(
                x, np.mean(heads, axis=0), color=scheme_colour(document["pe"]), label=f"{label} (L={entry['length']})"
            )
    for layer, ax in enumerate(axes[0]):
        for train_len in sorted({doc["train_seq_len"] for _, doc in documents}):
            ax.axvline(train_len, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"layer {layer}", fontsize="small")
        ax.set_xlabel("query position (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0, 0].set_ylabel("entropy (nats), mean over heads")
    add_titles(
        fig,
        "Attention entropy by position",
        "a line per run (mean over heads), at the longest length it was inspected at; dashed: the training length",
    )
    save(fig, path)


def read_attention(run_dirs: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """(label, document) of each run's <run_dir>/eval/attention.json."""
    documents = []
    for run_dir in run_dirs:
        path = Path(run_dir) / EVAL_DIR / ATTENTION_FILE
        if not path.is_file():
            raise PosGPTError(f"{path} does not exist: run python scripts/inspect_attention.py run_dir={run_dir}")
        document = read_json(path)  # a damaged file (cut short, not JSON) is refused, naming it
        if not isinstance(document, dict) or not isinstance(document.get("pe"), str) or "lengths" not in document:
            raise PosGPTError(f"{path} is malformed: expected a JSON object with 'pe' and 'lengths'")
        documents.append((f"{document['pe']} ({Path(run_dir).resolve().name})", document))
    return documents


def _longest(document: dict[str, Any]) -> dict[str, Any]:
    return max((e for e in document["lengths"] if e["reason"] is None), key=lambda e: e["length"])
