"""What `-word` and `+word` do on real photos: the threshold a picture must reach to carry a
word, and car pictures left in the top 10 of car queries.

    python benchmarks/bench_query_edits.py [--bundle DIR --index DIR] [--json OUT]

On the 800 flickr8k photos with the offline model (``_common.photo_index``, or the bundle and
index given). A photo *shows* a word when at least two of its five captions name it (car: car,
cars, truck, vehicle, jeep). Part 1: for thresholds 0 to 1.5, the share of the photos that show
the word whose stored weight reaches it, and the share of the others. Part 2: car pictures in the
top 10 of car queries as typed, with ``car`` only taken out of the query vector, and with
``-car`` (out of the vector, and the pictures carrying it left out).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
from collections import defaultdict

import _common

_common.use_repository()

WORDS = {"car": r"\b(car|cars|truck|vehicle|jeep)\b", "dog": r"\bdogs?\b", "beach": r"\bbeach\b"}
THRESHOLDS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
CAR_QUERIES = ("dogs in a car", "a red car", "people near a car")


def shows(captions: dict[str, list[str]], path: str, pattern: str) -> bool:
    return sum(bool(re.search(pattern, c)) for c in captions[os.path.basename(path)]) >= 2


def share(weights: list[float], threshold: float) -> float:
    """Of these stored weights, the share that carries the word at ``threshold`` (0: present)."""
    return round(sum(w >= threshold if threshold > 0 else w > 0 for w in weights) / len(weights), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle")
    parser.add_argument("--index")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    from d2s_search.backends.opensearch.features import lucene_feature_value
    from d2s_search.search import SearchOptions, encode_text_query, run_query

    captions: dict[str, list[str]] = defaultdict(list)
    with open(_common.DATA / "flickr8k-800" / "captions.txt", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            captions[row["image"]].append(row["caption"].lower())
    encoder, backend = _common.open_photo_index(args.bundle, args.index)
    summary = _common.provenance()
    try:
        ids = [r[0] for r in backend._connect(False).execute("SELECT id FROM docs")]
        docs = backend.get(ids)
        carries = {}
        for word, pattern in WORDS.items():
            split = {True: [], False: []}
            for doc in docs:
                split[shows(captions, doc.path, pattern)].append(lucene_feature_value(doc.sparse.get(word, 0.0)))
            carries[word] = {f"{t:g}": {"showing": share(split[True], t), "others": share(split[False], t)}
                             for t in THRESHOLDS}
            carries[word]["photos showing it"] = len(split[True])
        top10 = {}
        for text in CAR_QUERIES:
            typed = encode_text_query(encoder, text)
            vector_only = {t: w for t, w in typed.full.items() if t != "car"}
            edited = encode_text_query(encoder, f"{text} -car")
            runs = {"as typed": backend.sparse_search(typed.full, 10),
                    "car out of the vector": backend.sparse_search(vector_only, 10),
                    "-car": run_query(backend, edited, SearchOptions(k=10)).hits}
            top10[text] = {name: sum(shows(captions, h.path, WORDS["car"]) for h in hits) for name, hits in runs.items()}
    finally:
        backend.close()
    summary.update({"photos": len(docs), "carries (stored weight at least the threshold)": carries,
                    "car pictures in the top 10": top10})
    print(_common.table(["query", "as typed", "car out of the vector", "-car"],
                        [[q, *r.values()] for q, r in top10.items()]))
    _common.write_json(_common.finish(summary), args.json_out)


if __name__ == "__main__":
    main()
