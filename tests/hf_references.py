"""Numbers computed by Hugging Face transformers' own code, written by tests/reference/make_hf_references.py
(which says how to regenerate them): the reference the schemes' tests compare posgpt with."""

import json
from pathlib import Path

HF_REFERENCES = json.loads((Path(__file__).parent / "reference" / "hf_references.json").read_text())
