"""``d2s-search train`` (+ ``convert-head``, ``export-head``, ``extract-head``), ``evaluate`` and ``embed``.

Commands return exit codes (0 ok, 1 failed, 3 partial) and raise :class:`D2SError`
subclasses for one-line errors; heavy imports (torch) happen inside the commands.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import click

from d2s_search.cli.options import ray_engine_options
from d2s_search.errors import EXIT_OK, EXIT_PARTIAL

# An image's terms past its strongest 150 are the document shift's faint tail; with the FLOPs
# they free spent on a query shift, the caption benchmark's 5,000 documents kept 0.849 of dense
# against 0.844 with 359 terms an image (docs/design-decisions.md, "At most 150 words per picture").
DOCUMENT_TERMS = 150


def _emit_json(payload: dict) -> None:
    click.echo(json.dumps(payload, indent=2, ensure_ascii=False, default=_json_default))


def _json_default(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


def _clean(x):
    """NaN -> None so --json output is valid JSON."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _console(stderr: bool = True):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, log_path=False)  # no source file:line on log lines


def _bias_value(v: str | None) -> float | None:
    if v is None or str(v).lower() == "none":
        return None
    try:
        return float(v)
    except ValueError:
        raise click.BadParameter(f"{v!r} is not a number or 'none'") from None


def _tokenizer_option(f):
    return click.option(
        "--tokenizer", type=click.Path(exists=True),
        help="tokenizer.json or a bundle directory (default: bert-base-uncased from the offline MiniLM package).",
    )(f)


# ----------------------------------------------------------------------------- train


@click.group(invoke_without_command=True)
@click.option("--data", type=click.Path(file_okay=False), help="Precomputed embeddings (img_embs/text_embs + dataset_meta.json, or image_embeddings.npy + text_embeddings.npy + metadata.csv).")
@click.option("--out", type=click.Path(file_okay=False), default="./d2s-heads/run", show_default=True, help="Run directory: head.pt (best), last.pt, history.json.")
@click.option("--expansion", type=click.Choice(["0", "1", "c", "c+w"]), default=None, help="PEC mode: 0 never expand captions, 1 always, c caption level, c+w caption + word level.  [default: c+w; joint: 1]")
@click.option("--eta", type=float, default=3e-4, show_default=True, help="Sparsity weight: ~3e-4-0.1 for the FLOPS regulariser (default), 1e-5 .. 1e-2 for L1 (the paper).")
@click.option("--lambda", "lam", type=click.FloatRange(0, 1), default=0.5, show_default=True, help="Mix of distillation (1-lambda) and L1 (lambda); 0.5 = the authors' loss / 2.")
@click.option("--tau", type=float, default=1e-3, show_default=True, help="Teacher temperature on dense scores.")
@click.option("--epochs", type=click.IntRange(1), default=None,
              help="Passes over the training captions [default: 30 below 50,000 training captions (the measured recipe), else 200 (the paper's); joint: 20].")
@click.option("--batch-size", type=click.IntRange(2), default=None,
              help="Captions per step, the other images of the batch are the negatives [default: 128 below 50,000 training captions, else 512; joint: 256].")
@click.option("--lr-proj", type=float, default=3e-3, show_default=True, help="Learning rate of W1 (the paper: 1e-3).")
@click.option("--lr-vocab", type=float, default=2e-3, show_default=True, help="Learning rate of LayerNorm, W2 and the per-term bias (the paper: 5e-5 over 200 epochs).")
@click.option("--warmup", type=click.FloatRange(0, 1), default=0.2, show_default=True, help="Share of steps for lr warm-up and the L1 ramp.")
@click.option("--schedule", type=click.Choice(["paper", "authors", "reverse"]), default="paper", show_default=True, help="PEC ramp shape.")
@click.option("--vocab-init", default="minilm", show_default=True, help="W2 init: minilm | distilbert | random | matrix file.")
@click.option("--freeze-vocab", is_flag=True, help="Keep W2 as initialised (e.g. MiniLM's embeddings, rebuilt at export instead of shipped); LayerNorm still trains at --lr-vocab.")
@click.option("--regularizer", type=click.Choice(["l1", "flops"]), default="flops", show_default=True, help="Sparsity term: l1 (the paper) or flops (SPLADE: squared mean activation per term in the batch; penalises terms that fire everywhere).")
@click.option("--bias-init", default="-6", show_default=True, callback=lambda ctx, param, v: _bias_value(v), help="Learned per-term output bias, starting at this value (negative: the head starts sparse; -6 suits --proj-init words); 'none': no bias (the paper's head).")
@click.option("--lr-bias", type=float, default=None, help="Learning rate of the per-term bias (default: --lr-vocab).")
@click.option("--norm-gain", type=float, default=None, help="Initial LayerNorm gain (scales every vocabulary logit, like a scaled W2).")
@click.option("--output-terms", type=click.Choice(["all", "words"]), default="words", show_default=True, help="words: only whole, non-stop words can be output terms (no punctuation, word pieces, stop words).")
@click.option("--proj-init", type=click.Choice(["default", "words"]), default="words", show_default=True, help="words: fit W1 by ridge regression so the untrained head already names each caption's own words.")
@click.option("--gate-own-words", is_flag=True, help="Algorithm 1 read literally: word-level gating E_v also masks the caption's own words.")
@click.option("--image-eta-scale", type=click.FloatRange(0), default=1.0, show_default=True,
              help="The images' sparsity weight relative to the captions' (SPLADE's lambda_d / lambda_q); below 1 "
                   "images keep more terms than queries.")
@click.option("--mix", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Share of each batch's pairs replaced by a mix with another pair (caption with caption, image with "
                   "image): a label-free augmentation, the dense teacher scores the mixes. 0 = off.")
@click.option("--mix-most", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="The largest weight of the other pair in a mix (drawn uniformly up to it).")
@click.option("--flops-budget", type=click.FloatRange(0), default=12.0, show_default=True,
              help="Let images keep more words than queries (a document shift): each epoch is scored by its best "
                   "validation R@1 among the shifts whose validation FLOPs stay within this budget; the latest "
                   "epoch within the noise of the best is kept, with its shift. 0 = none (epochs by R@1 of the "
                   "head alone).")
# The boost is set, not chosen on validation: in-domain validation captions cannot see it (every
# boost within +-0.01 R@1 of the others, the noise of 800 queries, on three heads), while on the
# COCO test captions it added 0.01-0.03 R@1 and lifted Exact@20 from 0.18 to 0.28 on every head
# measured (docs/design-decisions.md, "The query word boost").
@click.option("--query-word-boost", type=click.FloatRange(0, 100), default=2.0, show_default=True,
              help="Added to a query's own words before the ReLU, so what the user typed is always searched; saved "
                   "in the head (set, not chosen on validation: docs/training.md). 0 = none.")
@click.option("--document-terms", type=click.IntRange(0, 1_000_000), default=DOCUMENT_TERMS, show_default=True,
              help="An image keeps at most this many terms, its strongest (saved in the head; the epochs and the "
                   "document shift are chosen with it). 0 = every term the head and its shift give.")
@click.option("--max-image-share", type=click.FloatRange(0, 1), default=0.4, show_default=True,
              help="After training, hold back a term that is on more than this share of the training images unless "
                   "their captions use it as often (a per-term floor saved in the head). 0 = none.")
@click.option("--calibration-distractors", type=click.IntRange(0), default=4000, show_default=True,
              help="Score the epochs and choose the document shift by validation R@1 against the validation images "
                   "plus up to this many training images: a few hundred validation images alone saturate R@1 "
                   "(docs/training.md). 0 = none.")
@click.option("--val-images", type=click.IntRange(0), default=1000, show_default=True, help="Validate on the first N val images (0 = all).")
@click.option("--select-during-warmup", is_flag=True, help="Let epochs that end inside the warm-up (L1 not yet at full weight) be chosen as best.")
@click.option("--select-tolerance", type=float, default=-1.0, show_default=True,
              help="Keep the latest epoch whose validation score is within this much of the best: -1 = one "
                   "standard error of that R@1, 0 = the best epoch strictly (the paper). Sparse objective.")
@click.option("--objective", type=click.Choice(["sparse", "joint"]), default="sparse", show_default=True,
              help="joint: also fine-tune the dense projections (needs img_feats/text_feats + projections.safetensors in --data).")
@click.option("--joint-lr", type=float, default=5e-5, show_default=True, help="joint: learning rate of all parameters (AdamW, weight decay 0.05, gradient norm clipped to 1.0: the public code's).")
@click.option("--joint-eta-text", type=float, default=5e-4, show_default=True, help="joint: L1 weight on captions (q_reg).")
@click.option("--joint-eta-image", type=float, default=3e-5, show_default=True, help="joint: L1 weight on images (d_reg).")
@click.option("--joint-w1", type=float, default=0.1, show_default=True, help="joint: weight of the dense scores in the fused teacher scores.")
@click.option("--joint-w2", type=float, default=0.1, show_default=True, help="joint: weight of the sparse scores in the fused teacher scores.")
@click.option("--joint-lambda1", type=float, default=0.9, show_default=True, help="joint: weight of InfoNCE on dense scores.")
@click.option("--joint-lambda2", type=float, default=0.3, show_default=True, help="joint: weight of InfoNCE on sparse scores.")
@click.option("--joint-lambda3", type=float, default=1.0, show_default=True, help="joint: weight of InfoNCE on the fused scores.")
@click.option("--joint-tau", type=click.FloatRange(1e-3, 0.5), default=0.07, show_default=True, help="joint: initial learnable temperature of the dense scores.")
@click.option("--joint-max-flops", type=click.FloatRange(0), default=0.0, show_default=True, help="joint: only epochs whose validation FLOPs stay within this budget can be chosen as best (0 = any).")
@click.option("--joint-init-head", type=click.Path(exists=True, dir_okay=False), help="joint: start from this head (e.g. a trained D2S head.pt) instead of a fresh one.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed (initialisation, batches, expansion draws).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="torch device (auto: CUDA when available).")
@click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads for torch (on a busy machine 1 can be much faster).")
@click.option("--amp/--no-amp", default=True, show_default=True, help="Mixed precision (used only on CUDA; the joint objective runs in fp32).")
@click.option("--resume", is_flag=True, help="Continue from <out>/last.pt, refusing other settings (the default "
              "when <out> holds an unfinished run of the same settings: the same command continues it).")
@click.option("--force", is_flag=True, help="Start over even when <out> holds a run (finished or not): its "
              "head.pt, last.pt and history.json are replaced.")
@click.option("--export-onnx-head", is_flag=True, help="Also write <out>/head.onnx (dense -> sparse) for torch-free evaluation.")
@_tokenizer_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def train(ctx, data, out, expansion, eta, lam, tau, epochs, batch_size, lr_proj, lr_vocab, warmup, schedule,
          vocab_init, freeze_vocab, regularizer, bias_init, lr_bias, norm_gain, output_terms, proj_init, gate_own_words,
          image_eta_scale, mix, mix_most, flops_budget, query_word_boost, document_terms, max_image_share, calibration_distractors, val_images, select_during_warmup, select_tolerance, objective, joint_lr, joint_eta_text, joint_eta_image,
          joint_w1, joint_w2, joint_lambda1, joint_lambda2, joint_lambda3, joint_tau, joint_max_flops, joint_init_head, seed, device, threads,
          amp, resume, force, export_onnx_head, tokenizer, as_json) -> int:
    """Train a D2S sparse head on precomputed dense embeddings (docs/training.md).

    \b
    d2s-search train --data ./embs --expansion c+w --eta 1e-3 --out ./d2s-heads/coco
    d2s-search train --data ./embs-with-features --objective joint --out ./d2s-heads/coco-joint
    d2s-search train convert-head ./lsr42-checkpoint --out head.pt
    """
    if ctx.invoked_subcommand is not None:
        return EXIT_OK
    if not data:
        raise click.UsageError("--data is required (or use a subcommand: convert-head, export-head, extract-head)")
    if resume and force:
        raise click.UsageError("--resume continues the run in --out, --force starts it over: give one")
    if threads:
        import torch

        torch.set_num_threads(threads)
    if objective == "joint":
        from d2s_search.train.joint import JointConfig

        if mix > 0:
            raise click.UsageError("--mix applies to the sparse objective; joint training does not mix pairs")

        cfg = JointConfig(
            lr=joint_lr, eta_text=joint_eta_text, eta_image=joint_eta_image, w1=joint_w1, w2=joint_w2,
            lambda1=joint_lambda1, lambda2=joint_lambda2, lambda3=joint_lambda3, tau=joint_tau,
            epochs=epochs or JointConfig.epochs, batch_size=batch_size or JointConfig.batch_size, warmup=warmup,
            expansion=expansion or JointConfig.expansion, schedule=schedule, seed=seed, val_images=val_images,
            select_after_warmup=not select_during_warmup, select_max_flops=joint_max_flops, device=device,
        )
        return _train_joint(data, out, cfg, vocab_init, joint_init_head, tokenizer, export_onnx_head, flops_budget,
                            query_word_boost, calibration_distractors, as_json, (document_terms, max_image_share))
    expansion = expansion or "c+w"
    from d2s_search.train.data import load_dataset
    from d2s_search.train.modeling import build_head
    from d2s_search.train.trainer import TrainConfig, TrainingError, default_schedule
    from d2s_search.train.trainer import train as run_train
    from d2s_search.train.vocab import excluded_token_ids, load_tokenizer, tokenize_captions

    splits = load_dataset(data)
    if "train" not in splits:
        raise TrainingError(f"{data} has no training split")
    if epochs is None or batch_size is None:
        n_captions = len(splits["train"].caption_ids)
        auto_epochs, auto_batch = default_schedule(n_captions)
        epochs, batch_size = epochs or auto_epochs, batch_size or auto_batch
        if not as_json:
            click.echo(f"{n_captions:,} training captions: {epochs} epochs of batch {batch_size} "
                       "(--epochs / --batch-size to change)", err=True)
    val = splits.get("val")
    cfg = TrainConfig(
        expansion=expansion, eta=eta, lam=lam, tau=tau, epochs=epochs, batch_size=batch_size,
        lr_proj=lr_proj, lr_vocab=lr_vocab, warmup=warmup, schedule=schedule, seed=seed,
        amp="auto" if amp else "off", device=device, val_images=val_images,
        select_after_warmup=not select_during_warmup, regularizer=regularizer, gate_own_words=gate_own_words,
        lr_bias=lr_bias, image_eta_scale=image_eta_scale, mix=mix, mix_most=mix_most,
        # epochs are scored by their best R@1 within the budget after the document shift, over the
        # validation plus training images: as the head will be used; the latest epoch within one
        # standard error of the best is kept (docs/training.md)
        select_flops_budget=flops_budget if val is not None else 0.0, select_boost=query_word_boost,
        select_document_terms=document_terms,
        val_distractors=calibration_distractors if flops_budget > 0 and val is not None else 0,
        select_tolerance=select_tolerance,
    )
    from d2s_search.train.trainer import resume_decision

    resume, continuing = resume_decision(out, cfg, resume, force)  # before any work: refusals come first
    if continuing and not as_json:
        click.echo(continuing, err=True)
    tok = load_tokenizer(tokenizer)
    train_tokens = tokenize_captions(splits["train"].captions, tok)
    val_tokens = tokenize_captions(val.captions, tok) if val is not None else None
    head = build_head(splits["train"].dim, vocab_init, excluded_token_ids(tok), tok.get_vocab_size(), seed=seed,
                      bias_init=bias_init, norm_gain=norm_gain, output_terms=output_terms, tokenizer=tok)
    if freeze_vocab:
        head.vocab.weight.requires_grad_(False)  # no gradient: AdamW leaves it untouched
    if proj_init == "words":
        from d2s_search.train.modeling import fit_projection_to_words

        fit_projection_to_words(head, splits["train"], train_tokens)
    if head.config.vocab_size != tok.get_vocab_size():
        raise TrainingError(f"--vocab-init has {head.config.vocab_size} rows, the tokenizer {tok.get_vocab_size()} terms")
    summary = run_train(head, splits["train"], train_tokens, cfg, out, val, val_tokens,
                        resume=resume, progress=not as_json)
    if flops_budget > 0 and val is not None:
        summary["document_shift"] = _choose_document_shift(head, val, val_tokens, cfg, flops_budget, query_word_boost,
                                                           Path(out), as_json, splits["train"], train_tokens,
                                                           calibration_distractors, (document_terms, max_image_share))
    else:
        _keep_boost(head, query_word_boost, Path(out), document_terms)
    if export_onnx_head:
        from d2s_search.train.convert import export_head_onnx

        summary["head_onnx"] = str(export_head_onnx(head, Path(out) / "head.onnx"))
    if as_json:
        _emit_json(_clean(summary))
    else:
        v, n_val = summary["best_val"], summary.get("validation_images", 0)
        best = (f" (val R@1 {v['R@1']:.4f} among the {n_val:,} validation images, FLOPs {v['FLOPs']:.1f}; "
                "the head alone)") if v else ""
        click.echo(f"kept head: {summary['head']} from epoch {summary['best_epoch']}{best}")
        chosen = summary.get("document_shift")
        if chosen:
            row = next(r for r in chosen["tried"]
                       if (r["shift"], r["boost"], r.get("query_shift", 0.0))
                       == (chosen["document_shift"], chosen["query_word_boost"], chosen["query_shift"]))
            if not row["within_budget"]:
                click.echo(f"no document shift: validation FLOPs {row['FLOPs']:.1f} are over "
                           f"--flops-budget {flops_budget:g} even without one")
            else:
                among = (f"the {n_val:,} validation and {chosen['distractors']:,} training images"
                         if chosen.get("distractors") else f"the {n_val:,} validation images")
                cap = f" (at most {head.config.document_terms})" if head.config.document_terms else ""
                floors = chosen.get("document_floors")
                held = f"; {floors} common terms held back by a floor" if floors else ""
                click.echo(f"document shift {chosen['document_shift']:g}, query shift {chosen['query_shift']:g}, "
                           f"query word boost {chosen['query_word_boost']:g}: images keep {row['terms_per_image']:.0f} terms{cap}{held}; "
                           f"val R@1 {row['R@1']:.4f} among {among} (as searched), FLOPs {row['FLOPs']:.1f} "
                           f"(budget {flops_budget:g})")
    return EXIT_OK


def _choose_document_shift(head, val, val_tokens, cfg, flops_budget: float, boost: float, out: Path,
                           as_json: bool, train_split, train_tokens, distractors: int,
                           documents: tuple[int, float]) -> dict:
    """After training (either objective: ``cfg`` is its config): the head calibrated as
    :func:`d2s_search.train.calibrate.calibrate_trained_head` does (``documents``: the images'
    most terms, the largest share of images a term may be on), saved into the best head."""
    from d2s_onnx_export.head import save_head

    from d2s_search.train.calibrate import calibrate_trained_head
    from d2s_search.train.trainer import validation_subset

    val, val_tokens = validation_subset(val, val_tokens, cfg.val_images)
    if not as_json:
        click.echo(f"choosing the document shift on validation (FLOPs budget {flops_budget:g})", err=True)
    chosen = calibrate_trained_head(head, val, val_tokens, cfg.expansion, flops_budget, boost, train_split,
                                    train_tokens, distractors, *documents, cfg.resolved_device(), cfg.seed)
    save_head(head, out / "head.pt")
    return chosen


def _keep_boost(head, boost: float, out: Path, document_terms: int) -> None:
    """No shift chosen (no budget or no validation split): the head keeps the boost and the
    images' most terms alone."""
    from d2s_onnx_export.head import save_head

    if (boost, document_terms) != (head.config.query_word_boost, head.config.document_terms):
        head.config.query_word_boost, head.config.document_terms = boost, document_terms
        save_head(head, out / "head.pt")


def _train_joint(data, out, cfg, vocab_init, init_head, tokenizer, export_onnx_head, flops_budget, boost,
                 distractors, as_json, documents: tuple[int, float]) -> int:
    """``train --objective joint``: from ``embed --features`` output (img_feats/text_feats,
    projections.safetensors, dataset_meta.json)."""
    from d2s_onnx_export.head import load_head

    from d2s_search.train.data import load_authors_layout
    from d2s_search.train.joint import load_projections, train_joint
    from d2s_search.train.modeling import build_head
    from d2s_search.train.trainer import TrainingError
    from d2s_search.train.vocab import excluded_token_ids, load_tokenizer, tokenize_captions

    if not any((Path(data) / f"img_feats.{ext}").is_file() for ext in ("parquet", "npy")):
        raise TrainingError(f"{data} has no img_feats (pre-projection features): write them with "
                            "`d2s-search embed DATASET --bundle BUNDLE --features --out DIR`")
    feats = load_authors_layout(data, kind="feats", same_dim=False)
    if "train" not in feats:
        raise TrainingError(f"{data} has no training split")
    proj = load_projections(Path(data) / "projections.safetensors")
    tok = load_tokenizer(tokenizer)
    val = feats.get("val")
    val_tokens = tokenize_captions(val.captions, tok) if val is not None else None
    train_tokens = tokenize_captions(feats["train"].captions, tok) if cfg.expansion != "1" else None
    dim = int(proj["text_proj.weight"].shape[0])
    if init_head:
        head = load_head(init_head)
        if head.config.dense_dim != dim:
            raise TrainingError(f"{init_head} expects {head.config.dense_dim}-d vectors, the projections give {dim}-d")
    else:
        head = build_head(dim, vocab_init, excluded_token_ids(tok), tok.get_vocab_size(), seed=cfg.seed)
    if head.config.vocab_size != tok.get_vocab_size():
        raise TrainingError(f"the head has {head.config.vocab_size} terms, the tokenizer {tok.get_vocab_size()}")

    def log(entry: dict) -> None:
        if not as_json:
            v, d = entry.get("val_sparse"), entry.get("val_dense")
            val_txt = f" val sparse R@1 {v['R@1']:.4f} FLOPs {v['FLOPs']:.1f}, dense R@1 {d['R@1']:.4f}" if v else ""
            _console().log(f"epoch {entry['epoch']}: loss {entry['total']:.4f} tau {entry['tau']:.4f}{val_txt} "
                           f"({entry['seconds']:.1f}s)")

    summary = train_joint(head, proj, feats["train"], cfg, out, val, val_tokens, train_tokens, log=log)
    if flops_budget > 0 and val is not None:  # on the validation vectors of the fine-tuned projections
        from d2s_search.train.joint import JointModel, project

        best = load_head(summary["head"])
        model = JointModel(best, load_projections(summary["projections"]), cfg.tau).eval()
        summary["document_shift"] = _choose_document_shift(best, project(model, val), val_tokens, cfg, flops_budget,
                                                           boost, Path(out), as_json, project(model, feats["train"]),
                                                           train_tokens if train_tokens is not None or not documents[1]
                                                           else tokenize_captions(feats["train"].captions, tok),
                                                           distractors, documents)
    else:
        _keep_boost(load_head(summary["head"]), boost, Path(out), documents[0])
    if export_onnx_head:
        from d2s_search.train.convert import export_head_onnx

        summary["head_onnx"] = str(export_head_onnx(load_head(summary["head"]), Path(out) / "head.onnx"))
    if as_json:
        _emit_json(_clean(summary))
    else:
        click.echo(f"best head: {summary['head']}, projections: {summary['projections']} from epoch "
                   f"{summary['best_epoch']} (val sparse R@1 {summary['best_val_sparse_r1']:.4f}); bundle: "
                   f"d2s-search export-onnx --model MODEL --head {summary['head']} --projections {summary['projections']}")
    return EXIT_OK


@train.command("convert-head")
@click.argument("source", type=click.Path(exists=True))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Head file to write (.pt, load_head format).")
@click.option("--onnx", "onnx_out", type=click.Path(dir_okay=False), help="Also write the head as an ONNX graph.")
@_tokenizer_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def convert_head(source, out, onnx_out, tokenizer, as_json) -> int:
    """Convert an authors' D2S checkpoint (DistilBERT MLM layout, e.g. a downloaded
    lsr42/d2s_* directory or their model.pt) for `export-onnx --head`."""
    from d2s_onnx_export.head import head_summary, save_head

    from d2s_search.train.convert import convert_authors_head, export_head_onnx
    from d2s_search.train.vocab import excluded_token_ids, load_tokenizer

    head = convert_authors_head(source, excluded_token_ids(load_tokenizer(tokenizer)))
    path = save_head(head, out)
    result = {"head": str(path), **head_summary(head)}
    if onnx_out:
        result["onnx"] = str(export_head_onnx(head, onnx_out))
    if as_json:
        _emit_json(result)
    else:
        click.echo(f"wrote {path} ({head.config.dense_dim}-d -> {head.config.vocab_size} terms)")
    return EXIT_OK


@train.command("export-head")
@click.argument("head_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="ONNX file (input dense, output sparse).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def export_head(head_path, out, as_json) -> int:
    """Write a trained head as a standalone ONNX graph (torch-free evaluation)."""
    from d2s_onnx_export.head import load_head

    from d2s_search.train.convert import export_head_onnx

    path = export_head_onnx(load_head(head_path), out)
    if as_json:
        _emit_json({"onnx": str(path)})
    else:
        click.echo(f"wrote {path}")
    return EXIT_OK


@train.command("extract-head")
@click.option("--bundle", type=click.Path(file_okay=False), envvar="D2S_BUNDLE", help="Model bundle (default: the one "
              "exported last).")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Head file to write (.pt, for "
              "`evaluate --head` and `export-onnx --head`).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def extract_head(bundle, out, as_json) -> int:
    """Write the head inside a bundle as a head file, to compare it with a new head on the same
    vectors (`evaluate --data embs --head`). The head is rebuilt from what export recorded (the
    --head file, or the model's own head) and checked against the bundle's graphs."""
    from d2s_onnx_export.bundle_head import extract_head as extract
    from d2s_onnx_export.head import head_summary, save_head

    from d2s_search.cli.options import load_bundle

    bundle_obj = load_bundle(bundle, verify=True)
    extracted = extract(bundle_obj)
    path = save_head(extracted.head, out)
    c = extracted.head.config
    if as_json:
        _emit_json({"head": str(path), "bundle": str(bundle_obj.path), "source": extracted.source,
                    "max_difference": extracted.max_difference, **head_summary(extracted.head)})
    else:
        click.echo(f"wrote {path}: the head of {bundle_obj.path} ({extracted.source}; document shift "
                   f"{c.document_shift:g}, query word boost {c.query_word_boost:g}), matching the bundle's graphs "
                   f"within {extracted.max_difference:.1g}")
    return EXIT_OK


# ----------------------------------------------------------------------------- evaluate


@click.command("evaluate")
@click.option("--data", type=click.Path(file_okay=False), help="Precomputed embeddings directory.")
@click.option("--dataset", type=click.Path(exists=True, dir_okay=False), help="End to end instead: a Karpathy JSON or image,caption CSV whose images were ingested; its captions query the index.")
@click.option("--image-root", type=click.Path(file_okay=False), help="With --dataset: folder the image paths are relative to.")
@click.option("--bundle", type=click.Path(file_okay=False), envvar="D2S_BUNDLE", help="With --dataset: the bundle the index was filled with (default: the one it records).")
@click.option("--index", "index_dir", type=click.Path(file_okay=False), envvar="D2S_INDEX", default="./d2s-index", show_default=True, help="With --dataset: local index folder.")
@click.option("--backend", type=click.Choice(["local", "opensearch", "elasticsearch"]), envvar="D2S_BACKEND", help="With --dataset: backend (default: opensearch when --url is set).")
@click.option("--url", envvar="D2S_OPENSEARCH_URL", help="With --dataset: OpenSearch URL.")
@click.option("--index-name", envvar="D2S_OPENSEARCH_INDEX", default="d2s", show_default=True,
              help="With --dataset: OpenSearch index name.")
@click.option("--modes", default="sparse,two-phase,dense,hybrid", show_default=True, help="With --dataset: query plans to measure.")
@click.option("--within-split", is_flag=True,
              help="With --dataset: rank only among the split's images (copied from the index into a scratch local "
                   "index), as --data does; default: among every document of the index.")
@click.option("--val-fraction", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="With --dataset CSV: share of images in val (as given to embed).")
@click.option("--test-fraction", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="With --dataset CSV: share of images in test (as given to embed).")
@click.option("--seed", type=int, default=0, show_default=True, help="With --dataset CSV: seed of the split (as given to embed).")
@click.option("--split", default="test", show_default=True, help="Split to evaluate (train, val, test).")
@click.option("--head", "head_path", type=click.Path(exists=True, dir_okay=False), help="Sparse head: .pt (needs torch) or .onnx. Without it only the dense run is measured.")
@click.option("--runs", default="dense,sparse,hybrid", show_default=True, help="Comma-separated: dense, sparse, hybrid.")
@click.option("--query-mask", type=click.Choice(["auto", "own_tokens", "none"]), default="auto", show_default=True, help="Restrict query terms to the query's own tokens (auto: as the head was trained; exp=0 heads need it).")
@click.option("--fusion", type=click.Choice(["minmax", "rrf"]), default="minmax", show_default=True,
              help="How the hybrid run fuses sparse and dense: weighted min-max scores or reciprocal rank fusion.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True, help="Dense weight in min-max fusion.")
@click.option("--semantic-k", type=click.IntRange(1), default=20, show_default=True, help="k of Exact@k and Semantic@k.")
@click.option("--max-images", type=click.IntRange(0), default=0, help="Evaluate on the first N images only (0 = all).")
@click.option("--check", is_flag=True, help="Recompute R@k/MRR@10 with ir_measures and report both.")
@_tokenizer_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def evaluate_cmd(data, dataset, image_root, bundle, index_dir, backend, url, index_name, modes, within_split,
                 val_fraction, test_fraction, seed, split, head_path, runs, query_mask, fusion, alpha, semantic_k,
                 max_images, check, tokenizer, as_json) -> int:
    """Text->image R@1/5/10, MRR@10, FLOPs, Exact@k, Semantic@k, terms per vector and
    faithfulness to the dense run, on precomputed embeddings (--data) or end to end through
    an index (--dataset, after `d2s-search ingest` of its images)."""
    if (data is None) == (dataset is None):
        raise click.UsageError("give either --data (precomputed embeddings) or --dataset (end to end through an index)")
    if dataset:
        csv_split = {"val_fraction": val_fraction, "test_fraction": test_fraction, "seed": seed}
        return _evaluate_index(dataset, image_root, bundle, index_dir, backend, url, index_name, modes, split,
                               fusion, alpha, max_images, as_json, within_split, csv_split)
    from d2s_search import metrics as M
    from d2s_search.evaluate import (
        EvalData,
        EvalOptions,
        evaluate,
        ir_measures_check,
        sparse_from_head,
        static_embeddings,
    )
    from d2s_search.train.data import DatasetError, load_dataset
    from d2s_search.train.vocab import load_tokenizer, tokenize_captions

    splits = load_dataset(data)
    if split not in splits:
        raise DatasetError(f"{data} has no {split!r} split (has: {', '.join(splits)})")
    s = splits[split]
    if max_images and len(s.image_ids) > max_images:
        s = s.head(max_images)
    ev = EvalData.from_split(s, f"{Path(data).name}/{split}")
    wanted = tuple(r.strip() for r in runs.split(",") if r.strip())
    bad = [r for r in wanted if r not in ("dense", "sparse", "hybrid")]
    if bad:
        raise click.UsageError(f"unknown run(s): {', '.join(bad)}")
    sv, q_tokens, names = None, None, None
    if head_path:
        from d2s_search.train.vocab import id_to_token

        tok = load_tokenizer(tokenizer)
        names = id_to_token(tok)
        ct = tokenize_captions(s.captions, tok)
        q_tokens = [ct.row(i) for i in range(len(ct))]
        typed = [ct.boosted().row(i) for i in range(len(ct))]
        sv = sparse_from_head(head_path, ev, q_tokens, None if query_mask == "auto" else query_mask, typed)
    opts = EvalOptions(runs=wanted, hybrid_weight=alpha, fusion=fusion, semantic_k=semantic_k)
    result = evaluate(ev, sv, q_tokens, static_embeddings() if sv is not None else None, opts, names)
    if check:
        from d2s_search.evaluate import score_function

        result["ir_measures"] = {}
        for kind in result["runs"]:
            if kind == "hybrid" and fusion == "rrf":
                continue
            idx, val = M.rank_topk(score_function(kind, ev, sv, alpha), 10, len(ev.query_ids), ev.doc_ids)
            result["ir_measures"][kind] = ir_measures_check(ev, idx, val)
    if as_json:
        _emit_json(_clean(result))
    else:
        _print_eval(result, semantic_k)
    return EXIT_OK


def _evaluate_index(dataset, image_root, bundle, index_dir, backend, url, index_name, modes, split, fusion, alpha,
                    max_images, as_json, within_split=False, csv_split=None) -> int:
    from rich.progress import Progress

    from d2s_search.cli.options import index_location, open_index
    from d2s_search.embed import read_dataset
    from d2s_search.encoder import Encoder
    from d2s_search.evaluate import evaluate_index
    from d2s_search.train.data import DatasetError

    # A CSV is split by the seeded draw `embed` makes, with the same options and defaults.
    is_json = str(dataset).lower().endswith(".json")
    items = read_dataset(dataset, image_root, **({} if is_json else dict(csv_split or {})))
    items = [it for it in items if it.split == split]
    if not items:
        raise DatasetError(f"{dataset} has no {split!r} images" + ("" if is_json else " with this --val-fraction, "
                                                                   "--test-fraction and --seed"))
    if max_images:
        items = items[:max_images]
    wanted = tuple(m.strip() for m in modes.split(",") if m.strip())
    bundle_obj, store, _ = open_index(backend, index_dir, url, index_name, bundle, create=False)
    progress = None if as_json else _ShownOnFirstTask(Progress(console=_console()))
    try:
        where = index_location(store)
        result = evaluate_index(store, Encoder(bundle_obj), items, wanted, fusion=fusion, alpha=alpha,
                                progress=progress, within_split=within_split)
    finally:
        if progress:
            progress.stop()
        store.close()
    result["dataset"] = f"{Path(dataset).name}/{split}"
    result["index"] = where
    if as_json:
        _emit_json(_clean(result))
        return EXIT_OK
    every = f"all {result['ranked_among']:,}" if result["ranked_among"] is not None else "all the"
    among = (f"ranked among these {result['documents']:,} images alone (--within-split), as --data ranks a split"
             if within_split else
             f"ranked among {every} documents of the index (--within-split: among these images alone, as --data "
             "ranks a split)")
    click.echo(f"{result['queries']} queries about {result['documents']:,} {split} images in {where}, {among}; "
               f"{result['skipped_queries']} captions skipped (image not in the index)")
    click.echo(f"FLOPs {result.get('FLOPs', 0):.1f}, terms/query {result.get('terms_per_query', 0):.1f}, "
               f"terms/image {result.get('terms_per_image', 0):.1f}")
    scope = "this split" if within_split else "the whole index"
    _print_eval({"dataset": result["dataset"], "queries": result["queries"], "documents": result["ranked_among"] or "?",
                 "runs": result["runs"]}, 20, documents_label=f"images ranked ({scope})")
    return EXIT_OK


class _ShownOnFirstTask:
    """A rich Progress that appears with its first task: an error before any work prints its one
    line alone."""

    def __init__(self, progress) -> None:
        self.progress, self.started = progress, False

    def add_task(self, *args, **kwargs):
        if not self.started:
            self.progress.start()
            self.started = True
        return self.progress.add_task(*args, **kwargs)

    def update(self, *args, **kwargs) -> None:
        self.progress.update(*args, **kwargs)

    def stop(self) -> None:
        if self.started:
            self.progress.stop()


def _print_eval(result: dict, k: int, documents_label: str = "images") -> None:
    from rich.table import Table

    cols = ["R@1", "R@5", "R@10", "MRR@10", "FLOPs", f"Exact@{k}", f"Semantic@{k}", "terms_per_query",
            "terms_per_image", "top10_overlap_dense", "corr_dense_MRR@10", "latency_ms_mean"]
    cols = [c for c in cols if any(c in r for r in result["runs"].values())]
    table = Table()
    table.add_column("run")
    for c in cols:
        table.add_column(c.replace("_", " "), justify="right")
    for name, r in result["runs"].items():
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("-" if v is None or (isinstance(v, float) and math.isnan(v)) else
                         f"{v:.1f}" if c in ("FLOPs", "terms_per_query", "terms_per_image", "latency_ms_mean")
                         else f"{v:.4f}")
        table.add_row(name, *cells)
    console = _console(stderr=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)  # don't squeeze the table in pipes and logs
    console.print(f"{result['dataset']}: {result['queries']} queries, {result['documents']} {documents_label}")
    console.print(table)
    co = result.get("coactivation")
    if co:
        terms = ", ".join(f"{t['term']} ({t['query_share']:.0%} q / {t['doc_share']:.0%} d)"
                          for t in co["top_coactivated"][:10])
        console.print(f"most co-activated terms: {terms}")
        line = (f"{co['flops_share_common_terms']:.1%} of FLOPs from the {co['common_terms']} terms active in "
                f"more than half of the images")
        if co.get("max_foreign_query_term") is not None:
            line += (f"; most frequent expansion term: {co['max_foreign_query_term']} in "
                     f"{co['max_foreign_query_share']:.0%} of queries")
        console.print(line)


# ----------------------------------------------------------------------------- embed


@click.command("embed")
@click.argument("dataset", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Output directory (authors' layout).")
@click.option("--bundle", type=click.Path(file_okay=False), help="Model bundle: image (and by default text) encoder.")
@click.option("--text-encoder", type=click.Choice(["bundle", "minilm"]), default="bundle", show_default=True,
              help="Captions through the bundle's text model, or through MiniLM (offline extra).")
@click.option("--images/--no-images", default=True, show_default=True, help="Embed the images too (needs --bundle).")
@click.option("--image-root", type=click.Path(file_okay=False), help="Folder the dataset's image paths are relative to.")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True, help="Inputs encoded together.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "npy"]), default="parquet", show_default=True,
              help="parquet: img_embs/text_embs (authors' layout); npy: image_embeddings.npy + text_embeddings.npy.")
@click.option("--val-fraction", type=click.FloatRange(0, 1), default=0.1, show_default=True, help="CSV only: share of images in val.")
@click.option("--test-fraction", type=click.FloatRange(0, 1), default=0.1, show_default=True, help="CSV only: share of images in test.")
@click.option("--seed", type=int, default=0, show_default=True, help="CSV only: seed of the val/test split.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="ONNX Runtime device (CUDA when it really loads).")
@click.option("--features", is_flag=True, help="Also store the pre-projection vectors (img_feats/text_feats) and the bundle's projections.safetensors, for `train --objective joint`.")
@ray_engine_options("the workers of a Ray cluster encode the chunks")
@click.option("--workers", type=click.IntRange(1, 4096), default=2, show_default=True,
              help="--engine ray: encoding workers (each holds the encoders).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def embed(dataset, out, bundle, text_encoder, images, image_root, batch_size, fmt, val_fraction, test_fraction, seed, device,
          features, engine, ray_address, cpus_per_worker, gpus_per_worker, workers, as_json) -> int:
    """Precompute dense embeddings of a Karpathy JSON or image,caption CSV (resumable)."""
    from d2s_search.embed import bundle_encoders, embed_dataset, read_dataset

    items = read_dataset(dataset, image_root, **({"val_fraction": val_fraction, "test_fraction": test_fraction, "seed": seed}
                                                 if not str(dataset).lower().endswith(".json") else {}))
    text_fn = image_fn = None
    name = ""
    features_from = projections = None
    if features:
        if not bundle or text_encoder != "bundle":
            raise click.UsageError("--features needs --bundle as the text (and image) encoder")
        from d2s_search.bundle import Bundle

        b = Bundle.load(bundle)
        projections, features_from = b.require_features(), b.dense_dim
    if bundle:
        text_fn, image_fn, name = bundle_encoders(bundle, device, features=features)
    if images and image_fn is None:
        raise click.UsageError("embedding images needs --bundle (or pass --no-images)")
    if text_encoder == "minilm":
        from d2s_search.train.minilm import MiniLMEncoder

        enc = MiniLMEncoder(device="cuda" if device == "cuda" else "cpu")
        text_fn, name = enc, f"{name}+{enc.name}" if images else enc.name
    if text_fn is None:
        raise click.UsageError("no text encoder: pass --bundle or --text-encoder minilm")
    from rich.progress import Progress

    progress = None if as_json else Progress(console=_console())
    runner = contextlib.nullcontext()
    if engine == "ray":
        from d2s_search.ray_embed import EncoderRecipe, RayChunkRunner
        from d2s_search.ray_ingest import RayOptions

        recipe = EncoderRecipe(str(bundle) if bundle else None, text_encoder, device, features)
        runner = RayChunkRunner(recipe, RayOptions(address=ray_address, workers=workers,
                                                   cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker))
    if progress:
        progress.start()
    try:
        with runner as chunks_elsewhere:
            summary = embed_dataset(items, out, text_fn, image_fn if images else None, name, batch_size, fmt, progress,
                                    features_from=features_from, projections=projections, runner=chunks_elsewhere)
    finally:
        if progress:
            progress.stop()
    n_rej = sum(len(summary[s]["rejected"]) for s in ("text", "img") if s in summary)
    if as_json:
        _emit_json(summary)
    else:
        parts = [f"{summary[s]['count']} {s} vectors" for s in ("img", "text") if s in summary]
        click.echo(f"wrote {', '.join(parts)} to {out}" + (f"; {n_rej} inputs rejected" if n_rej else ""))
    return EXIT_PARTIAL if n_rej else EXIT_OK
