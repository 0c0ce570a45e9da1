"""The corpus of the induction control: text in which every passage repeats. Each row of the .jsonl written to
argv[1] is a passage of n consecutive whitespace-separated words of one standard-library file (n uniform in
8..40, about 10-70 GPT-2 tokens), written twice: a model that copies from its context predicts the repeat.

    python make_corpus.py repeated.jsonl     # 50,000 rows (seed 0), ~22 MB; 7.3M training tokens
"""

import json
import random
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path


def passages(seed: int) -> Iterator[str]:
    """Passages of 8-40 consecutive words of the standard library's files, drawn without end (halves.py draws its
    held-out ones here too, with another seed)."""
    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(path for path in stdlib.rglob("*.py") if "site-packages" not in path.parts)
    texts = [text for text in (path.read_text(errors="ignore").split() for path in files) if len(text) > 50]
    while True:
        words = rng.choice(texts)
        n = rng.randint(8, 40)
        start = rng.randrange(len(words) - n)
        yield " ".join(words[start : start + n])


if __name__ == "__main__":
    with open(sys.argv[1], "w") as out:
        for _, passage in zip(range(50_000), passages(seed=0)):
            out.write(json.dumps({"text": passage + " " + passage}) + "\n")
