"""Numbers computed by the schemes' reference code (Hugging Face transformers, microsoft/torchscale), written by
tests/support/reference/make_reference_numbers.py (which says how to regenerate them): what the schemes' tests
compare posgpt with, rather than a transcription of our own reading."""

import json
from pathlib import Path

REFERENCE_NUMBERS = json.loads((Path(__file__).parent / "reference" / "reference_numbers.json").read_text())
