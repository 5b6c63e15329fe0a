"""The ``d2s-search`` command line: the click group, its entry point and the command modules.

Each module here holds one command family and imports only ``cli.options`` / ``cli.output``, never this group.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from d2s_search import settings

# The command modules stay attributes of this package under their own names (a command named like
# its module, e.g. `serve`, must not hide the module).
from d2s_search.cli import align, cluster, doctor, export, index, search, serve, train
from d2s_search.errors import EXIT_OK, EXIT_USAGE, D2SError

_DEBUG = {"on": os.environ.get("D2S_DEBUG") == "1"}


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="d2s-search")
def cli(debug: bool) -> None:
    """Text-to-image search on learned sparse (Dense2Sparse) vectors.

    \b
    d2s-search export-onnx                 # build the model bundle
    d2s-search ingest ./images             # encode and index a folder
    d2s-search query "dogs in a car"       # search it
    """
    if debug:
        _DEBUG["on"] = True


for _command in (export.export_onnx, search.ingest, search.query, index.index, serve.serve, serve.serve_images,
                 cluster.dashboards, cluster.register_model, train.embed, train.train, train.evaluate_cmd,
                 align.align):
    cli.add_command(_command)
cli.add_command(doctor.doctor)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: one-line errors, documented exit codes (0 ok, 1 failed, 2 usage, 3 partial)."""
    try:
        flat = settings.load_config()
        code = cli.main(args=argv, prog_name="d2s-search", standalone_mode=False,
                        default_map=settings.default_map_for(cli, flat))
    except (click.exceptions.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort
        click.echo("interrupted: everything stored so far is kept; run the same command again to continue", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except D2SError as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
