"""`tandem` command line: one subcommand per module; user errors print one line, exit 2."""

import argparse
import os
import signal
import sys
import threading

from tandem.errors import TandemError


class OneLineErrors(argparse.ArgumentParser):
    """argparse with a usage error as one `error:` line (where to find the usage beside it), as
    every other user error prints; exit 2 as argparse does."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from tandem.cli import (bench_ceiling_cmd, bench_cluster_cmd, bench_cmd, bench_peer_cmd, bench_serve_cmd,
                            bench_step_cmd, generate_cmd, models_cmd, plan_cmd, profile_cmd, serve_cmd, simulate_cmd, soak_cmd)

    parser = OneLineErrors(prog="tandem", description="Lossless speculative decoding.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (generate_cmd, serve_cmd, bench_cmd, bench_serve_cmd, bench_peer_cmd, bench_step_cmd, bench_cluster_cmd,
                   bench_ceiling_cmd, models_cmd, profile_cmd, plan_cmd, simulate_cmd, soak_cmd):
        module.register(subparsers)
    parser.commands = subparsers.choices  # so that an unknown option is reported by its command's parser
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # "see tandem generate --help", not "see tandem --help"
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    # where handlers may be set; `tandem serve` keeps SIGTERM's own meaning (uvicorn drains on it,
    # and a second one after the drain, `timeout` passing on its own, must not raise mid-teardown)
    interrupts = threading.current_thread() is threading.main_thread() and getattr(args, "command", None) != "serve"
    previous = signal.signal(signal.SIGTERM, _interrupt) if interrupts else None  # `timeout`, `kill`: as Ctrl-C
    try:
        return args.func(args)
    except TandemError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)  # a progress bar or streamed text may hold the line
        return 130
    except BrokenPipeError:  # `tandem plan ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe closed
    finally:
        if interrupts:  # None: a handler set outside Python, which only the default can stand for
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _interrupt(signum, frame) -> None:
    """SIGTERM as a KeyboardInterrupt: the servers a bench started are stopped on the way out (the
    default action ended the process at once, and a peer server could outlive it). `tandem
    serve` is left out: SIGTERM drains it."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
