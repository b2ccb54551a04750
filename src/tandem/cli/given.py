"""Which options a command line named, whatever their values."""

import argparse


class StoreGiven(argparse._StoreAction):
    """argparse's store, which also notes the option's dest in `given_options`: an option
    named with its default value is still given (`tandem serve --cluster F --target <the
    default>` was taken as not given, and served the file's model without a word)."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.given_options = getattr(namespace, "given_options", frozenset()) | {self.dest}


def given_options(args: argparse.Namespace) -> frozenset[str]:
    """The dests named on the command line, of a parser that stores with StoreGiven."""
    return getattr(args, "given_options", frozenset())
