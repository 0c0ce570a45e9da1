"""What an attention path cannot take is refused where the path is chosen (model/kernels.py, resolve_path): at
build, and again whenever a scheme's settings change (an evaluation-time variation). So the plans, which build the
model on the meta device and apply each variation to it, refuse what a forward pass would, and a forward pass
never refuses what was built: the property below is checked for every scheme of the registry, with and without a
sink logit, as trained and under every variation its parser takes of those the registries generate."""

import pytest
import torch

from core.errors import PosGPTError
from model import GPT, ModelConfig
from model.pe import SCHEMES
from model.pe.rope_remap import REMAPS
from model.pe.rope_scaling import ROPE_SCALINGS

TRAIN_LEN = 16
# A variation of each kind the registries hold: each scaling at factor 2, each remap with a window inside L.
REMAP_SPECS = {"self_extend": "self_extend:2:8", "rerope": "rerope:8", "string": "string:8:2"}
SPECS = [f"{name}:2" for name in ROPE_SCALINGS if name != "none"] + [REMAP_SPECS[name] for name in REMAPS[1:]]


def test_a_variation_of_every_kind_is_generated():
    assert set(REMAP_SPECS) == set(REMAPS) - {"none"} and len(SPECS) == len(ROPE_SCALINGS) - 1 + len(REMAPS) - 1


def built(scheme: str, sink: bool) -> GPT | None:
    """The scheme's tiny model with or without a sink, or None where building it refuses."""
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=64, attn_sink=sink)
    try:
        return GPT(cfg, SCHEMES[scheme].config_class(), train_seq_len=TRAIN_LEN)
    except PosGPTError:
        return None


def forward(model: GPT, grad: bool) -> None:
    """A pass over L tokens, with gradients (training) or without (scoring); a refusal here fails the test."""
    ids = torch.randint(0, 64, (2, TRAIN_LEN), generator=torch.Generator().manual_seed(0))
    try:
        with torch.set_grad_enabled(grad):
            model(ids)
    except PosGPTError as error:
        pytest.fail(f"refused in a forward pass, after the model was built or varied: {error}")


@pytest.mark.parametrize("sink", [False, True], ids=["no-sink", "sink"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_what_is_built_or_varied_runs_and_what_cannot_run_is_refused_before(scheme, sink):
    torch.manual_seed(0)
    model = built(scheme, sink)
    if model is None:
        return
    forward(model, grad=True)  # what was built trains
    for spec in SPECS:
        try:
            variations = model.pe.eval_variations([spec])
        except PosGPTError:  # a variation the scheme does not take: refused by its parser, at plan time
            continue
        for _, settings in variations:
            try:
                with model.pe.evaluated_with(settings):
                    forward(model, grad=False)  # what was applied scores
            except PosGPTError:  # refused where it is applied (the plans apply each one), before any pass
                pass


def test_a_sink_beside_a_path_without_a_softmax_is_refused_where_the_path_is_chosen():
    """The members the property above covers by name: the rotations merged by distance (a remap's written-out
    path) and a scheme whose weights are not a softmax, each refused before any forward pass."""
    rope = built("rope", sink=True)
    (_, settings), *_ = rope.pe.eval_variations(["rerope:8"])
    with pytest.raises(PosGPTError, match="no sink logit"):
        with rope.pe.evaluated_with(settings):
            pass
    refused = [name for name in SCHEMES if built(name, sink=True) is None and built(name, sink=False) is not None]
    assert "stickbreaking" in refused
