"""The ``d2s-search`` command line: the click group, its entry point and the command modules.

Each module here holds one command family and imports only ``cli.options`` / ``cli.output``, never this group.
The group imports a command's module only when that command runs (``cli.lazy``): a one-query
process does not pay for the others.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from d2s_search import redact, settings
from d2s_search.cli.lazy import LazyGroup
from d2s_search.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, D2SError

# Command name -> "module:attribute" under d2s_search.cli, imported when the command is used.
# Nothing binds a command to this package's namespace, so a command named like its module
# (e.g. `serve`) never hides the module.
COMMANDS = {
    "export-onnx": "export:export_onnx",
    "ingest": "search:ingest",
    "query": "search:query",
    "index": "index:index",
    "serve": "serve:serve",
    "serve-images": "serve:serve_images",
    "dashboards": "cluster:dashboards",
    "register-model": "cluster:register_model",
    "embed": "train:embed",
    "train": "train:train",
    "evaluate": "train:evaluate_cmd",
    "align": "align:align",
    "kibana": "kibana:kibana",
    "doctor": "doctor:doctor",
}

_DEBUG = {"on": os.environ.get("D2S_DEBUG") == "1"}
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click 8.2+


@click.group(cls=LazyGroup, package=__name__, lazy_commands=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="d2s-search")
def cli(debug: bool) -> None:
    """Text-to-image search on learned sparse (Dense2Sparse) vectors.

    \b
    d2s-search export-onnx                 # build the model bundle
    d2s-search ingest ./images             # encode and index a folder
    d2s-search query "dogs in a car"       # search it
    d2s-search serve                       # the search page at http://127.0.0.1:8000/

    Exit codes: 0 ok, 1 failed, 2 usage, 3 partial (some inputs rejected, the rest stored).
    """
    if debug:
        _DEBUG["on"] = True



def main(argv: list[str] | None = None) -> None:
    """Run the CLI: one-line errors, documented exit codes (0 ok, 1 failed, 2 usage, 3 partial).

    With ``--json`` an error is a JSON object on stdout, ``{"error": {"type", "message"}}``,
    with the same exit code.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    _DEBUG["on"] = os.environ.get("D2S_DEBUG") == "1"  # --debug of an earlier call in this process ends with it
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        flat = settings.load_config()
        code = cli.main(args=args, prog_name="d2s-search", standalone_mode=False,
                        default_map=settings.default_map_for(cli, flat))
    except KeyboardInterrupt:
        _interrupted()
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
            _interrupted()
        _fail("Aborted", "aborted: nothing was changed", EXIT_FAILED, as_json)  # e.g. a declined prompt
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        code = exc.exit_code if exc.exit_code else EXIT_USAGE
        if isinstance(exc, _NO_ARGS_IS_HELP) and not as_json:
            exc.show()  # a group called alone: its help, which lists what it can do
            sys.exit(code)
        _fail(type(exc).__name__, _usage_line(exc, args, as_json), code, as_json)
    except D2SError as exc:
        if _DEBUG["on"]:
            _print_traceback()
        _fail(type(exc).__name__, redact.scrub(str(exc)), exc.exit_code, as_json)  # server text may carry secrets
    except Exception as exc:  # nobody foresaw it: still one line (and no secret), the traceback with --debug
        if _DEBUG["on"]:
            _print_traceback()
        hint = "" if _DEBUG["on"] else " (run with --debug for the traceback)"
        _fail(type(exc).__name__, f"unexpected {type(exc).__name__}: {redact.scrub(str(exc))}{hint}", EXIT_FAILED,
              as_json)
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def _usage_line(exc: click.ClickException, args: list[str], as_json: bool) -> str:
    """click's error as one line (click shows usage, a hint and the error on four); a usage
    error names the command's help instead of repeating its usage."""
    message = " ".join(exc.format_message().split())
    if isinstance(exc, click.UsageError) and not as_json:
        ctx = exc.ctx  # the parser's own errors (an option without its value) come without one
        message += f" (see `{ctx.command_path if ctx is not None else _command_path(args)} --help`)"
    return message


def _command_path(args: list[str]) -> str:
    """``d2s-search`` and the (sub)command names that lead ``args``."""
    path, command = ["d2s-search"], cli
    for arg in args:
        if arg.startswith("-"):
            continue
        if not isinstance(command, click.Group) or arg not in command.commands:
            break
        path.append(arg)
        command = command.commands[arg]
    return " ".join(path)


def _print_traceback() -> None:
    """The current exception's traceback through the same nets as messages: credentials (a
    server's error text, an echoed Authorization header) masked, control characters escaped."""
    from d2s_search.pathtext import shown

    for line in traceback.format_exc().splitlines():
        click.echo(shown(redact.scrub(line)), err=True)


def _interrupted() -> None:
    click.echo("interrupted: everything stored so far is kept; run the same command again to continue", err=True)
    sys.exit(130)


def _fail(kind: str, message: str, code: int, as_json: bool) -> None:
    from d2s_search.cli.output import echo_line, json_text

    if as_json:
        click.echo(json_text({"error": {"type": kind, "message": message}}, indent=None))
    else:
        echo_line(f"error: {message}", err=True)  # a file name in it cannot drive the terminal
    sys.exit(code)
