"""The incremental detokenizer, TextStream and StopStrings against slow references that decode the
whole output every time, on a byte-level BPE tokenizer trained here (no downloads, ~50 ms)."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tandem.text.detokenizer import REPLACEMENT, IncrementalDetokenizer
from tandem.text.stop_strings import StopStrings
from tandem.text.stream import TextStream

ALPHABET = [*"abcdefgh ijk lmn.,!?\n", *"éüñçàø", "e\u0301", "a\u0308", "\u0301", *"中文字日本語한국",
            "😀", "🚀", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧", "\ufffd"]
EOS = "<eos>"


def random_text(rng: random.Random, max_symbols: int = 40) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, max_symbols)))


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(0)
    tokenizer.train_from_iterator([random_text(rng) for _ in range(400)], trainer)
    return tokenizer


@pytest.fixture(scope="module")
def decode(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def byte_token(tokenizer: Tokenizer, byte: int) -> int:
    """The id of the one-byte token (byte-level BPE shows bytes as printable characters)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    if byte in printable:
        return tokenizer.token_to_id(chr(byte))
    return tokenizer.token_to_id(chr(256 + sorted(set(range(256)) - set(printable)).index(byte)))


# ---- slow references: decode everything, every time (the algorithms the fast paths replaced) ----

def cut_at_stop(text: str, strings: list[str]) -> str:
    cut = min((text.find(s) for s in strings if s in text), default=len(text))
    return text[:cut]


def held_back(text: str, strings: list[str]) -> int:
    return max((n for s in strings for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


class ReferenceTextStream:
    def __init__(self, decode, stop_strings: list[str]):
        self.decode, self.stops, self.ids, self.sent = decode, stop_strings, [], 0

    def push(self, new_ids: list[int]) -> str:
        self.ids += new_ids
        text = cut_at_stop(self.decode(self.ids), self.stops)
        if text.endswith(REPLACEMENT):
            return ""
        return self._emit(text[: len(text) - held_back(text, self.stops)])

    def finish(self) -> str:
        return self._emit(cut_at_stop(self.decode(self.ids), self.stops))

    def _emit(self, text: str) -> str:
        delta, self.sent = text[self.sent :], max(self.sent, len(text))
        return delta


def reference_tokens_to_keep(decode, ids: list[int], stops: list[str]) -> int | None:
    return next((end for end in range(1, len(ids) + 1) if any(s in decode(ids[:end]) for s in stops)), None)


# ---- inputs ----

def text_ids(tokenizer, rng) -> list[int]:
    return tokenizer.encode(random_text(rng, 60)).ids


def random_ids(tokenizer, rng) -> list[int]:
    return [rng.randrange(tokenizer.get_vocab_size()) for _ in range(rng.randrange(1, 60))]


def garbage_ids(tokenizer, rng) -> list[int]:
    """Runs of lead, continuation and invalid bytes, EOS and text: the undecodable corners."""
    pieces = [[byte_token(tokenizer, 0xE4)] * rng.randrange(1, 20), [byte_token(tokenizer, 0xB8)] * 3,
              [byte_token(tokenizer, 0xEF), byte_token(tokenizer, 0xBF)], [byte_token(tokenizer, 0xFF)],
              [tokenizer.token_to_id(EOS)] * rng.randrange(1, 12), text_ids(tokenizer, rng)]
    return [token for _ in range(rng.randrange(1, 8)) for token in rng.choice(pieces)]


def cases(tokenizer, count: int, seed: int):
    rng = random.Random(seed)
    for i in range(count):
        make = (text_ids, random_ids, garbage_ids)[i % 3]
        yield make is text_ids, make(tokenizer, rng), rng


def chunked(ids: list[int], rng: random.Random) -> list[list[int]]:
    chunks, start = [], 0
    while start < len(ids):
        size = rng.choice([1, 1, 2, 3, 5, 9])
        chunks.append(ids[start : start + size])
        start += size
    return chunks


def stop_strings_for(text: str, rng: random.Random) -> list[str]:
    """Substrings of the text (so they occur, often across token boundaries) and misses."""
    stops = [rng.choice(["zz", "中x", "🚀🚀🚀", "e\u0301."])]
    for _ in range(rng.randrange(0, 3)):
        start = rng.randrange(max(1, len(text)))
        stops.append(text[start : start + rng.randrange(1, 6)].replace(REPLACEMENT, ""))
    return [s for s in stops if s]


# ---- tests ----

def test_deltas_concatenate_to_the_whole_decode(tokenizer, decode):
    for _, ids, rng in cases(tokenizer, 900, seed=1):
        detokenizer, shown = IncrementalDetokenizer(decode), ""
        for chunk in chunked(ids, rng):
            delta = detokenizer.push(chunk)
            assert not delta.endswith(REPLACEMENT)
            shown += delta
            assert shown == decode(detokenizer.ids).rstrip(REPLACEMENT), ids
        assert shown + detokenizer.flush() == decode(ids), ids  # a cut character ends in U+FFFD


def test_valid_text_never_shows_a_replacement_character(tokenizer, decode):
    rng = random.Random(2)
    for _ in range(300):
        text = random_text(rng, 60).replace(REPLACEMENT, "")
        detokenizer = IncrementalDetokenizer(decode)
        deltas = [detokenizer.push(chunk) for chunk in chunked(tokenizer.encode(text).ids, rng)]
        assert all(REPLACEMENT not in delta for delta in deltas)
        assert "".join(deltas) == text


def spans_tokens(stop: str, ids: list[int], decode) -> bool:
    """Whether the stop string occurs in the text but in no single token's text."""
    return stop in decode(ids) and not any(stop in decode([token]) for token in ids)


def test_text_stream_equals_the_reference(tokenizer, decode):
    spanning, multi_byte_spanning = 0, 0
    for _, ids, rng in cases(tokenizer, 900, seed=3):
        stops = stop_strings_for(decode(ids), rng)
        spanning += any(spans_tokens(s, ids, decode) for s in stops)
        multi_byte_spanning += any(spans_tokens(s, ids, decode) and not s.isascii() for s in stops)
        ids = ids[: reference_tokens_to_keep(decode, ids, stops)]  # where the engine stops
        stream, reference = TextStream(decode, stops), ReferenceTextStream(decode, stops)
        shown = expected = ""
        for chunk in chunked(ids, rng):
            shown += stream.push(chunk)
            expected += reference.push(chunk)
            assert shown.startswith(expected), (ids, stops)  # never later than the reference
        shown += stream.finish()
        assert shown == expected + reference.finish(), (ids, stops)
        assert shown == cut_at_stop(decode(ids), stops)
    assert spanning > 250 and multi_byte_spanning > 200, (spanning, multi_byte_spanning)


def test_text_stream_ends_at_the_first_stop_string(tokenizer, decode):
    stream = TextStream(decode, ["bc", "abcd", "文字"])
    assert stream.push(tokenizer.encode("x ab").ids) == "x "  # "ab" may begin "abcd"
    assert stream.push(tokenizer.encode("c").ids) == "a"
    assert stream.push(tokenizer.encode("d more").ids) == ""
    assert stream.finish() == ""
    stream = TextStream(decode, ["文字"])
    ids = tokenizer.encode("中文字").ids
    assert "".join(stream.push([token]) for token in ids) + stream.finish() == "中"


def test_an_output_cut_inside_a_character_ends_in_a_replacement_character(tokenizer, decode):
    ids = tokenizer.encode("ok").ids + [byte_token(tokenizer, 0xE4)]  # 中 is E4 B8 AD
    stream = TextStream(decode, [])
    assert "".join(stream.push([token]) for token in ids) == "ok"  # held: more bytes may come
    assert stream.finish() == REPLACEMENT  # the cap came first: shown as decoding shows it


def test_a_stop_string_is_not_completed_by_the_replacement_character_of_a_cut(tokenizer, decode):
    """A user's stop "\ufffd" emptied an answer cut inside a character by max_tokens, finished
    by its length: the model wrote no such character; the cap cut one."""
    ids = tokenizer.encode("ok").ids + [byte_token(tokenizer, 0xE4)]
    for stops in ([REPLACEMENT], ["k" + REPLACEMENT]):
        stream = TextStream(decode, stops)
        shown = "".join(stream.push([token]) for token in ids) + stream.finish()
        assert shown == "ok" + REPLACEMENT and not stream.stopped, stops
    stream = TextStream(decode, ["ok"])
    assert "".join(stream.push([token]) for token in ids) + stream.finish() == "" and stream.stopped


def test_stop_strings_equal_the_reference(tokenizer, decode):
    for _, ids, rng in cases(tokenizer, 900, seed=4):
        stops = stop_strings_for(decode(ids), rng)
        expected = reference_tokens_to_keep(decode, ids, stops)
        condition, output = StopStrings(decode, stops), []
        for chunk in chunked(ids, rng):  # the engine: the output so far plus a round's tokens
            keep = condition.tokens_to_keep(output + chunk)
            if keep is not None:
                break
            output += chunk
        assert keep == expected, (ids, stops)
        assert condition.tokens_to_keep(ids) == expected  # the same output again, extended
        if expected is not None:  # a shorter, different list starts over
            assert condition.tokens_to_keep(ids[: expected - 1]) is None


def test_stop_strings_start_over_on_a_new_output(tokenizer, decode):
    first, second = tokenizer.encode("abc 中文字 def").ids, tokenizer.encode("xyz 中文 abc").ids
    condition = StopStrings(decode, ["中文字", "abc"])
    assert condition.tokens_to_keep(first) == reference_tokens_to_keep(decode, first, ["中文字", "abc"])
    assert condition.tokens_to_keep(second) == reference_tokens_to_keep(decode, second, ["中文字", "abc"])
    assert StopStrings(decode, []).tokens_to_keep(first) is None


def counting(decode):
    """A decode that counts the token ids it is given."""
    def counted(ids):
        counted.ids += len(ids)
        return decode(ids)
    counted.ids = 0
    return counted


@pytest.mark.parametrize("output", ["text", "lead bytes", "random ids"])
def test_decoding_work_is_linear(tokenizer, decode, output):
    rng = random.Random(5)
    ids = {"text": [t for _ in range(200) for t in text_ids(tokenizer, rng)],
           "lead bytes": [byte_token(tokenizer, 0xE4)] * 2000,
           "random ids": [rng.randrange(tokenizer.get_vocab_size()) for _ in range(2000)]}[output][:2000]
    assert len(ids) == 2000
    stream_decode, stops_decode = counting(decode), counting(decode)
    stream, condition = TextStream(stream_decode, ["never here"]), StopStrings(stops_decode, ["never here"])
    for end in range(1, len(ids) + 1):
        stream.push(ids[end - 1 : end])
        assert condition.tokens_to_keep(ids[:end]) is None
    stream.finish()
    assert stream_decode.ids < 20 * len(ids)
    assert stops_decode.ids < 20 * len(ids)
