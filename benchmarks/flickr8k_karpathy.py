"""Write flickr8k-800 as a Karpathy JSON with the offline model's photo split.

The split is the one `d2s-search align` uses (``split_photos``, seed 0: 200 test, 100 val,
500 train photos), so `embed` + `train` + `evaluate` on this file measure on the same 200
held-out photos as the offline model's numbers in docs/benchmarks.md.

    python benchmarks/flickr8k_karpathy.py ../shared/data/flickr8k-800 runs/flickr8k-800.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from d2s_onnx_export.offline_mini.align_data import flickr_photos, split_photos  # noqa: E402


def main(src: str, out: str) -> None:
    splits = split_photos(flickr_photos(src))
    images, sent = [], 0
    for split, items in splits.items():
        for it in items:
            sents = [{"sentid": sent + j, "raw": c} for j, c in enumerate(it.captions)]
            sent += len(sents)
            images.append({"imgid": it.image_id, "filename": it.path.name, "filepath": str(it.path.parent),
                           "split": split, "sentences": sents})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"images": images}))
    print(f"wrote {out}: " + ", ".join(f"{k} {len(v)} photos" for k, v in splits.items()))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
