"""`tandem` command line: one subcommand per module; user errors print one line, exit 2."""

import argparse
import contextlib
import errno
import os
import sys

if not sys.stderr.isatty():  # before anything imports tqdm, which reads its defaults then
    # libraries' own bars (transformers converting a GGUF, loading weights) redraw one line with
    # carriage returns into a log; Tandem's bars pass `disable` themselves and say plain lines there
    os.environ.setdefault("TQDM_DISABLE", "1")

from tandem import __version__  # noqa: E402
from tandem.errors import InterruptSaid, TandemError  # noqa: E402
from tandem.sigterm import sigterm_interrupts


class OneLineErrors(argparse.ArgumentParser):
    """argparse with a usage error as one `error:` line (where to find the usage beside it), as
    every other user error prints; exit 2 as argparse does. Options are never abbreviated: argparse
    would take `tandem serve --max-tokens 64` as `--max-tokens-limit 64` without a word."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # subcommands' parsers are built by this class too
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from tandem.cli import (bench_ceiling_cmd, bench_cluster_cmd, bench_cmd, bench_peer_cmd, bench_serve_cmd,
                            bench_step_cmd, generate_cmd, models_cmd, plan_cmd, profile_cmd, serve_cmd, simulate_cmd, soak_cmd)

    parser = OneLineErrors(prog="tandem", description="Lossless speculative decoding.")
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (generate_cmd, serve_cmd, bench_cmd, bench_serve_cmd, bench_peer_cmd, bench_step_cmd, bench_cluster_cmd,
                   bench_ceiling_cmd, models_cmd, profile_cmd, plan_cmd, simulate_cmd, soak_cmd):
        module.register(subparsers)
    parser.commands = subparsers.choices  # so that an unknown option is reported by its command's parser
    return parser


FOLDER_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def folder_error(error: OSError) -> str:
    """What the machine refused; where it struck Tandem's own folder, where that is kept."""
    from pathlib import Path

    from tandem.paths import tandem_home

    where = f": {error.filename}" if error.filename else ""
    home = tandem_home()
    if not error.filename and error.errno == errno.ENOSPC:  # a write, not an open: no file named
        return (f"{error.strerror} while writing an output (--out) or under $TANDEM_HOME (now {home}): free some "
                "space there, or point them at another disk")
    if not error.filename or not Path(os.path.abspath(error.filename)).is_relative_to(os.path.abspath(home)):
        return f"{error.strerror or error}{where}"  # a file the user named (a prompts file, an --out folder)
    return (f"{error.strerror or error}{where} (models, profiles and caches are written under $TANDEM_HOME, "
            f"now {home}: point it at a writable folder with free space)")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.environ.get("TANDEM_HOME"):  # absolute for this process's children (Ray's workers, a bench's servers)
        from tandem.paths import tandem_home

        with contextlib.suppress(TandemError):  # a home that cannot be resolved is said where it is used
            os.environ["TANDEM_HOME"] = str(tandem_home())
    for name in ("stdout", "stderr"):  # started with it closed (`>&-`): Python has None there, and a print raised
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))
    try:
        parser = build_parser()  # imports every command's module: a Ctrl-C lands here as often as anywhere
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    given = sys.argv[1:] if argv is None else argv
    if not given:  # bare `tandem`: what it can do, not a usage error
        parser.print_help(sys.stderr)
        return 2
    if given[0].startswith("-") and given[0] not in ("-h", "--help", "--version"):
        parser.error(f"unknown option {given[0]}: a command comes first, its options after it")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # "see tandem generate --help", not "see tandem --help"
        command = parser.commands[args.command]
        hint = "; the model is --target here (and --draft for the draft model)" \
            if any(arg.split("=")[0] == "--model" for arg in unknown) and _takes(command, "--target") else ""
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    # `tandem serve` keeps SIGTERM's own meaning (uvicorn drains on it, and a second one after the
    # drain, `timeout` passing on its own, must not raise mid-teardown); it interrupts its start only
    interrupts = sigterm_interrupts() if getattr(args, "command", None) != "serve" else contextlib.nullcontext()
    try:
        with interrupts:  # `timeout`, `kill`: as Ctrl-C
            return args.func(args)
    except TandemError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        if not isinstance(interrupt, InterruptSaid):  # the command said what it kept
            print("\ninterrupted", file=sys.stderr)  # a progress bar or streamed text may hold the line
        return 130
    except BrokenPipeError:  # `tandem plan ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe closed
    except OSError as error:  # a read-only or full folder wherever it struck: one line, not a traceback
        if error.errno not in FOLDER_ERRNOS:
            raise
        print(f"error: {folder_error(error)}", file=sys.stderr)
        return 1


def _takes(parser, option: str) -> bool:
    """Whether a command's parser has `option` (vLLM's and llama-server's --model is --target here)."""
    return any(option in action.option_strings for action in parser._actions)


if __name__ == "__main__":
    sys.exit(main())
