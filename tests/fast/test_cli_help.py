"""`tandem COMMAND --help` says what every option does (several printed a bare name)."""

import argparse

from tandem.cli.main import build_parser


def commands() -> dict[str, argparse.ArgumentParser]:
    actions = build_parser()._actions
    return next(a for a in actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_option_has_help_text():
    bare = [f"{name} {action.option_strings[0]}" for name, parser in commands().items()
            for action in parser._actions if action.option_strings and not action.help]
    assert not bare, bare
