"""Encoder throughput (torch against ONNX Runtime, same inputs, same run) and ingest end to end.

    python benchmarks/bench_encoders.py [--model offline-mini] [--batch 8] [--ingest 200] [--json OUT]
    python benchmarks/bench_encoders.py --model blip-base-random --ingest 0   # BLIP ViT-B/16 at full size

Exports the model's bundle once (cached under benchmarks/.cache/; random weights are fine for
``blip-base-random``: speed does not depend on them), then times image encoding (images/s at
``--batch``) and text encoding (queries/s at batch 1 = a query's latency, and at batch 32)
through the torch graph and the runtime ``Encoder`` (ONNX Runtime) with the same threads. With
``--ingest N``: ``d2s-search ingest`` of N flickr8k-800 photos into a fresh local index (decoding,
encoding, writing, the search structures), images/s end to end against the encoder's own rate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common
import numpy as np

_common.use_repository()


def rate(fn, items: int, repeat: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return items * repeat / (time.perf_counter() - t0)


def ingest_rate(bundle: Path, photos: list[Path]) -> dict:
    """``d2s-search ingest`` of ``photos`` (copied into a scratch folder) into a fresh index."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "photos"
        folder.mkdir()
        for p in photos:
            shutil.copy(p, folder / p.name)
        env = dict(os.environ, D2S_CONFIG_DIR=str(Path(tmp) / "config"), XDG_CACHE_HOME=str(Path(tmp) / "cache"))
        exe = Path(sys.executable).with_name("d2s-search")
        t0 = time.perf_counter()
        done = subprocess.run([str(exe), "ingest", str(folder), "--bundle", str(bundle), "--index", str(Path(tmp) / "index"),
                               "--json"], env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"ingest failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"photos": len(photos), "seconds": round(seconds, 2), "images_per_s": round(len(photos) / seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="offline-mini")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--ingest", type=int, default=200, help="photos ingested end to end (0: skip)")
    parser.add_argument("--cache", default=str(_common.CACHE))
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    summary = _common.provenance(threads=f"{args.threads} threads per engine, CPU only")

    import torch
    from tokenizers import Tokenizer

    torch.set_num_threads(args.threads)
    from d2s_onnx_export.export import ImageGraph, TextGraph, build_head, export_bundle
    from d2s_onnx_export.models import build_dense_encoder

    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder, tokenize_batch

    bundle_dir = Path(args.cache) / f"bundle-{args.model}"
    t0 = time.perf_counter()
    if not (bundle_dir / "manifest.json").is_file():
        export_bundle(args.model, bundle_dir, overwrite=True)
    export_s = time.perf_counter() - t0
    bundle = Bundle.load(bundle_dir)
    dense_model = build_dense_encoder(args.model)
    head = build_head(dense_model, None)
    image_graph = ImageGraph(dense_model.image_tower, head).eval()
    text_graph = TextGraph(dense_model.text_tower, head).eval()
    tokenizer = Tokenizer.from_file(str(bundle.path / "tokenizer.json"))

    size = int(bundle.image_settings["size"])
    pixels = np.random.default_rng(0).standard_normal((args.batch, 3, size, size)).astype(np.float32)
    queries = ["dogs in a car", "a man riding a wave on top of a surfboard", "two children playing in the snow"]
    texts32 = (queries * 11)[:32]

    # torch first, ONNX Runtime after: ORT's worker threads spin after each run and would
    # slow torch's if the two were interleaved on two cores.
    ids1, mask1 = tokenize_batch(tokenizer, queries[:1], bundle.max_text_length)
    ids32, mask32 = tokenize_batch(tokenizer, texts32, bundle.max_text_length)
    with torch.inference_mode():
        px = torch.from_numpy(pixels)
        t_ids1, t_mask1 = torch.from_numpy(ids1), torch.from_numpy(mask1)
        t_ids32, t_mask32 = torch.from_numpy(ids32), torch.from_numpy(mask32)
        torch_rates = [rate(lambda: image_graph(px), args.batch, args.repeat),
                       rate(lambda: text_graph(t_ids1, t_mask1), 1, 20),
                       rate(lambda: text_graph(t_ids32, t_mask32), 32, args.repeat)]
    encoder = Encoder(bundle, device="cpu", threads=args.threads)
    ort_rates = [rate(lambda: encoder.encode_pixels(pixels), args.batch, args.repeat),
                 rate(lambda: encoder.encode_texts(queries[:1]), 1, 20),
                 rate(lambda: encoder.encode_texts(texts32), 32, args.repeat)]
    results = dict(zip(("images/s", "queries/s, batch 1", "queries/s, batch 32"), zip(torch_rates, ort_rates)))
    summary.update({
        "model": args.model,
        "image_size": size,
        "export_seconds": round(export_s, 1),
        "bundle_mb": round(sum(f.stat().st_size for f in bundle_dir.iterdir() if f.is_file()) / 2**20),
        "results": {k: {"torch": round(t, 2), "onnxruntime": round(o, 2)} for k, (t, o) in results.items()},
    })
    if args.ingest:
        photos = sorted((_common.DATA / "flickr8k-800" / "images").glob("*.jpg"))[: args.ingest]
        if photos:
            summary["ingest"] = ingest_rate(bundle_dir, photos)
        else:
            print(f"no photos under {_common.DATA / 'flickr8k-800'}: ingest not measured", file=sys.stderr)
    _common.write_json(_common.finish(summary), args.json_out)


def render(summary: dict) -> str:
    rows = []
    for what, r in summary["results"].items():
        rows.append([what, f"{r['torch']:.2f}", f"{r['onnxruntime']:.2f}", _common.ratio(r["onnxruntime"], r["torch"])])
    out = [_common.table(["encoder", "torch", "ONNX Runtime", "ONNX Runtime / torch"], rows)]
    lines = [f"Model `{summary['model']}` ({summary['image_size']} px images; bundle {summary['bundle_mb']} MB). "
             f"A query's encoding takes {1000 / summary['results']['queries/s, batch 1']['onnxruntime']:.1f} ms."]
    ingest = summary.get("ingest")
    if ingest:
        encode = summary["results"]["images/s"]["onnxruntime"]
        lines.append(f"`d2s-search ingest` of {ingest['photos']} photos into a new index: {ingest['seconds']} s, "
                     f"**{ingest['images_per_s']} images/s** end to end ({ingest['images_per_s'] / encode:.2f}x the "
                     f"image encoder's own rate: decoding, writing and the search structures are the rest).")
    out.append(" ".join(lines))
    out.append(_common.caption(summary))
    return "\n\n".join(out)


if __name__ == "__main__":
    main()
