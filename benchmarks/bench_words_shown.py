"""The words a person reads: inflections collapsed, a picture's words by weight x IDF.

    python benchmarks/bench_words_shown.py [--bundle DIR --index DIR] [--queries 200] [--json OUT]

On the 800 flickr8k photos with the offline model (``_common.photo_index``, or the bundle and
index given). Part 1, what is shown: of each picture's ten words, the share of slots taken by a
second form of a word already shown (raw weight order against inflections collapsed), and the
share of those ten that most pictures carry (df above half the index) by weight and by weight x
IDF. Part 2, what it costs: ``run_query`` (sparse, k=10 and 100, explain 5: every matched term asked for
when the query holds two forms of one word, then collapsed) against the backend's own explained
search of the same query (5 raw terms), on the first captions as queries, one thread; and a
picture's words (document frequencies and ordering) against sorting its terms by weight.
"""

from __future__ import annotations

import argparse
import csv
import time

import _common

_common.use_repository()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle")
    parser.add_argument("--index")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    from d2s_search.inflections import inflections, picture_words
    from d2s_search.search import SearchOptions, encode_text_query, explain_depth, run_query

    table = inflections()
    encoder, backend = _common.open_photo_index(args.bundle, args.index)
    summary = _common.provenance()
    try:
        ids = [r[0] for r in backend._connect(False).execute("SELECT id FROM docs")]
        docs = backend.get(ids)
        n_docs, df = backend.document_frequencies({t for d in docs for t in d.sparse})
        common = {t for t, c in df.items() if c > n_docs / 2}
        repeated = raw_common = idf_common = slots = 0
        for doc in docs:
            raw = sorted(doc.sparse.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
            repeated += len(raw) - len({table.key(t) for t, _ in raw})
            raw_common += sum(t in common for t, _ in raw)
            shown = picture_words(doc.sparse, (n_docs, {t: df[t] for t in doc.sparse}), table)[:10]
            idf_common += sum(w.word in common for w in shown)
            slots += len(raw)
        part1 = {"pictures": len(docs), "top-10 slots": slots,
                 "second forms in the top 10, raw": round(repeated / slots, 3), "... collapsed": 0.0,
                 "words most pictures carry in the top 10, by weight": round(raw_common / slots, 3),
                 "... by weight x IDF": round(idf_common / slots, 3)}

        with open(_common.DATA / "flickr8k-800" / "captions.txt", encoding="utf-8") as fh:
            texts = [row["caption"] for row in csv.DictReader(fh)][: args.queries]
        queries, encoding = [], []
        for text in texts:  # for scale: what encoding a query's text takes
            t0 = time.perf_counter()
            queries.append(encode_text_query(encoder, text))
            encoding.append(time.perf_counter() - t0)
        grouped = sum(explain_depth(q.full, 5) > 5 for q in queries)
        p50 = {}
        for k in (10, 100):
            options = SearchOptions(mode="sparse", k=k, explain=5)
            for q in queries[:20]:  # warm: structures loaded, kernels bound
                backend.sparse_search(q.full, k, explain=5)
                run_query(backend, q, options)
            raw, words = [], []
            for _ in range(3):
                for q in queries:
                    t0 = time.perf_counter()
                    backend.sparse_search(q.full, k, explain=5)
                    t1 = time.perf_counter()
                    run_query(backend, q, options)
                    t2 = time.perf_counter()
                    raw.append(t1 - t0)
                    words.append(t2 - t1)
            p50[f"k={k}"] = {"raw terms (backend, explain 5)": _common.percentiles(raw)["p50_ms"],
                             "words (run_query, collapsed)": _common.percentiles(words)["p50_ms"]}
        detail = {"sorted by weight": [], "picture_words (df + IDF order)": []}
        for doc in docs[:200]:
            t0 = time.perf_counter()
            sorted(doc.sparse.items(), key=lambda kv: (-kv[1], kv[0]))
            t1 = time.perf_counter()
            picture_words(doc.sparse, backend.document_frequencies(doc.sparse), table)
            t2 = time.perf_counter()
            detail["sorted by weight"].append(t1 - t0)
            detail["picture_words (df + IDF order)"].append(t2 - t1)
        detail_p50 = {k: _common.percentiles(v)["p50_ms"] for k, v in detail.items()}
    finally:
        backend.close()
    summary.update({"shown": part1, "queries": len(queries), "queries with two forms of a word": grouped,
                    "search p50 ms": p50, "picture detail p50 ms": detail_p50,
                    "text encoding p50 ms": _common.percentiles(encoding[10:])["p50_ms"]})
    print(render(summary))
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    shown = _common.table(["measure", "share"], [[k, v] for k, v in summary["shown"].items()
                                                 if k not in ("pictures", "top-10 slots")])
    rows = []
    for k, times in summary["search p50 ms"].items():
        ref = times["raw terms (backend, explain 5)"]
        rows += [[f"{k}: {name}", f"{v:.3f}", _common.ratio(v, ref)] for name, v in times.items()]
    cost = _common.table(["search (sparse)", "p50 ms", "ratio"], rows)
    dref = summary["picture detail p50 ms"]["sorted by weight"]
    detail = _common.table(["a picture's words", "p50 ms", "ratio"],
                           [[k, f"{v:.3f}", _common.ratio(v, dref)] for k, v in summary["picture detail p50 ms"].items()])
    return (f"{shown}\n\n{cost}\n\n{detail}\n\n{summary['queries with two forms of a word']} of "
            f"{summary['queries']} caption queries hold two forms of one word; encoding a query's text takes "
            f"{summary['text encoding p50 ms']:.1f} ms (p50, same run).\n\n{_common.caption(summary)}")


if __name__ == "__main__":
    main()
