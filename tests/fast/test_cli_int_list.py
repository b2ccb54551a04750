"""The whole-number argparse types: comma-separated lists (bench-step, profile, bench-ceiling) and
single numbers (--threads, --repeats, --k ...)."""

import argparse

import pytest

from tandem.cli.int_list import int_list, whole_number


def test_a_list_keeps_its_order_or_sorts_and_dedupes_when_asked():
    assert int_list()("16,1, 4,") == (16, 1, 4)
    assert int_list(sort=True)("16,1,4,16") == (1, 4, 16)


@pytest.mark.parametrize("bad", ["", " , ", "a,b", "1.5", "0", "-5", "1,40000"])
def test_nonsense_is_a_usage_error_not_a_traceback(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        int_list(1, 32768)(bad)


def test_the_commands_refuse_a_bad_list_with_a_usage_message(capsys):
    from tandem.cli.main import build_parser

    parser = build_parser()
    for command in (["bench-step", "--batches", "1,x"], ["profile", "--sizes", "0"],
                    ["bench-ceiling", "r.json", "--contexts", "a"]):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(command)
        assert exit_info.value.code == 2
        assert "wants" in capsys.readouterr().err
    assert parser.parse_args(["bench-step", "--batches", "1,4"]).batches == (1, 4)
    assert parser.parse_args(["profile", "--model", "m"]).sizes  # the string default is parsed too


def test_one_number_within_its_bounds():
    assert whole_number(0)("0") == 0 and whole_number(1, 64)("64") == 64
    for bad, parse in (("x", whole_number()), ("1.5", whole_number()), ("0", whole_number(1)), ("65", whole_number(0, 64))):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
