"""A scheme built from its config at small dimensions (the tests of model/pe/'s schemes' equations)."""

from model.pe import SCHEMES, ModelDims

DIMS = ModelDims(n_embd=32, n_head=4, head_dim=8, train_seq_len=16, init_std=0.02)


def build(name, cfg, dims=DIMS):
    return SCHEMES[name](cfg, dims)


# The token signal under model.embedding=fairseq (model/gpt.py): N(0, d^-1/2) times sqrt(d).
FAIRSEQ_DIMS = ModelDims(
    n_embd=32, n_head=4, head_dim=8, train_seq_len=16, init_std=0.02, token_init_std=32**-0.5, token_scale=32**0.5
)
