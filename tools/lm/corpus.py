"""The demo's corpus: the King James Bible as Debian's bible-kjv package prints it.

Why this text: it is real English prose (~790k words, a 12.8k-word vocabulary with a
Zipfian tail, the shape word-level language models are about), it is in Debian main
(bible-kjv + bible-kjv-text, 2.8 MB installed, no R or SWORD tool chain as
r-cran-janeaustenr or sword-text-web would need), and one command prints all of it in
well under a second. Tokens: lower-cased words and punctuation, one <eos> per verse.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from dataclasses import dataclass

import torch

_VERSE = re.compile(r"^\s*\d+\s+(.*)$")
_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|[.,;:?!]")


@dataclass
class Corpus:
    vocab: list            # id -> word, most frequent first (the log-uniform sampler's order)
    train: torch.Tensor    # token ids
    valid: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def kjv_text() -> str:
    """The whole Bible, Genesis 1:1 to Revelation 22:21, from the `bible` command."""
    try:
        out = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                             check=True, timeout=60)
    except FileNotFoundError:
        raise SystemExit("the demo's corpus needs Debian's bible-kjv package "
                         "(apt-get install bible-kjv; tools/quickstart installs it)") from None
    return out.stdout


def verses(text: str):
    """One string per verse: chapter headings dropped, wrapped lines joined."""
    verse = None
    for line in text.splitlines():
        m = _VERSE.match(line)
        if m:
            if verse is not None:
                yield verse
            verse = m.group(1)
        elif line.strip() and verse is not None and not line.startswith(" "):
            if re.match(r"^[1-3]?\s?[A-Z][a-z]+.* \d+$", line.strip()):  # "Genesis 2"
                yield verse
                verse = None
            else:
                verse += " " + line.strip()
    if verse is not None:
        yield verse


def load(valid_fraction: float = 0.02, cache: str = "") -> Corpus:
    """Tokenised corpus; the last valid_fraction of verses is held out."""
    if cache and os.path.exists(cache):
        return torch.load(cache)
    tokens = [_TOKEN.findall(v.lower()) + ["<eos>"] for v in verses(kjv_text())]
    counts = Counter(t for verse in tokens for t in verse)
    vocab = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    ids = {w: i for i, w in enumerate(vocab)}
    split = int(len(tokens) * (1 - valid_fraction))
    as_ids = lambda vs: torch.tensor([ids[t] for v in vs for t in v], dtype=torch.int64)
    corpus = Corpus(vocab, as_ids(tokens[:split]), as_ids(tokens[split:]))
    if cache:
        tmp = f"{cache}.{os.getpid()}"
        torch.save(corpus, tmp)
        os.replace(tmp, cache)
    return corpus


def streams(ids: torch.Tensor, n: int) -> torch.Tensor:
    """ids cut into n equal contiguous streams (n x len), as LM batchify does."""
    length = len(ids) // n
    return ids[:n * length].reshape(n, length)
