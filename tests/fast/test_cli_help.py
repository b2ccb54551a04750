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


def test_docs_cli_md_names_every_option_of_every_command():
    """docs/cli.md keeps a section a command (`## `tandem NAME``); each of the command's long
    options (its subcommands' too) is named there, or in the shared "Model options" section."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    heads = [(m.start(), m.group(1)) for m in re.finditer(r"^## (?:`tandem ([a-z-]+)`|Model options)", doc, re.M)]
    sections = {name or "model options": doc[start:(heads[i + 1][0] if i + 1 < len(heads) else len(doc))]
                for i, (start, name) in enumerate(heads)}
    undocumented = []
    for name, parser in commands().items():
        assert name in sections, f"docs/cli.md has no section for `tandem {name}`"
        for option in _long_options(parser):
            if not any(re.search(re.escape(option) + r"(?![\w-])", sections[where]) for where in (name, "model options")):
                undocumented.append(f"tandem {name} {option}")
    assert not undocumented, undocumented


def _long_options(parser: argparse.ArgumentParser) -> list[str]:
    options = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options += _long_options(sub)
        options += [o for o in action.option_strings if o.startswith("--") and o != "--help"]
    return options


def test_the_top_level_says_its_version_its_commands_and_where_options_go(capsys):
    """`tandem --version` and `tandem --foo` said "the following arguments are required: COMMAND",
    and bare `tandem` only that."""
    import pytest

    from tandem import __version__
    from tandem.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"tandem {__version__}\n"
    assert main([]) == 2
    assert "generate" in capsys.readouterr().err  # the help, with its commands
    with pytest.raises(SystemExit) as exit_:
        main(["--foo"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("error: unknown option --foo: a command comes first, its options after it "
                                       "(see tandem --help)\n")


def test_simulate_sizes_help_states_the_sweeps_own_default():
    """It said "1,2,...,64" where the sweep runs powers of two only."""
    from tandem.cluster.sim.scaling import SWEEP_SIZES

    sizes = next(a for a in commands()["simulate"]._actions if "--sizes" in a.option_strings)
    assert f"(default {','.join(map(str, SWEEP_SIZES))})" in sizes.help
