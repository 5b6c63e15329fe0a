"""The caption benchmark's validation and test splits as ``train`` calibrates on them: the
validation captions against their images plus 4,000 training images as distractors (R@1), the
validation images alone (FLOPs), and COCO dev as test. Shared by the issue-12 benchmarks that
choose a setting on validation and score it on test (``bench_query_threshold.py``,
``bench_query_shift.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class CalibrationData:
    splits: dict
    tokenizer: object
    val_tokens: object
    test_tokens: object
    distractors: object  # dense image vectors of training images
    pool: object  # the validation split with the distractors among its images

    @property
    def val(self):
        return self.splits["val"]

    @property
    def test(self):
        return self.splits["test"]


def load_calibration_data(data: Path, distractors: int = 4000) -> CalibrationData:
    from d2s_search.train.data import load_dataset
    from d2s_search.train.validation import pick_distractors, with_distractors
    from d2s_search.train.vocab import load_tokenizer, tokenize_captions

    splits = load_dataset(data)
    tok = load_tokenizer()
    picked = pick_distractors(splits["train"].image_emb, splits["train"].caption_image, distractors)
    return CalibrationData(splits, tok, tokenize_captions(splits["val"].captions, tok),
                           tokenize_captions(splits["test"].captions, tok), picked, with_distractors(splits["val"], picked))
