"""``d2s-search align``: train the offline model's projections, and ``align ship`` to put a
trained run into the built-in ``offline-mini`` model.

Heavy imports (torch, the backbones) happen inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from d2s_search.errors import EXIT_OK


def _emit(payload: dict) -> None:
    click.echo(json.dumps(payload, indent=2, default=str))


@click.group(invoke_without_command=True)
@click.option("--data", type=click.Path(file_okay=False),
              help="Captioned photos (required): a folder with captions.txt (image,caption) and images/, "
              "e.g. a Flickr8k subset.")
@click.option("--out", type=click.Path(file_okay=False), default="./d2s-align/run", show_default=True,
              help="Run directory: projections.safetensors, align.json, embeddings/ (input of `d2s-search train`).")
@click.option("--cache", type=click.Path(file_okay=False), default="./d2s-align/cache", show_default=True,
              help="Cached frozen features (computed once, reused by every run).")
@click.option("--model", default="offline-mini", show_default=True, help="Model config whose towers are aligned.")
@click.option("--test-photos", type=click.IntRange(1), default=200, show_default=True, help="Held-out photos (never trained on or selected by).")
@click.option("--val-photos", type=click.IntRange(1), default=100, show_default=True, help="Photos for model selection.")
@click.option("--split-seed", type=int, default=0, show_default=True, help="Seed of the test/val/train photo split.")
@click.option("--augment/--no-augment", default=True, show_default=True, help="Train on 4 views per photo (center crop, whole photo, and their mirror images).")
@click.option("--clipart", type=click.IntRange(0), default=0, show_default=True, help="Also train on N drawings of Debian's openclipart-png (0 = none).")
@click.option("--clipart-categories", default="", help="Comma-separated openclipart top-level folders to use (e.g. animals,people); default all.")
@click.option("--clipart-root", type=click.Path(file_okay=False), help="openclipart PNG folder (default /usr/share/openclipart/png).")
@click.option("--solver", type=click.Choice(["ridge", "infonce"]), default="ridge", show_default=True,
              help="ridge: closed-form linear map from image features to the mean of each photo's caption vectors, lambda chosen on the val photos (held-out dense R@1 0.248 vs 0.211, docs/design-decisions.md); infonce: projections trained with InfoNCE (the options below).")
@click.option("--bridge/--no-bridge", default=True, show_default=True, help="infonce: ImageNet class-name bridge in the image projection.")
@click.option("--dim", type=click.IntRange(8), default=384, show_default=True, help="Shared space width (384 = MiniLM's, keeps the text side near identity; ridge needs 384).")
@click.option("--epochs", type=click.IntRange(1), default=40, show_default=True, help="infonce: passes over the training photos.")
@click.option("--batch-size", type=click.IntRange(2), default=128, show_default=True,
              help="infonce: image-caption pairs per step (the negatives).")
@click.option("--lr", type=float, default=1e-3, show_default=True, help="infonce: image projection and temperature.")
@click.option("--text-lr", type=float, default=1e-4, show_default=True, help="infonce: text projection (identity-initialised).")
@click.option("--weight-decay", type=float, default=0.05, show_default=True, help="infonce: AdamW weight decay.")
@click.option("--seed", type=int, default=0, show_default=True, help="infonce: seed of initialisation and batch order.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def align(ctx, data, out, cache, model, test_photos, val_photos, split_seed, augment, clipart, clipart_categories, clipart_root, solver, bridge,
          dim, epochs, batch_size, lr, text_lr, weight_decay, seed, as_json) -> int:
    """Align EfficientNet-Lite0 and MiniLM on captioned photos (frozen towers; ridge or InfoNCE).

    \b
    d2s-search align --data flickr8k-800 --out runs/align  # 500/100/200 photos
    d2s-search align vocab --out runs/w2_words.npy
    d2s-search train --data runs/align/embeddings --freeze-vocab --vocab-init runs/w2_words.npy ...
    d2s-search align ship --run runs/align --head runs/head-cw/head.pt

    See docs/offline-model.md for the full recipe.
    """
    if ctx.invoked_subcommand is not None:
        return EXIT_OK
    if not data:
        raise click.UsageError("--data is required: a folder with captions.txt (image,caption) and images/")
    from d2s_onnx_export.offline_mini.align import AlignConfig
    from d2s_onnx_export.offline_mini.align_data import VIEWS
    from d2s_onnx_export.offline_mini.align_run import AlignSources, run_alignment
    from d2s_onnx_export.registry import load_config
    from rich.console import Console
    from rich.progress import Progress

    sources = AlignSources(Path(data), test_photos, val_photos, split_seed, VIEWS if augment else ("center",),
                           clipart, Path(clipart_root) if clipart_root else None,
                           tuple(c.strip() for c in clipart_categories.split(",") if c.strip()))
    config = AlignConfig(dim=dim, bridge=bridge and solver == "infonce", epochs=epochs, batch_size=batch_size, lr=lr,
                         text_lr=text_lr, weight_decay=weight_decay, seed=seed, solver=solver)
    console = Console(stderr=True, highlight=False, log_path=False)  # no source file:line on log lines

    def log(e: dict) -> None:
        if not as_json and (e["epoch"] % 10 == 0 or e["epoch"] == 1):
            v = e["val"]
            console.log(f"epoch {e['epoch']}: loss {e['loss']:.3f} T {e['temperature']:.3f} "
                        f"val R@1/5/10 {v['R@1']:.3f}/{v['R@5']:.3f}/{v['R@10']:.3f}")

    with Progress(console=console, transient=True, disable=as_json) as progress:
        summary = run_alignment(load_config(model), sources, config, Path(out), Path(cache), progress, log)
    if as_json:
        _emit({k: v for k, v in summary.items() if k not in ("history", "splits")})
    else:
        t, v = summary["test"], summary["best_val"]
        chosen = f"ridge lambda {summary['lambda']:g}" if solver == "ridge" else f"best epoch {summary['best_epoch']}"
        click.echo(f"{chosen}: val R@1 {v['R@1']:.3f}; held-out test "
                   f"R@1/5/10 {t['R@1']:.3f}/{t['R@5']:.3f}/{t['R@10']:.3f}, MRR@10 {t['MRR@10']:.3f}")
        click.echo(f"wrote {summary['files']['projections']} and {summary['files']['embeddings']}")
        if summary.get("lambda_at_grid_edge"):
            click.echo(f"note: ridge lambda {summary['lambda']:g} is at the edge of the grid searched "
                       "(too few validation photos to tell the settings apart?)", err=True)
    return EXIT_OK


@align.command("vocab")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Matrix file (.npy) for `d2s-search train --vocab-init`.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def vocab(out, as_json) -> int:
    """Write MiniLM's word-embedding matrix with every row but whole, non-stop words zeroed:
    a head trained on it with --freeze-vocab outputs only such words (`output_terms: words`)."""
    import numpy as np
    from d2s_onnx_export.offline_mini.parts import word_terms_mask
    from d2s_onnx_export.tokenizers_offline import bert_base_uncased_tokenizer

    from d2s_search.train.modeling import minilm_word_embeddings

    w2 = minilm_word_embeddings()
    keep = word_terms_mask(bert_base_uncased_tokenizer()[0], w2.shape[0])
    w2[~keep] = 0.0
    np.save(out, w2.numpy())
    if as_json:
        _emit({"out": str(out), "terms_kept": int(keep.sum()), "terms": len(keep)})
    else:
        click.echo(f"wrote {out}: {int(keep.sum())} of {len(keep)} terms kept")
    return EXIT_OK


@align.command("ship")
@click.option("--run", "run_dir", type=click.Path(file_okay=False, exists=True), required=True, help="An `align` run directory.")
@click.option("--head", "head_path", type=click.Path(dir_okay=False, exists=True), required=True,
              help="head.pt from `d2s-search train --data <run>/embeddings --freeze-vocab`.")
@click.option("--model", default="offline-mini", show_default=True, help="Built-in model whose weights are replaced.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def ship(run_dir, head_path, model, as_json) -> int:
    """Store a run's projections and a head's small layers as the model's shipped weights
    and record their SHA-256 in its config (W2 stays MiniLM's word embeddings)."""
    from d2s_onnx_export.offline_mini.ship import ship_weights

    result = ship_weights(model, Path(run_dir), Path(head_path))
    if as_json:
        _emit(result)
    else:
        for name, entry in result["weights"].items():
            click.echo(f"{name}: {entry['bytes']} bytes, sha256 {entry['sha256']}")
    return EXIT_OK

