"""The D2S training loop: batches of (image, caption) vectors, PEC masks, AdamW with two
learning-rate groups, warm-up + linear decay, per-epoch validation R@1, best-checkpoint
selection and resumable checkpoints.

Files written to ``out_dir``:
  ``head.pt``        best head by validation R@1 (``load_head`` format, for export-onnx)
  ``last.pt``        full training state after the last finished epoch (resume)
  ``history.json``   per-epoch loss parts, p_c, validation metrics
  ``config.json``    the run's settings
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from d2s_onnx_export.head import SparseHead, load_head, save_head

from d2s_search.errors import D2SError
from d2s_search.train.augment import PairMixer, check_mix_side, mix_pairs
from d2s_search.train.averaging import WeightAverage
from d2s_search.train.batching import clustered_order, image_clusters
from d2s_search.train.data import PairSplit
from d2s_search.train.losses import d2s_loss
from d2s_search.train.pec import PEC
from d2s_search.train.validation import (  # noqa: F401  (re-exported: joint, cli and tests use them from here)
    check_distractors,
    pick_distractors,
    query_mask_for,
    validate,
    validation_documents,
    validation_metrics,
    validation_queries,
    validation_subset,
)
from d2s_search.train.vocab import CaptionTokens, document_frequency


class TrainingError(D2SError):
    """Training cannot start or resume as asked."""


# `train`'s schedule when --epochs / --batch-size are not given. The default recipe was measured
# at 30 epochs of batch 128 on 7k caption pairs (docs/training.md); the paper's 200 epochs of
# batch 512 are for COCO's 566k pairs and take hours on a CPU for what 30 epochs give on a small
# set (the best epoch is kept either way). Below this many training captions, the measured one.
SMALL_DATASET_CAPTIONS = 50_000


def default_schedule(n_captions: int) -> tuple[int, int]:
    """(epochs, batch size) for a training split of ``n_captions`` captions."""
    return (30, 128) if n_captions < SMALL_DATASET_CAPTIONS else (200, 512)


def _settings_differ(stored, now: dict) -> str:
    """" (epochs 200 there, 30 now; ...)": the first settings a resumed run would change. The
    stored side was read back from disk, so anything but a dict names nothing. A key missing on
    one side is a setting at its old default (``identity()`` leaves those out)."""
    if not isinstance(stored, dict):
        return ""
    missing = object()

    def shown(d: dict, k: str) -> str:
        return repr(d[k])[:40] if k in d else "default"

    keys = sorted((k for k in set(stored) | set(now) if stored.get(k, missing) != now.get(k, missing)), key=str)
    parts = "; ".join(f"{k} {shown(stored, k)} there, {shown(now, k)} now" for k in keys[:3])
    return f" ({parts}{'; ...' if len(keys) > 3 else ''})" if keys else ""


# What a run folder holds of the run that wrote it: removed by --force before a new run starts
# (config.json is rewritten by every run).
RUN_FILES = ("last.pt", "head.pt", "history.json", "head.onnx")


@dataclass
class PreviousRun:
    """What ``last.pt`` in a run folder says about the run that wrote it."""

    settings: dict  # TrainConfig.identity() of that run
    epochs_done: int

    @property
    def epochs(self) -> int | None:
        epochs = self.settings.get("epochs") if isinstance(self.settings, dict) else None
        return epochs if isinstance(epochs, int) else None

    @property
    def finished(self) -> bool:
        return self.epochs is not None and self.epochs_done >= self.epochs


def previous_run(out_dir: str | Path) -> PreviousRun | None:
    """The run whose ``last.pt`` is in ``out_dir``, or None when there is none. Mapped, not read
    whole: only its settings and epoch count are looked at."""
    last = Path(out_dir) / "last.pt"
    if not last.is_file():
        return None
    try:
        ckpt = torch.load(last, map_location="cpu", weights_only=False, mmap=True)
        return PreviousRun(ckpt["config"], int(ckpt["state"]["epoch"]))
    except Exception as exc:  # truncated, foreign or from another torch: say so in one line
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise TrainingError(f"{last} cannot be read ({reason}): pass --force to start the run over, "
                            "or use another --out") from None


def resume_decision(out_dir: str | Path, config: TrainConfig, resume: bool, force: bool) -> tuple[bool, str | None]:
    """Whether a run into ``out_dir`` continues the one there, and the line that says so.

    The same command run again continues its unfinished run; a finished run is replaced only
    with ``force``; an unfinished run with other settings is refused, naming the difference.
    ``resume`` asks to continue explicitly (:func:`train` refuses other settings then)."""
    if force:
        clear_run(out_dir)
        return False, None
    if resume:
        return True, None
    before = previous_run(out_dir)
    if before is None:
        return False, None
    now = config.identity()
    differ = _settings_differ(before.settings, now) if before.settings != now else ""
    if before.settings != now and not differ:
        differ = " (unreadable settings)"
    of = f"epoch {before.epochs_done} of {before.epochs}" if before.epochs else f"epoch {before.epochs_done}"
    if before.finished:
        what = "a finished run" + (f" with other settings{differ}" if differ else f" ({before.epochs} epochs)")
        raise TrainingError(f"{out_dir} holds {what}: pass --force to train again from scratch, or use another --out")
    if differ:
        raise TrainingError(f"{out_dir} holds an unfinished run ({of}) with other settings{differ}: give its "
                            "settings again to continue it, or pass --force to start over (or use another --out)")
    return True, f"continuing the unfinished run in {out_dir} after {of} (--force starts over)"


def clear_run(out_dir: str | Path) -> None:
    """Remove the files a previous run wrote (:data:`RUN_FILES`), nothing else."""
    for name in RUN_FILES:
        path = Path(out_dir) / name
        if path.is_file() and not path.is_symlink():
            path.unlink()


@dataclass
class TrainConfig:
    expansion: str = "c+w"
    eta: float = 1e-3
    lam: float = 0.5
    tau: float = 1e-3
    epochs: int = 200
    batch_size: int = 512
    lr_proj: float = 1e-3  # W1 (new layer)
    lr_vocab: float = 5e-5  # LayerNorm + W2 (initialised from a vocabulary projection)
    warmup: float = 0.2  # share of all steps; also the L1 ramp length
    schedule: str = "paper"
    seed: int = 0
    amp: str = "auto"  # auto = only on CUDA; "off" always fp32
    device: str = "auto"
    val_images: int = 1000  # validation on the first N images of the val split (0 = all)
    # Only epochs that end after the warm-up (L1 weight fully ramped up) compete for the best
    # checkpoint: earlier epochs are barely regularised, dense, and win on R@1 alone in short runs.
    select_after_warmup: bool = True
    eval_batch: int = 1024
    regularizer: str = "l1"  # "l1" (the paper) or "flops" (SPLADE's FLOPS regulariser)
    gate_own_words: bool = False  # Algorithm 1 read literally: E_v also gates own words
    lr_bias: float | None = None  # per-term output bias (if the head has one); None = lr_vocab
    # Weight of the lexical term (losses.off_caption_mass): photos put their mass on words of
    # their captions. 0 = the paper's loss.
    lexical: float = 0.0
    # The images' sparsity weight relative to the captions' (SPLADE's lambda_d / lambda_q).
    image_eta_scale: float = 1.0
    # Share of each batch's pairs replaced by a mix with another pair (augment.PairMixer): a
    # label-free augmentation, the dense teacher scores the mixes. 0 = off.
    mix: float = 0.0
    mix_most: float = 1.0  # the partner's largest weight in a mix (drawn uniformly up to it)
    mix_side: str = "both"  # which side is mixed: "both", "images" (documents) or "captions" (queries)
    mix_neighbours: int = 0  # > 0: a row's partner is one of its most similar rows in the batch
    # > 0: batches are cut from k-means clusters of similar training images, about this many
    # images per cluster (batching.py: topic-aware sampling). 0 = random batches.
    cluster_images: int = 0
    # > 0: validate and save an exponential moving average of the weights with this decay per
    # step (averaging.py). 0 = the live weights.
    average_decay: float = 0.0
    # > 0: the best epoch is the one with the best validation R@1 against the validation images
    # plus up to this many training images (validation.pick_distractors); 0 = the images alone.
    val_distractors: int = 0
    # > 0: the best epoch is the one whose best validation R@1 over the document shifts within
    # this FLOPs budget is highest (calibrate.choose_document_shift per epoch, queries boosted by
    # select_boost): epochs compared as the product will use them. 0 = the head alone.
    select_flops_budget: float = 0.0
    select_boost: float = 2.0
    # > 0: images keep at most this many terms when an epoch is scored (the head's
    # ``document_terms``, as the product will use it); 0 = every term.
    select_document_terms: int = 0
    # The epoch kept is the *latest* whose validation score is within this much of the best
    # (later epochs are more settled: sparser, fewer wide expansions; differences below the
    # noise say nothing). -1 = one standard error of the score, sqrt(p(1-p)/queries);
    # 0 = the best epoch strictly. Without validation (the training loss decides): 0.
    select_tolerance: float = -1.0
    notes: dict = field(default_factory=dict)

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    # Settings that must not change when resuming.
    def identity(self) -> dict:
        d = asdict(self)
        for k in ("device", "eval_batch", "notes", "amp"):
            d.pop(k)
        if d["image_eta_scale"] == 1.0:  # what runs from before the option recorded
            d.pop("image_eta_scale")
        if d["mix"] == 0.0 and d["mix_most"] == 1.0:
            d.pop("mix")
            d.pop("mix_most")
        if d["mix_side"] == "both":
            d.pop("mix_side")
        if d["mix_neighbours"] == 0:
            d.pop("mix_neighbours")
        if d["cluster_images"] == 0:
            d.pop("cluster_images")
        if d["average_decay"] == 0.0:
            d.pop("average_decay")
        if d["val_distractors"] == 0:
            d.pop("val_distractors")
        if d["select_flops_budget"] == 0.0:
            d.pop("select_flops_budget")
            d.pop("select_boost")
        if d["select_tolerance"] == -1.0:
            d.pop("select_tolerance")
        if d["select_document_terms"] == 0:
            d.pop("select_document_terms")
        return d


@dataclass
class EpochLog:
    epoch: int
    loss: float
    ce: float
    l1_img: float
    l1_cap: float
    p_c: float
    expanded_batches: float
    val: dict
    seconds: float
    eligible: bool = True


def _lr_lambda(total: int, warmup: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return step / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return f


def _image_word_sets(tokens: CaptionTokens, caption_image: np.ndarray) -> list[np.ndarray]:
    """Per image, the token ids of all its captions (the words a photo may be said with)."""
    caption_image = np.asarray(caption_image, dtype=np.int64)
    n_images = int(caption_image.max()) + 1 if caption_image.size else 0
    per_image: list[list[np.ndarray]] = [[] for _ in range(n_images)]
    for i, img in enumerate(caption_image.tolist()):
        per_image[img].append(tokens.row(i))
    return [np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64) for rows in per_image]


def _word_matrix(word_sets: list[np.ndarray], images: np.ndarray, vocab: int, device) -> torch.Tensor:
    """0/1 (len(images), vocab): row r marks the caption words of image ``images[r]``."""
    out = torch.zeros(len(images), vocab, device=device)
    for r, img in enumerate(images.tolist()):
        ids = word_sets[img]
        out[r, torch.as_tensor(ids[ids < vocab], device=device)] = 1.0
    return out


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(
    head: SparseHead,
    train_split: PairSplit,
    train_tokens: CaptionTokens,
    config: TrainConfig,
    out_dir: str | Path,
    val_split: PairSplit | None = None,
    val_tokens: CaptionTokens | None = None,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[EpochLog], None] | None = None,
    distractors: np.ndarray | None = None,
) -> dict:
    """Train ``head`` in place; returns a summary (best epoch, validation metrics, files).

    With ``config.val_distractors``, validation also searches a larger collection: the
    validation images plus ``distractors`` (dense image vectors) when given, else up to that
    many of the training images (when the training rows are not all images, e.g. caption pairs
    beside photos, pass the photos)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if len(train_tokens) != len(train_split.caption_ids):
        raise TrainingError("caption token ids do not match the training captions")
    if head.config.dense_dim != train_split.dim:
        raise TrainingError(
            f"head expects {head.config.dense_dim}-d vectors, the embeddings are {train_split.dim}-d"
        )
    device = config.resolved_device()
    use_amp = device.type == "cuda" and config.amp != "off"
    _seed_all(config.seed)
    head.to(device).train()

    n = len(train_split.caption_ids)
    steps_per_epoch = math.ceil(n / config.batch_size)
    total = steps_per_epoch * config.epochs
    warmup = int(total * config.warmup)
    new = list(head.proj.parameters()) + (list(head.mlp.parameters()) if head.mlp is not None else [])
    pre = list(head.norm.parameters()) + [head.vocab.weight]
    groups = [{"params": new, "lr": config.lr_proj}, {"params": pre, "lr": config.lr_vocab}]
    if head.vocab.bias is not None:
        groups.append({"params": [head.vocab.bias], "lr": config.lr_bias or config.lr_vocab})
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(total, warmup))
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    df = document_frequency(train_tokens)
    pec = PEC(config.expansion, train_tokens, df, config.epochs, config.schedule, config.seed,
              gate_own_words=config.gate_own_words)
    order_rng = np.random.default_rng(config.seed)
    _refuse_bad_settings(config)  # before any work, not at the first step
    mixer = PairMixer(config.mix, config.seed, config.mix_most, config.mix_neighbours) if config.mix > 0 else None

    row_cluster = (image_clusters(train_split.image_emb, train_split.caption_image, config.cluster_images, config.seed)
                   if config.cluster_images > 0 else None)
    average = WeightAverage(head, config.average_decay) if config.average_decay > 0 else None
    val, val_tokens = validation_subset(val_split, val_tokens, config.val_images)
    val_extra = None
    if config.val_distractors > 0 and val is not None:
        if distractors is not None:
            check_distractors(distractors, train_split.dim, TrainingError)  # before any training, not after an epoch
            val_extra = np.asarray(distractors)[: config.val_distractors]
        else:
            val_extra = pick_distractors(train_split.image_emb, train_split.caption_image, config.val_distractors,
                                         config.seed)

    head.config.notes = {
        **head.config.notes,
        "expansion": config.expansion,
        "eta": config.eta,
        "query_mask": query_mask_for(config.expansion),
        "regularizer": config.regularizer,
    }
    state = {"epoch": 0, "step": 0, "best_r1": -math.inf, "best_epoch": -1, "history": []}
    last = out / "last.pt"
    if resume and last.is_file():
        ckpt = torch.load(last, map_location="cpu", weights_only=False)
        if ckpt["config"] != config.identity():
            raise TrainingError(
                f"{last} was written with other settings{_settings_differ(ckpt['config'], config.identity())}: "
                "give the run's settings again to continue it, or pass --force to start over (or use another --out)"
            )
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        pec.load_state_dict(ckpt["pec"])
        order_rng.bit_generator.state = ckpt["order_rng"]
        if mixer is not None:
            mixer.load_state_dict(ckpt["mixer"])
        if average is not None:
            try:
                average.load_state_dict(ckpt.get("average", {}))
            except (ValueError, KeyError, TypeError, RuntimeError) as err:
                raise TrainingError(f"{last}: {err}; pass --force to start over, or use another --out") from None
        torch.set_rng_state(ckpt["torch_rng"])
        state = ckpt["state"]
    (out / "config.json").write_text(json.dumps({**asdict(config), "head": asdict(head.config)}, indent=2))

    image_words = _image_word_sets(train_tokens, train_split.caption_image) if config.lexical > 0 else None
    z_txt = torch.as_tensor(train_split.text_emb, dtype=torch.float32)
    z_img_all = torch.as_tensor(train_split.image_emb, dtype=torch.float32)
    cap_img = torch.as_tensor(train_split.caption_image, dtype=torch.long)

    bar = _progress(progress)
    task = bar.add_task("training", total=total, completed=state["step"], info="") if bar else None
    pool_label = f"with {len(val_extra)} training images" if val_extra is not None and len(val_extra) else ""
    timer = _StepTimer(total - state["step"])
    try:
        if bar:
            bar.console.print(_plan_line(config, steps_per_epoch, state["epoch"], val), soft_wrap=True)
            bar.start()
        for epoch in range(state["epoch"], config.epochs):
            t0 = time.perf_counter()
            perm = order_rng.permutation(n) if row_cluster is None else clustered_order(order_rng, row_cluster)
            sums = {"loss": 0.0, "ce": 0.0, "l1_img": 0.0, "l1_cap": 0.0, "expanded": 0.0}
            for b in range(steps_per_epoch):
                timer.start()
                rows = perm[b * config.batch_size : (b + 1) * config.batch_size]
                rows_t = torch.as_tensor(rows)
                zc = z_txt[rows_t].to(device)
                zi = z_img_all[cap_img[rows_t]].to(device)
                mask, e_c = pec.draw(rows, epoch, device=device)
                words = None
                if image_words is not None:
                    words = _word_matrix(image_words, cap_img[rows_t].numpy(), head.config.vocab_size, device)
                if mixer is not None:
                    zc, zi, mask, words = mix_pairs(zc, zi, mask, mixer.draw(len(rows), zc), config.mix_side, words)
                with torch.autocast(device.type, dtype=torch.float16, enabled=use_amp):
                    s_cap = head(zc)
                    if mask is not None:
                        s_cap = s_cap * mask
                    s_img = head(zi, document=True)  # images are never masked; they carry the document shift
                parts = d2s_loss(
                    s_img, s_cap, zi, zc, config.tau, config.eta, config.lam, state["step"], warmup,
                    config.regularizer, config.lexical, words, config.image_eta_scale,
                )
                opt.zero_grad(set_to_none=True)
                scaler.scale(parts.total).backward()
                scaler.step(opt)
                scaler.update()
                sched.step()
                if average is not None:
                    average.update(head)
                state["step"] += 1
                if bar and (estimate := timer.step()):
                    bar.console.print(estimate, soft_wrap=True)
                sums["loss"] += float(parts.total.detach())
                sums["ce"] += (parts.ce_i2c + parts.ce_c2i) / 2
                sums["l1_img"] += parts.l1_img
                sums["l1_cap"] += parts.l1_cap
                sums["expanded"] += e_c
                if bar:
                    bar.update(task, advance=1, info=f"epoch {epoch + 1}/{config.epochs} loss {float(parts.total.detach()):.4f}")
            with average.applied(head) if average is not None else nullcontext():
                metrics = (
                    validate(head, val, val_tokens, config.expansion, device, config.eval_batch, val_extra)
                    if val is not None
                    else {}
                )
                if val is not None and config.select_flops_budget > 0:
                    metrics["R@1_within_budget"] = _best_r1_within_budget(head, val, val_tokens, config, device,
                                                                         val_extra)
            entry = EpochLog(
                epoch + 1,
                sums["loss"] / steps_per_epoch,
                sums["ce"] / steps_per_epoch,
                sums["l1_img"] / steps_per_epoch,
                sums["l1_cap"] / steps_per_epoch,
                pec.p_c(epoch),
                sums["expanded"] / steps_per_epoch,
                metrics,
                time.perf_counter() - t0,
                eligible=(not config.select_after_warmup or state["step"] >= warmup
                          or epoch == config.epochs - 1),
            )
            state["history"].append(asdict(entry))
            # R@1 over the larger collection when there is one; no validation: lowest training loss wins
            r1 = metrics.get("R@1_pool", metrics.get("R@1", -entry.loss))
            if "R@1_within_budget" in metrics:  # an epoch with a shift within the budget beats any without;
                within = metrics["R@1_within_budget"]  # among those without, R@1 of the head alone decides
                r1 = within if within >= 0 else metrics["R@1"] - 2.0
            if entry.eligible:
                state["top_r1"] = max(state.get("top_r1", state["best_r1"]), r1)
            if entry.eligible and r1 >= state["top_r1"] - _tolerance(config, state["top_r1"], val):
                state["best_r1"], state["best_epoch"] = r1, epoch + 1
                head.config.trained = True
                head.config.notes = {**head.config.notes, "best_epoch": epoch + 1, "val": metrics}
                with average.applied(head) if average is not None else nullcontext():
                    save_head(head, out / "head.pt")
            state["epoch"] = epoch + 1
            _save_state(last, head, opt, sched, scaler, pec, order_rng, config, state, mixer, average)
            (out / "history.json").write_text(json.dumps(state["history"], indent=2))
            if bar:
                bar.console.log(_epoch_line(entry, pool_label))
            if log:
                log(entry)
    finally:
        if bar:
            bar.stop()
    best = load_head(out / "head.pt")
    head.load_state_dict(best.state_dict())
    head.config = best.config
    return {
        "out_dir": str(out),
        "head": str(out / "head.pt"),
        "best_epoch": state["best_epoch"],
        "best_val": head.config.notes.get("val", {}),
        "epochs": config.epochs,
        "steps": state["step"],
        "steps_per_epoch": steps_per_epoch,
        "validation_images": len(val.image_ids) if val is not None else 0,
        "history": state["history"],
    }


def _tolerance(config: TrainConfig, top: float, val: PairSplit | None) -> float:
    """How far below the best validation score a later epoch may be and still be kept."""
    if val is None:
        return 0.0
    if config.select_tolerance >= 0:
        return config.select_tolerance
    p = min(max(top, 0.0), 1.0)  # epochs without a shift within the budget score R@1 - 2
    return math.sqrt(p * (1.0 - p) / max(len(val.caption_ids), 1))


def _best_r1_within_budget(head: SparseHead, val: PairSplit, tokens, config: TrainConfig, device,
                           distractors: np.ndarray | None) -> float:
    """The best validation R@1 (over the larger collection with ``distractors``) among the
    document shifts whose validation FLOPs fit ``config.select_flops_budget``; -1 if none fits.
    The head's own shifts, boost and document terms are put back."""
    from d2s_search.train.calibrate import choose_document_shift

    c = head.config
    kept = c.document_shift, c.query_word_boost, c.document_terms, c.query_shift
    c.document_terms = config.select_document_terms
    try:
        choice = choose_document_shift(head, val, tokens, config.expansion, config.select_flops_budget, device,
                                       batch_size=config.eval_batch, boosts=(config.select_boost,),
                                       distractors=distractors)
    finally:
        c.document_shift, c.query_word_boost, c.document_terms, c.query_shift = kept
    return max((r["R@1"] for r in choice.table if r["within_budget"]), default=-1.0)


def _refuse_bad_settings(config: TrainConfig) -> None:
    check_mix_side(config.mix_side)
    if config.cluster_images < 0:
        raise TrainingError(f"images per cluster must be >= 0, got {config.cluster_images}")
    if not 0.0 <= config.average_decay < 1.0:
        raise TrainingError(f"the weight average's decay must be in [0, 1), got {config.average_decay}")
    if config.val_distractors < 0:
        raise TrainingError(f"validation distractors must be >= 0, got {config.val_distractors}")
    if config.select_flops_budget < 0 or config.select_boost < 0:
        raise TrainingError("the selection's FLOPs budget and boost must be >= 0")
    if config.select_document_terms < 0:
        raise TrainingError(f"the document terms must be >= 0, got {config.select_document_terms}")
    if not (config.select_tolerance == -1.0 or 0.0 <= config.select_tolerance < math.inf):
        raise TrainingError(f"the selection's tolerance must be -1 (one standard error) or >= 0, "
                            f"got {config.select_tolerance}")


def _save_state(path, head, opt, sched, scaler, pec, order_rng, config, state, mixer=None, average=None) -> None:
    payload = {
        "head": {k: v.detach().cpu() for k, v in head.state_dict().items()},
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "pec": pec.state_dict(),
        "order_rng": order_rng.bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "config": config.identity(),
        "state": state,
    }
    if mixer is not None:
        payload["mixer"] = mixer.state_dict()
    if average is not None:
        payload["average"] = average.state_dict()
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def _plan_line(config: TrainConfig, steps_per_epoch: int, done: int, val: PairSplit | None) -> str:
    """What the run will do, printed before the first step."""
    steps = config.epochs * steps_per_epoch
    plan = (f"plan: {config.epochs} epochs x {steps_per_epoch:,} steps of batch {config.batch_size} = {steps:,} steps"
            + (f", validated on {len(val.image_ids):,} images after each epoch" if val is not None else ""))
    return plan + (f"; continuing after epoch {done}" if done else "")


class _StepTimer:
    """Times the first steps of a run (validation between epochs left out) and then says how
    long all of its steps will take."""

    FIRST_STEPS = 10

    def __init__(self, remaining: int) -> None:
        self.remaining, self.done, self.took, self.t0 = remaining, 0, 0.0, time.perf_counter()

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def step(self) -> str | None:
        self.done += 1
        self.took += time.perf_counter() - self.t0
        if self.done != self.FIRST_STEPS or self.remaining <= self.FIRST_STEPS:
            return None
        took = self.took
        left = took / self.done * (self.remaining - self.done)
        return (f"estimate: {self.done} steps took {took:.1f}s, so about {_duration(took + left)} for all "
                f"{self.remaining:,} steps, plus validation after each epoch")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _epoch_line(e: EpochLog, pool_label: str = "") -> str:
    v = e.val
    pool = f" ({v['R@1_pool']:.4f} {pool_label or 'with distractors'})" if "R@1_pool" in v else ""
    val = f" val R@1 {v['R@1']:.4f}{pool} FLOPs {v['FLOPs']:.1f}" if v else ""
    return (
        f"epoch {e.epoch}: loss {e.loss:.4f} ce {e.ce:.4f} l1 img/cap {e.l1_img:.1f}/{e.l1_cap:.1f}"
        f" p_c {e.p_c:.2f}{val} ({e.seconds:.1f}s)"
    )


def _progress(enabled: bool):
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        console=Console(stderr=True, log_path=False), transient=False,  # no source file:line per epoch
    )
