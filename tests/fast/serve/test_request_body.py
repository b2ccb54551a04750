"""The request body's parsing and the log of ignored fields, without a server."""

import logging

import pytest

from tandem.serve.api.body import MAX_IGNORED_NAMES_A_REQUEST, MAX_IGNORED_NAMES_REMEMBERED, _say_ignored, parse_json_object
from tandem.serve.api.errors import APIError
from tandem.serve.api.protocol import CompletionRequest


@pytest.mark.parametrize("raw, says", [
    (b"null", "got null"), (b"1.5", "got a number"), (b"true", "got a boolean"), (b"[1]", "got an array"),
    (b'"x"', "got a string"),
    (b'{"a": ' + b"1" * 5000 + b"}", "integer of more than 4,300 digits"),
    (b"[" * 10_000 + b"]" * 10_000, "deeper than 32 levels"),  # the parser's own recursion limit
    (b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", "deeper than 32 levels"),
])
def test_a_body_that_is_no_request_says_so_in_json_terms(raw, says):
    """Python's names (`NoneType`) and advice for its own settings (`sys.set_int_max_str_digits`)
    reached clients."""
    with pytest.raises(APIError) as raised:
        parse_json_object(raw)
    assert raised.value.status == 400 and says in raised.value.message
    assert "NoneType" not in raised.value.message and "sys." not in raised.value.message


def said_names(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "unknown request field" in r.getMessage()]


def test_one_request_cannot_silence_the_log_of_unknown_fields(caplog):
    """A request with 70 unknown fields used up the names the log would ever say: a later
    misspelt `temprature` went unsaid for the server's whole life."""
    caplog.set_level(logging.WARNING, logger="tandem.serve.api.body")
    said: dict[str, None] = {}
    junk = {f"junk{i}": 1 for i in range(70)}
    for _ in range(20):  # the same 70 names, again and again: a few lines a request, at most
        caplog.clear()
        _say_ignored(junk | {"prompt": "x"}, CompletionRequest, said)
        assert len(said_names(caplog)) <= MAX_IGNORED_NAMES_A_REQUEST and len(caplog.records) <= 5
        assert len(said) <= MAX_IGNORED_NAMES_REMEMBERED
    caplog.clear()
    _say_ignored({"temprature": 0.5, next(reversed(said)): 1}, CompletionRequest, said)  # the latest junk said
    assert len(said_names(caplog)) == 1 and "'temprature'" in said_names(caplog)[0]
    caplog.clear()
    _say_ignored({"temprature": 0.5}, CompletionRequest, said)  # remembered: said once
    assert said_names(caplog) == [] and len(said) == MAX_IGNORED_NAMES_REMEMBERED


def test_a_misspelt_field_behind_four_others_is_said_by_the_next_request(caplog):
    """Names past a request's first four were remembered as said, never named: a client always
    sending a, b, c, d and `temprature` never had the misspelling logged."""
    caplog.set_level(logging.WARNING, logger="tandem.serve.api.body")
    said: dict[str, None] = {}
    body = {"a": 1, "b": 1, "c": 1, "d": 1, "temprature": 0.5, "prompt": "x"}
    _say_ignored(body, CompletionRequest, said)
    _say_ignored(body, CompletionRequest, said)
    assert any("'temprature'" in m for m in said_names(caplog))
    assert any("1 more unknown field on" in r.getMessage() for r in caplog.records)
    assert list(said) == ["a", "b", "c", "d", "temprature"]


def test_remembered_names_are_cut_as_logged():
    said: dict[str, None] = {}
    _say_ignored({"x" * 100_000: 1, "prompt": "x"}, CompletionRequest, said)
    assert list(said) == ["x" * 64]


def test_a_misspelt_stream_option_is_said_too(caplog):
    caplog.set_level(logging.WARNING, logger="tandem.serve.api.body")
    _say_ignored({"prompt": "x", "stream_options": {"include_usge": True, "include_usage": True,
                                                     "include_obfuscation": False}}, CompletionRequest, {})
    assert len(said_names(caplog)) == 1 and "'stream_options.include_usge'" in said_names(caplog)[0]
