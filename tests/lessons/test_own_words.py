"""Lesson text is ours: no run of 8 words of the post appears in a lesson, a docstring or a comment of the
package. The post itself is not kept here; tests/data/post_shingles.txt holds a hash of each of its runs of
8 words (lower case, letters and digits only), made once from the post with the recipe below."""
import hashlib
import re
from pathlib import Path

import parasim

ROOT = Path(parasim.__file__).parent
N = 8
# runs of 8 words that are citations, not prose: the post's section headings, named where a lesson says which
# section it works through (each lesson file's `section`), the example sentence whose tokens are traced, and
# the titles of two papers the published runs cite (parasim/clock/runs.py: a source named by its title)
ALLOWED: set[str] = {
    "narayanan et al efficient large scale language model", "et al efficient large scale language model training",
    "al efficient large scale language model training on", "efficient large scale language model training on gpu",
    "large scale language model training on gpu clusters", "scale language model training on gpu clusters using",
    "language model training on gpu clusters using megatron", "model training on gpu clusters using megatron lm",
    "korthikanti et al reducing activation recomputation in large",
    "et al reducing activation recomputation in large transformer",
    "al reducing activation recomputation in large transformer models",
    "context parallelism split the sequence through the whole", "parallelism split the sequence through the whole layer",
    "one example with everything an moe model on", "example with everything an moe model on 16",
    "with everything an moe model on 16 gpus", "the court ruled that the contract was void",
}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("\u2019", "").replace("'", ""))


def _hashes(words: list[str]) -> dict[str, str]:
    return {hashlib.sha1(" ".join(words[i:i + N]).encode()).hexdigest()[:12]: " ".join(words[i:i + N])
            for i in range(len(words) - N + 1)}


def _post() -> set[str]:
    lines = (Path(__file__).resolve().parents[1] / "data" / "post_shingles.txt").read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def _ours() -> dict[str, str]:
    files = sorted(ROOT.rglob("*.py")) + sorted((ROOT.parent / "lessons").glob("*.py"))
    out = {}
    for path in files:
        out.update({h: f"{path.name}: {words}" for h, words in _hashes(_words(path.read_text())).items()})
    return out


def test_no_run_of_8_words_of_the_post_in_the_package_or_lessons():
    post = _post()
    copied = [where for h, where in _ours().items() if h in post and where.split(": ", 1)[1] not in ALLOWED]
    assert not copied, copied


def test_the_check_finds_a_copied_sentence():
    """It can fail: a sentence of the post (its words, hashed the same way) is found."""
    sentence = "Heads must stay whole because a score is a dot product over all of a head's dimensions"
    assert set(_hashes(_words(sentence))) & _post()
