"""The scheme registry (model/pe/__init__.py) and what a scheme declares: the schemes it discovers, the settings each
changes at evaluation time, and the variations it is evaluated with. Each scheme's own equation: its module's test
file (tests/model/pe/test_<scheme>.py)."""

import pytest
import torch
from pe_schemes import DIMS, build

from core.errors import PosGPTError
from model.pe import SCHEMES
from model.pe.alibi import ALiBiConfig
from model.pe.hybrid import HybridPositionalEncoding as Pattern
from model.pe.rope import RoPEConfig


def test_registry_discovers_the_five_schemes():
    assert {"none", "sinusoidal", "learned", "rope", "alibi"} <= set(SCHEMES)


def test_registry_discovers_the_new_schemes():
    assert {"t5", "kerple", "fire", "xpos", "cope"} <= set(SCHEMES)


def test_rope_declares_scaling_and_remap_as_its_evaluation_time_settings():
    assert SCHEMES["rope"].eval_time_settings == SCHEMES["p_rope"].eval_time_settings == ("scaling", "remap")
    assert SCHEMES["scaled_nope"].eval_time_settings == ("score_scaling",)  # SWAN-GPT's switch (swan.py)
    own = ("rope", "p_rope", "scaled_nope")
    others = [name for name in SCHEMES if name not in own and not issubclass(SCHEMES[name], Pattern)]
    assert all(SCHEMES[name].eval_time_settings == () for name in others)  # patterns have their parts' (hybrid.py)


def test_eval_variations_are_declared_by_the_scheme():
    """What evaluation/run.py needs, without naming a scheme: the variants and a way to apply them."""
    from model.pe.rope_scaling import RoPEScalingConfig

    pe = build("rope", RoPEConfig())
    variations = pe.eval_variations(["none", "yarn:8", "yarn:8.0", "ntk:4"])
    assert [label for label, _ in variations] == ["", "yarn:8", "ntk:4"]  # no scaling: the run as trained
    q = torch.randn(1, 1, 4, DIMS.head_dim)
    before = pe.rotate(q, q, torch.arange(4), 4)[0]
    with pe.evaluated_with(variations[1][1]):
        assert pe.cfg.scaling == RoPEScalingConfig(type="yarn", factor=8.0)
        assert not torch.allclose(pe.rotate(q, q, torch.arange(4), 4)[0], before)
    assert pe.cfg.scaling.type == "none"
    assert pe.eval_variations([]) == [("", {"scaling": RoPEScalingConfig()})]
    alibi = build("alibi", ALiBiConfig())
    assert alibi.eval_variations([]) == [("", {})]
    with pytest.raises(PosGPTError, match="no evaluation-time variations"):
        alibi.eval_variations(["yarn:8"])
    with pytest.raises(PosGPTError, match="cannot change at evaluation time"):
        with pe.evaluated_with({"base": 500.0}):
            pass
