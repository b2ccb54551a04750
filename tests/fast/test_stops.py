"""`apply_stops`: where a verified round's tokens are cut."""

from tandem.engine.request import GenerationRequest
from tandem.engine.stops import apply_stops

EOS = 2


class StopAfter:
    """A stop condition that ends the output once it holds `marker` (keeping the marker), like a
    stop string completed by that token."""

    def __init__(self, marker: int):
        self.marker = marker

    def tokens_to_keep(self, output_ids: list[int]) -> int | None:
        return output_ids.index(self.marker) + 1 if self.marker in output_ids else None


def request(**kwargs) -> GenerationRequest:
    return GenerationRequest(prompt_ids=(1,), max_tokens=20, stop_token_ids=frozenset({EOS}), **kwargs)


def test_a_stop_string_before_an_eos_in_the_same_round_cuts_there():
    """The EOS was checked first and returned: a round [stop-string token, more, EOS] committed
    everything up to the EOS, so usage, the KV cache and the n-gram store held tokens past the
    stop (the text, cut again at the edge, hid it)."""
    assert apply_stops([5, 7, 8, EOS, 9], [4], request(stop_condition=StopAfter(7)), 100) == ([5, 7], "stop")
    assert apply_stops([5, 6, EOS, 7], [4], request(stop_condition=StopAfter(7)), 100) == ([5, 6], "stop")
    assert apply_stops([7, EOS], [], request(stop_condition=StopAfter(7)), 100) == ([7], "stop")


def test_eos_max_tokens_and_context_room():
    assert apply_stops([5, EOS, 6], [], request(), 100) == ([5], "stop")
    assert apply_stops([5, 6, 7], [], request(), 100) == ([5, 6, 7], None)
    assert apply_stops([5, 6, 7], [0] * 18, request(), 100) == ([5, 6], "length")  # 20 tokens at most
    assert apply_stops([5, 6, 7], [], request(), 2) == ([5, 6], "length")  # the context's room
    assert apply_stops([5, EOS], [0] * 18, request(), 100) == ([5], "stop")  # EOS inside the room: a stop


class Answering:
    def __init__(self, answer):
        self.answer = answer

    def tokens_to_keep(self, output_ids):
        return self.answer


def test_a_stop_condition_answering_out_of_range_is_an_error_not_a_cut():
    """A count past the output, a negative one or a bool was taken as a cut (-1 dropped the
    round's last token and ended the request as a "stop")."""
    import pytest

    from tandem.engine.stops import StopConditionError

    for answer in (-1, 4, True, 2.0):
        with pytest.raises(StopConditionError, match="returned"):
            apply_stops([5, 6], [4], request(stop_condition=Answering(answer)), 100)
    assert apply_stops([5, 6], [4], request(stop_condition=Answering(3)), 100) == ([5, 6], "stop")
    assert apply_stops([5, 6], [4], request(stop_condition=Answering(0)), 100) == ([], "stop")
    import numpy as np

    assert apply_stops([5, 6], [4], request(stop_condition=Answering(np.int64(2))), 100) == ([5], "stop")


def test_drafts_accepted_past_a_stop_are_not_counted_as_the_answers():
    """A round of 4 accepted drafts cut by a stop after its first token reported 4 accepted for
    one emitted: usage's accepted_tokens exceeded completion_tokens. The drafter's own record
    (the planner's) keeps all 4: they were accepted."""
    import numpy as np

    from tandem.engine.sequence import Sequence
    from tandem.engine.stages import commit_round
    from tandem.speculation.depth import Auto
    from tandem.speculation.drafters.base import SequenceDraft

    class Planner:
        recorded = []

        def record(self, source, k, accepted):
            self.recorded.append((source, k, accepted))

    seq = Sequence("s", request(stop_condition=StopAfter(7)), "ngram", Auto(), np.random.default_rng(0),
                   tokens=[1])
    planner = Planner()
    update, round_report, reason = commit_round(seq, SequenceDraft("ngram3", [7, 8, 9, 10]), [7, 8, 9, 10, 11],
                                                4, planner, 100)
    assert update.token_ids == (7,) and update.accepted == 1 and reason == "stop"
    assert planner.recorded == [("ngram3", 4, 4)] and round_report.accepted == 4
