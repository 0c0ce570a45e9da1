"""Sample continuations from a trained run, with a KV cache, at any length the scheme can encode.

    python sample.py run_dir=outputs/2026-11-22/10-00-00-rope sample.prompt="def main" sample.max_new_tokens=200
    python sample.py run_dir=... sample.prompt_file=prompt.txt sample.num_samples=3 sample.seed=1
    python sample.py run_dir=... sample.temperature=0                            # greedy
    python sample.py run_dir=<rope run> sample.max_new_tokens=2000 pe.scaling.type=yarn pe.scaling.factor=8
    python sample.py run_dir=<rope run> sample.max_new_tokens=2000 pe.remap.type=rerope pe.remap.window=32

The run's config is recomposed exactly as eval.py does it (its training overrides, then these), with the same
refusals: overrides that would change what the weights compute are errors, and so is a length the scheme
cannot encode (pe=learned beyond its table). A run trained on a task (task=passkey, ...) is refused: its
vocabulary is the task's symbols, not text (eval.py measures it). The scheme's evaluation-time settings
(pe.scaling, pe.remap) apply. Each sample is streamed to stdout as it is generated; sample.num_samples samples are
drawn one after the other from one generator seeded with sample.seed, so a seed always gives the same text on the
same device.

It writes no file and takes no lock. Every check (the run and its checkpoint, the overrides, the device, sample.*,
the prompt file, the length the scheme can encode) runs before the first line is printed, so a refused command
prints its error alone.
"""

from __future__ import annotations

import core.interrupts  # noqa: F401 (first: Ctrl-C while the libraries below import is one line)

import codecs
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from core.cli import exit_on_user_error
from core.config_keys import overridden_keys
from core.domain import is_set
from core.errors import PosGPTError
from core.files import read_user_text
from core.runtime import autocast
from data import EOT_TOKEN, gpt2_encoding
from experiment.build import load_trained_run, parse_run_dir, require_text_run
from experiment.config import SampleConfig
from model import GPT
from model.sampling import check_length, generate

USAGE = 'usage: python sample.py run_dir=<training run directory> [sample.prompt="..."] [sample.* and other overrides]'
SEPARATOR = "-" * 30


def validate_sample_config(cfg: DictConfig, keys: list[str]) -> None:
    """The checks across sample.* keys (each key's domain is checked with the whole config); a setting the
    sampling would not read is refused among ``keys``, those the command line sets (the trained config's are the
    run's, never held against it)."""
    s = cfg.sample
    if s.prompt and s.prompt_file:
        raise PosGPTError("set sample.prompt or sample.prompt_file, not both")
    if s.temperature == 0:  # greedy: the most likely token, drawn from nothing
        defaults = SampleConfig()
        for name in ("top_k", "seed"):
            if s[name] != getattr(defaults, name) and is_set(f"sample.{name}", keys):
                raise PosGPTError(
                    f"sample.{name}={s[name]} is read only when sampling; sample.temperature=0 decodes greedily "
                    f"and ignores it: drop it or set sample.temperature above 0"
                )


def prompt_tokens(cfg: DictConfig) -> list[int]:
    """The prompt's GPT-2 token ids; an empty prompt starts from <|endoftext|>, as documents do in training."""
    text = cfg.sample.prompt
    if cfg.sample.prompt_file:
        text = read_user_text(cfg.sample.prompt_file, "sample.prompt_file")
    ids = gpt2_encoding().encode(text, allowed_special={"<|endoftext|>"}) if text else [EOT_TOKEN]
    if max(ids) >= cfg.model.vocab_size:
        raise PosGPTError(f"the prompt has token ids >= model.vocab_size={cfg.model.vocab_size}")
    return ids


class TextStream:
    """Writes tokens to stdout as they come; bytes of a character split across tokens wait for the rest."""

    def __init__(self) -> None:
        self.encoding = gpt2_encoding()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, ids: list[int]) -> None:
        data = b"".join(self.encoding.decode_single_token_bytes(i) for i in ids)
        sys.stdout.write(self.decoder.decode(data))
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.write(self.decoder.decode(b"", final=True) + "\n")
        sys.stdout.flush()


@dataclass(frozen=True)
class SamplePlan:
    """Sampling, planned: the model (weights loaded, in eval mode, the scheme's evaluation-time variation set) and
    where it runs; what the header names (the run directory, its scheme and variation, the checkpoint's step, the
    training length); the prompt's token ids; and the sample.* settings."""

    run_dir: Path
    model: GPT
    device: torch.device
    dtype: torch.dtype
    pe_name: str
    variation: str  # "" for the scheme as trained
    step: int
    train_seq_len: int
    ids: tuple[int, ...]
    settings: SampleConfig


def plan_sampling(run_dir: Path, overrides: list[str]) -> SamplePlan:
    """Every check of sampling, before the first token is printed: the run (a language-model run), the sample.*
    settings (none the decoding ignores), the prompt, and whether prompt and new tokens fit the scheme."""
    run = load_trained_run(run_dir, overrides, "sample.py")
    require_text_run(run, "sampling text from it")
    validate_sample_config(run.cfg, overridden_keys(overrides))
    ids = prompt_tokens(run.cfg)
    settings = OmegaConf.to_object(run.cfg.sample)
    check_length(run.model, len(ids) + settings.max_new_tokens)
    return SamplePlan(
        run_dir=run.dir,
        model=run.model,
        device=run.device,
        dtype=run.dtype,
        pe_name=run.cfg.pe.name,
        variation=run.model.pe.current_variation(),
        step=run.checkpoint["step"],
        train_seq_len=run.cfg.train.seq_len,
        ids=tuple(ids),
        settings=settings,
    )


def sample(plan: SamplePlan) -> None:
    """Print the planned samples, each token as it comes: each sample streams the prompt, then the tokens
    model.sampling.generate draws (with the KV cache), under the run's autocast; one generator seeded with
    sample.seed draws them all, one sample after the other."""
    ids, s, device = list(plan.ids), plan.settings, plan.device
    variation = plan.variation
    print(
        f"sample: {plan.run_dir} (pe={plan.pe_name}{' ' + variation if variation else ''}, step "
        f"{plan.step}, trained at length {plan.train_seq_len}): {len(ids)} prompt tokens + "
        f"{s.max_new_tokens} new, temperature {s.temperature}, top_k {s.top_k}, seed {s.seed}",
        file=sys.stderr,
        flush=True,
    )
    generator = torch.Generator(device=device).manual_seed(s.seed)
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    for number in range(1, s.num_samples + 1):
        print(f"{SEPARATOR} sample {number} {SEPARATOR}", flush=True)
        stream = TextStream()
        stream.write(ids)
        with autocast(device, plan.dtype):
            generate(
                plan.model,
                prompt,
                s.max_new_tokens,
                s.temperature,
                s.top_k,
                generator,
                on_token=lambda token, stream=stream: stream.write(token[0].tolist()),
            )
        stream.close()


@exit_on_user_error
def main(argv: list[str]) -> None:
    run_dir, overrides = parse_run_dir(argv, USAGE)
    sample(plan_sampling(run_dir, overrides))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main(sys.argv[1:])
