"""``d2s-search export-onnx``: build a dense model + sparse head and write the model bundle."""

from __future__ import annotations

from pathlib import Path

import click

from d2s_search import settings
from d2s_search.cli.options import console, json_option
from d2s_search.cli.output import emit_json as _emit_json
from d2s_search.errors import EXIT_OK, HubUnreachableError


@click.command("export-onnx")
@click.option("--model", "model", default=None, help="Dense model: a built-in name, a hub id or a local checkpoint "
              "(default: blip-itm-base-coco, or offline-mini when the hub cannot be reached). See --list-models.")
@click.option("--head", type=click.Path(dir_okay=False, exists=True), help="Trained sparse head checkpoint "
              "(default: untrained head initialised from the vocabulary projection).")
@click.option("--projections", type=click.Path(dir_okay=False, exists=True), help="Fine-tuned projections from "
              "`train --objective joint` (projections.safetensors; use with its --head). The dense vectors change: "
              "images indexed with another bundle must be re-ingested.")
@click.option("--out", type=click.Path(file_okay=False), help="Bundle directory (default: ./d2s-bundles/<model>).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
              help="Weights of the exported graphs: fp32 (parity-checked), fp16, or int8 (dynamic quantisation).")
@click.option("--tolerance", type=float, default=1e-4, show_default=True, help="Max abs difference allowed vs torch (fp32).")
@click.option("--document-shift", type=float, default=None,
              help="Added to the head's vocabulary scores on the image side only: images keep more words than "
                   "queries (more recall, more postings per image). Default: the value training chose "
                   "(`train --flops-budget`); 0 = images and queries alike.")
@click.option("--query-word-boost", type=float, default=None,
              help="Added to the weights of a query's own words in the text graph, so what the user typed is always "
                   "searched. Default: the value training chose; 0 = the head's plain output.")
@click.option("--query-shift", type=float, default=None,
              help="Added to the head's vocabulary scores on the query side (more, fainter expansion terms; the "
                   "strongest stay first). Default: the value training chose; 0 = none.")
@click.option("--document-terms", type=click.IntRange(0, 1_000_000), default=None,
              help="An image keeps at most this many terms, its strongest. Default: the head's (`train "
                   "--document-terms`); 0 = every term the head gives.")
@click.option("--list-models", is_flag=True, help="List the built-in model names and exit.")
@json_option
def export_onnx(model, head, projections, out, precision, tolerance, document_shift, query_word_boost, query_shift,
                document_terms,
                list_models, as_json) -> int:
    """Export a dense image-text model + sparse head to an ONNX model bundle."""
    from d2s_onnx_export.registry import DEFAULT_MODEL, available_models, load_config

    if list_models:
        names = available_models()
        if as_json:
            _emit_json({"models": [{"name": n, "description": load_config(n).get("description", "")} for n in names]})
        else:
            for n in names:
                click.echo(f"{n:24s} {load_config(n).get('description', '')}")
        return EXIT_OK
    explicit = model is not None
    model = model or DEFAULT_MODEL
    config = load_config(model)
    if config.get("hub_id") and not config.get("random_init"):
        from d2s_onnx_export.hub import ensure_hub_reachable

        try:
            ensure_hub_reachable(config["hub_id"])  # before torch and transformers take seconds to import
        except HubUnreachableError:
            from d2s_onnx_export.offline_mini.fallback import (
                OFFLINE_MODEL,
                fallback_note,
                missing_offline_packages,
            )

            if explicit or missing_offline_packages():
                raise  # asked for this model by name, or the offline extra is not installed
            click.echo(fallback_note(f"the Hugging Face hub cannot be reached for {config['hub_id']}"), err=True)
            model, config = OFFLINE_MODEL, load_config(OFFLINE_MODEL)
    from d2s_onnx_export.export import export_bundle

    out_dir = Path(out) if out else Path("d2s-bundles") / Path(model).name.replace("/", "--")
    err = console(stderr=True)
    with err.status(f"exporting {model}") as status:
        result = export_bundle(model, out_dir, head_path=head, precision=precision, tolerance=tolerance,
                               overwrite=True, progress=lambda msg: status.update(msg), projections=projections,
                               document_shift=document_shift, query_word_boost=query_word_boost,
                               document_terms=document_terms, query_shift=query_shift)
    settings.remember_bundle(result.bundle.path)
    summary = result.bundle.summary() | {"parity_max_abs_diff": result.parity, "seconds": round(result.seconds, 2)}
    if as_json:
        _emit_json(summary)
    else:
        worst = max(v for g in result.parity.values() for v in g.values())
        trained = "trained head" if summary["head_trained"] else "untrained head (vocabulary init)"
        click.echo(f"bundle {result.bundle.path}  ({summary['model']}, {trained}, {precision})")
        click.echo(f"  dense dim {summary['dense_dim']}, vocabulary {summary['vocab_size']}, fingerprint {summary['fingerprint']}")
        click.echo(f"  parity vs torch: max abs diff {worst:.1e}  ({result.seconds:.1f}s)")
    return EXIT_OK
