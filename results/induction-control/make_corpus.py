"""The corpus of the induction control: text in which every passage repeats. Each row of the .jsonl written to argv[1]
is a passage of n consecutive whitespace-separated words of one standard-library file (n uniform in 8..40,
about 10-70 GPT-2 tokens), written twice: a model that copies from its context predicts the repeat.

    python make_corpus.py repeated.jsonl     # 50,000 rows (seed 0), ~22 MB; 7.3M training tokens
"""

import json
import random
import sys
import sysconfig
from pathlib import Path

rng = random.Random(0)
stdlib = Path(sysconfig.get_paths()["stdlib"])
files = sorted(path for path in stdlib.rglob("*.py") if "site-packages" not in path.parts)
texts = [text for text in (path.read_text(errors="ignore").split() for path in files) if len(text) > 50]
with open(sys.argv[1], "w") as out:
    for _ in range(50_000):
        words = rng.choice(texts)
        n = rng.randint(8, 40)
        start = rng.randrange(len(words) - n)
        passage = " ".join(words[start : start + n])
        out.write(json.dumps({"text": passage + " " + passage}) + "\n")
