"""torch.compile of the training step, for every scheme of the registry (so a scheme added later is covered),
on CPU: one whole graph (fullgraph=True: dynamo reports no graph break), and the compiled step's losses and
parameters equal eager's over 3 steps. And a compilation that fails at the first step falls back to eager.

Backends. CPU inductor compiles a tiny model's step in minutes (C++ code generation: 340 s for ALiBi on
this shared 2-core machine), so the equality over every scheme uses ``aot_eager`` (dynamo's graph capture and
AOTAutograd's forward/backward split, which is where graph breaks and autograd mistakes show, run by eager
kernels) and inductor compiles one bias scheme, whose code generation is the rest of the risk.

Recompilation under evaluation. A scheme without a score bias is captured with dynamic shapes from its
second length on (torch's automatic dynamic shapes): at most 2 compilations for any number of lengths. A
scheme with a score, content or cumulative bias, or its own attention weights, compiles once per length: its sdpa
(math) path loops over blocks of queries whose count depends on the length, so dynamo specialises on it.
Evaluation lengths are few (eval.length_multipliers; eval.py does not compile), but torch stops compiling a
function after ``torch._dynamo.config.recompile_limit`` (8) versions and runs it eagerly from then on.

Time on the shared 2-core machine (load 9): 75 s for the aot_eager equality over the 10 schemes, 75 s for
inductor on ALiBi (its code cache warm; 340 s cold), 180 s for the recompilation counts.
"""

import pytest
import torch
from compiled_training import assert_same_training, batches, three_steps, tiny, train_step
from torch._dynamo.testing import CompileCounterWithBackend

from model.pe import SCHEMES
from model.pe import capabilities as cap

ALL = sorted(SCHEMES)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_every_scheme_compiles_as_one_graph_and_trains_as_eager(name):
    assert_same_training(name, "aot_eager")


@pytest.mark.slow
@pytest.mark.e2e
def test_inductor_compiles_a_bias_scheme_and_trains_as_eager():
    assert_same_training("alibi", "inductor")


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_recompilations_under_evaluation_are_bounded(name):
    model = tiny(name).eval()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    limit = model.pe.max_positions() or 10**9
    lengths = [n for n in (16, 24, 40) if n <= limit]  # a recompilation per length shows from the third
    with torch.no_grad():
        for length in lengths:
            x, y = batches(1, length)[0]
            torch.testing.assert_close(compiled(x, y, reduction="none"), model(x, y, reduction="none"))
    # loops over blocks (a bias, a window of keys), or over chunks too, in some layer
    looped = (cap.ScoreBias, cap.SlidingWindow, cap.ModifiesAttention)
    blockwise = any(isinstance(scheme, looped) for scheme, _ in model.pe.layer_schemes())
    bound = len(lengths) if blockwise else 2
    assert counter.frame_count <= bound


@pytest.mark.slow
def test_a_compilation_failing_at_the_first_step_falls_back_to_eager(capsys):
    def broken_backend(graph, example_inputs):
        raise RuntimeError("inductor: no C++ compiler\nlong log")

    model = tiny("alibi")
    step = train_step(torch.compile(model, backend=broken_backend), model, eager=model)
    assert step.compiled
    losses = torch.stack([step(x, y)[0] for x, y in batches()])
    assert not step.compiled and step.model is model
    assert capsys.readouterr().err.count("warning: torch.compile failed at the first training step") == 1
    _, eager_losses, _ = three_steps("alibi", None)
    torch.testing.assert_close(losses, eager_losses, rtol=0, atol=0)
