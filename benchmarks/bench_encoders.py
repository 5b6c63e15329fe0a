"""Encoder throughput at base size: torch vs ONNX Runtime on CPU, same run.

    python benchmarks/bench_encoders.py [--model blip-base-random] [--images 16] [--batch 8]

Builds the model (random weights are fine: speed does not depend on them), exports the
bundle once (cached under benchmarks/.cache/), then times image encoding (images/s, batch
``--batch``) and text encoding (queries/s at batch 1, i.e. query latency, and batch 32)
through the torch graph and the runtime Encoder (ONNX Runtime), with the same thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rate(fn, items: int, repeat: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return items * repeat / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="blip-base-random")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--cache", default=str(Path(__file__).parent / ".cache"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder, tokenize_batch
    from onnx_export.export import ImageGraph, TextGraph, build_head, export_bundle
    from onnx_export.models import build_dense_encoder

    bundle_dir = Path(args.cache) / f"bundle-{args.model}"
    t0 = time.perf_counter()
    if not (bundle_dir / "manifest.json").is_file():
        export_bundle(args.model, bundle_dir, overwrite=True)
    export_s = time.perf_counter() - t0
    bundle = Bundle.load(bundle_dir)
    encoder = Encoder(bundle, device="cpu", threads=args.threads)
    dense_model = build_dense_encoder(args.model)
    head = build_head(dense_model, None)
    image_graph = ImageGraph(dense_model.image_tower, head).eval()
    text_graph = TextGraph(dense_model.text_tower, head).eval()

    size = int(bundle.image_settings["size"])
    pixels = np.random.default_rng(0).standard_normal((args.batch, 3, size, size)).astype(np.float32)
    queries = ["dogs in a car", "a man riding a wave on top of a surfboard", "two children playing in the snow"]
    texts32 = (queries * 11)[:32]
    ids1, mask1 = tokenize_batch(encoder.tokenizer, queries[:1], bundle.max_text_length)
    ids32, mask32 = tokenize_batch(encoder.tokenizer, texts32, bundle.max_text_length)

    with torch.inference_mode():
        px = torch.from_numpy(pixels)
        t_ids1, t_mask1 = torch.from_numpy(ids1), torch.from_numpy(mask1)
        t_ids32, t_mask32 = torch.from_numpy(ids32), torch.from_numpy(mask32)
        results = {
            "torch images/s": rate(lambda: image_graph(px), args.batch, args.repeat),
            "onnxruntime images/s": rate(lambda: encoder.encode_pixels(pixels), args.batch, args.repeat),
            "torch queries/s (batch 1)": rate(lambda: text_graph(t_ids1, t_mask1), 1, 20),
            "onnxruntime queries/s (batch 1)": rate(lambda: encoder.encode_texts(queries[:1]), 1, 20),
            "torch queries/s (batch 32)": rate(lambda: text_graph(t_ids32, t_mask32), 32, args.repeat),
            "onnxruntime queries/s (batch 32)": rate(lambda: encoder.encode_texts(texts32), 32, args.repeat),
        }
    summary = {
        "command": "python benchmarks/bench_encoders.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} threads, CPU only",
        "model": args.model,
        "image_size": size,
        "export_seconds": round(export_s, 1),
        "bundle_bytes": sum(f.stat().st_size for f in bundle_dir.iterdir()),
        "results": {k: round(v, 2) for k, v in results.items()},
        "onnxruntime_vs_torch": {
            "images": round(results["onnxruntime images/s"] / results["torch images/s"], 2),
            "queries batch 1": round(results["onnxruntime queries/s (batch 1)"] / results["torch queries/s (batch 1)"], 2),
            "queries batch 32": round(results["onnxruntime queries/s (batch 32)"] / results["torch queries/s (batch 32)"], 2),
        },
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
