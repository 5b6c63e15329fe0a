"""Search page latency: from the request to rendered results in a real browser, next to the
bare API latency measured in the same run.

    python benchmarks/bench_serve.py [--images DIR] [--queries 40] [--k 20] [--top-k N] [--json]

Exports the tiny-blip bundle and ingests the flickr8k photos once (cached under
benchmarks/.cache/serve/), serves them with uvicorn on 127.0.0.1 (a free port), and for
each query plan runs the same caption queries

* through the API (httpx, one client, keep-alive): request sent -> JSON parsed;
* right after, the same query through the page (Playwright + the system Chromium,
  headless): the page's own timer from the search being submitted to the result grid being
  in the DOM and painted (render), and to every thumbnail on it having loaded (images).
  Pairing each page search with its API call keeps the comparison fair on a busy machine.

The paired pass starts with an empty thumbnail cache (emptied before each plan: cold); a
second pass repeats the queries in the page with the thumbnails on disk (a fresh browser
context, so nothing comes from the browser's cache: warm).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.serve.conftest import CHROMIUM_ARGS, chromium_path  # noqa: E402
from tests.serve.live import start_server  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache" / "serve"
DATA = ROOT.parent / "shared" / "data" / "flickr8k-800"
MODES = ("sparse", "two-phase", "dense", "hybrid")


def bundle_path() -> Path:
    path = CACHE / "bundle-tiny-blip"
    if not (path / "manifest.json").is_file():
        from d2s_onnx_export.export import export_bundle

        path.parent.mkdir(parents=True, exist_ok=True)
        export_bundle("tiny-blip", path, overwrite=True)
    return path


def index_path(bundle: Path, images: Path, top_k: int | None) -> Path:
    from d2s_search.backends.local import LocalBackend
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    from d2s_search.ingest import ingest

    path = CACHE / f"index-{images.parent.name}-{'all' if top_k is None else f'top{top_k}'}"
    b = Bundle.load(bundle)
    backend = LocalBackend(path)
    backend.open(b.identity())
    try:
        report = ingest([images], Encoder(b, device="cpu"), backend, top_k=top_k)  # skips what is stored
        print(f"index {path.name}: {backend.count()} pictures ({report.stored} new)", file=sys.stderr)
    finally:
        backend.close()
    return path


def caption_queries(n: int) -> list[str]:
    """The first caption of every fifth picture: varied, real descriptions."""
    seen: dict[str, str] = {}
    with open(DATA / "captions.txt", newline="") as fh:
        for row in csv.DictReader(fh):
            seen.setdefault(row["image"], row["caption"].strip(" ."))
    return list(seen.values())[::5][:n]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict:
    return {"p50": round(statistics.median(values), 1), "p90": round(pct(values, 90), 1), "n": len(values)}


def api_once(client, q: str, mode: str, k: int) -> float:
    start = time.perf_counter()
    body = client.get("/api/search", params={"q": q, "mode": mode, "k": k}).raise_for_status().json()
    elapsed = (time.perf_counter() - start) * 1000
    assert body["results"] or mode == "two-phase"
    return elapsed


def page_once(page, i: int, q: str, mode: str) -> dict:
    """One search typed into the page; the page's own timings of it."""
    page.fill("#q", q)
    page.press("#q", "Enter")
    page.wait_for_function(f"Number(document.body.dataset.searches || 0) > {i}")
    if page.locator(".card").count():
        page.wait_for_selector("#grid[data-images=loaded]")
    timing = page.evaluate("window.d2s.timings[window.d2s.timings.length - 1]")
    assert timing["mode"] == mode, timing
    return timing


def bench_mode(browser, url: str, queries: list[str], mode: str, k: int, thumbs: Path) -> dict:
    """Cold pass: each query through the API and then the page, back to back (so both see the
    same load on a shared machine), thumbnails made on first view. Warm pass: the page again."""
    import httpx

    shutil.rmtree(thumbs, ignore_errors=True)
    runs: dict[str, list[float]] = {k_: [] for k_ in ("api", "answered", "render", "cold", "warm", "warm_render", "gap")}
    with httpx.Client(base_url=url, timeout=60) as client:
        for pass_ in ("cold", "warm"):
            context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=url)
            page = context.new_page()
            page.goto(f"/?mode={mode}&k={k}")
            page.wait_for_selector("body[data-ready=true]")
            for i, q in enumerate(queries):
                if pass_ == "cold":
                    api = api_once(client, q, mode, k)
                    timing = page_once(page, i, q, mode)
                    runs["api"].append(api)
                    runs["answered"].append(timing["request_ms"])
                    runs["render"].append(timing["render_ms"])
                    runs["gap"].append(timing["render_ms"] - api)
                    runs["cold"].append(timing.get("images_ms", timing["render_ms"]))
                else:
                    timing = page_once(page, i, q, mode)
                    runs["warm_render"].append(timing["render_ms"])
                    runs["warm"].append(timing.get("images_ms", timing["render_ms"]))
            context.close()
    return {
        "api_ms": summary(runs["api"]),
        "page_answered_ms": summary(runs["answered"]),  # fetch sent -> JSON parsed, in the page
        "page_render_ms": summary(runs["render"] + runs["warm_render"]),
        "page_minus_api_ms": summary(runs["gap"]),  # per query, the same query back to back
        "page_images_cold_ms": summary(runs["cold"]),
        "page_images_warm_ms": summary(runs["warm"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, default=DATA / "images")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=None, help="prune each picture to its N strongest words at ingest")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", dest="json_out", help="also write the results here")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from d2s_search.backends.local import LocalBackend
    from d2s_search.bundle import Bundle
    from d2s_search.serve import create_app

    executable = chromium_path()
    if executable is None:
        sys.exit("needs Chromium: apt-get install chromium")
    bundle = bundle_path()
    index = index_path(bundle, args.images, args.top_k)
    thumbs = CACHE / "thumbnails"
    queries = caption_queries(args.queries)
    server = start_server(create_app(Bundle.load(bundle), LocalBackend(index), device="cpu", thumbnail_dir=thumbs))
    results: dict = {}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            for mode in args.modes.split(","):
                results[mode] = bench_mode(browser, server.url, queries, mode, args.k, thumbs)
                print(f"{mode:9s} {json.dumps(results[mode])}", file=sys.stderr)
            browser.close()
    finally:
        server.stop()
    probe = LocalBackend(index)
    probe.open(None, create=False)
    stats = probe.stats()
    probe.close()
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "pictures": stats["documents"],
        "mean_terms_per_picture": stats["mean_terms_per_document"],
        "queries": len(queries),
        "k": args.k,
        "top_k": args.top_k,
        "results": results,
    }
    print(markdown(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))


def markdown(report: dict) -> str:
    lines = [
        f"{report['pictures']} pictures, {report['mean_terms_per_picture']} words per picture on average; "
        f"{report['queries']} caption queries, k = {report['k']}; {report['machine']}",
        "",
        "| mode | API p50 (p90) | page: request → rendered p50 (p90) | page − API, same query, p50 "
        "| all thumbnails loaded, cold p50 | warm p50 |",
        "|---|---|---|---|---|---|",
    ]
    for mode, r in report["results"].items():
        cold, warm = r["page_images_cold_ms"], r["page_images_warm_ms"]
        lines.append(
            f"| {mode} | {r['api_ms']['p50']} ms ({r['api_ms']['p90']}) "
            f"| {r['page_render_ms']['p50']} ms ({r['page_render_ms']['p90']}) | {r['page_minus_api_ms']['p50']} ms "
            f"| {cold['p50']} ms | {warm['p50']} ms |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
