import json

import numpy as np
import pytest
import torch
from d2s_onnx_export.head import load_head, save_head

from d2s_search.train.convert import convert_authors_head, export_head_onnx
from d2s_search.train.data import DatasetError, load_dataset, read_embeddings, write_embeddings
from d2s_search.train.vocab import (
    CaptionTokens,
    document_frequency,
    load_tokenizer,
    tokenize_captions,
)


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_embeddings_roundtrip_and_authors_layout(tmp_path, fmt):
    rng = np.random.default_rng(0)
    img = rng.standard_normal((3, 4)).astype(np.float32)
    txt = rng.standard_normal((6, 4)).astype(np.float32)
    write_embeddings(tmp_path, "img", ["10", "11", "12"], img, fmt)
    write_embeddings(tmp_path, "text", [str(i) for i in range(6)], txt, fmt)
    ids, back = read_embeddings(tmp_path, "img")
    assert ids == ["10", "11", "12"] and np.array_equal(back, img)
    meta = {"images": [
        {"imgid": 10, "split": "train", "sentences": [{"sentid": 0, "raw": "a dog"}, {"sentid": 1, "raw": "dog"}]},
        {"imgid": 11, "split": "val", "sentences": [{"sentid": 2, "raw": "a cat"}, {"sentid": 3, "raw": "cat"}]},
        {"imgid": 12, "split": "test", "sentences": [{"sentid": 4, "raw": "a car"}, {"sentid": 5, "raw": "car"}]},
    ]}
    (tmp_path / "dataset_meta.json").write_text(json.dumps(meta))
    splits = load_dataset(tmp_path)
    assert set(splits) == {"train", "val", "test"}
    v = splits["val"]
    assert v.captions == ["a cat", "cat"] and v.image_ids == ["11"]
    assert np.array_equal(v.text_emb, txt[2:4]) and np.array_equal(v.image_emb, img[1:2])
    assert [q.tolist() for q in v.qrels()] == [[0], [0]]


def test_paired_rows_layout_and_errors(tmp_path):
    n = 20
    rng = np.random.default_rng(0)
    img = np.repeat(rng.standard_normal((4, 3)), 5, axis=0).astype(np.float32)
    np.save(tmp_path / "image_embeddings.npy", img)
    np.save(tmp_path / "text_embeddings.npy", rng.standard_normal((n, 3)).astype(np.float32))
    rows = ["image_id,image_path,caption"] + [f"im{i // 5},x.jpg,caption {i}" for i in range(n)]
    (tmp_path / "metadata.csv").write_text("\n".join(rows))
    splits = load_dataset(tmp_path, val_fraction=0.25)
    assert len(splits["val"].image_ids) == 1 and len(splits["train"].image_ids) == 3
    for s in splits.values():
        for c, i in enumerate(s.caption_image):
            assert s.image_ids[i] == f"im{int(s.caption_ids[c]) // 5}"
    with pytest.raises(DatasetError):
        load_dataset(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError):
        load_dataset(tmp_path / "empty")


def test_tokens_and_df_with_the_real_tokenizer():
    tok = load_tokenizer()
    ct = tokenize_captions(["A dog runs.", "a dog", "Cats!"], tok)
    vocab = tok.get_vocab()
    assert set(ct.row(1).tolist()) == {vocab["a"], vocab["dog"]}  # no [CLS]/[SEP]
    df = document_frequency(ct)
    assert df[vocab["dog"]] == pytest.approx(2 / 3) and df[vocab["[CLS]"]] == 0
    sub = ct.subset([2, 0])
    assert sub.row(1).tolist() == ct.row(0).tolist()
    assert isinstance(CaptionTokens.from_lists([[3, 3, 1]], 5).row(0), np.ndarray)


def _authors_state(d=6, w=8, v=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "proj.weight": torch.randn(w, d, generator=g), "proj.bias": torch.randn(w, generator=g),
        "vocab_layer_norm.weight": torch.rand(w, generator=g) + 0.5, "vocab_layer_norm.bias": torch.randn(w, generator=g),
        "vocab_projector.weight": torch.randn(v, w, generator=g), "vocab_projector.bias": torch.randn(v, generator=g),
    }


def _authors_forward(st, z):
    h = z @ st["proj.weight"].T + st["proj.bias"]
    h = torch.nn.functional.layer_norm(h, (h.shape[1],), st["vocab_layer_norm.weight"], st["vocab_layer_norm.bias"], 1e-12)
    return torch.log1p(torch.relu(h @ st["vocab_projector.weight"].T + st["vocab_projector.bias"]))


def test_convert_authors_checkpoint_pt_and_safetensors(tmp_path):
    from safetensors.torch import save_file

    st = _authors_state()
    torch.save(st, tmp_path / "model.pt")
    hub = tmp_path / "hub"
    hub.mkdir()
    save_file(st, hub / "model.safetensors")
    (hub / "config.json").write_text(json.dumps({"model_type": "d2s", "dense_size": 6}))
    z = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    want = _authors_forward(st, z)
    for src in (tmp_path / "model.pt", hub):
        head = convert_authors_head(src, excluded_ids=[0, 3])
        got = head(z)
        assert torch.allclose(got[:, [1, 2] + list(range(4, 20))], want[:, [1, 2] + list(range(4, 20))], atol=1e-5)
        assert (got[:, [0, 3]] == 0).all()
        path = save_head(head, tmp_path / "conv.pt")
        assert torch.allclose(load_head(path)(z), got)
    (hub / "config.json").write_text(json.dumps({"dense_size": 256}))
    from d2s_search.errors import ModelError

    with pytest.raises(ModelError):
        convert_authors_head(hub, [])
    bad = {k: v for k, v in st.items() if k != "proj.weight"}
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ModelError):
        convert_authors_head(tmp_path / "bad.pt", [])


def test_head_onnx_export_matches_torch(tmp_path):
    import onnxruntime as ort

    head = convert_authors_head(_write(tmp_path), excluded_ids=[0])
    head.config.notes["query_mask"] = "own_tokens"
    p = export_head_onnx(head, tmp_path / "head.onnx")
    sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    z = np.random.default_rng(0).standard_normal((7, 6)).astype(np.float32)
    out = sess.run(["sparse"], {"dense": z})[0]
    np.testing.assert_allclose(out, head(torch.from_numpy(z)).detach().numpy(), atol=1e-5)
    assert sess.get_modelmeta().custom_metadata_map["query_mask"] == "own_tokens"


def _write(tmp_path):
    torch.save(_authors_state(), tmp_path / "m.pt")
    return tmp_path / "m.pt"
