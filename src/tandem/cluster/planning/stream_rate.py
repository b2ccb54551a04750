"""What one more stream is worth on a verifier replica: the requests per second it adds.

A replica holding n streams like the new one (closed loop: each finished request is followed by
another) spends, per n requests, n prefills of the prompt, each scored alone, and the output's
decode steps, each shared by the n streams:

    rate(n) = n / (n x cost(prompt) + output x cost(n))

from its measured cost curve (cost(m) = one forward over m new tokens). A new sequence goes to
the replica where rate(n + 1) - rate(n) is largest: on a flat (accelerator) curve a stream adds
nearly a whole stream's rate until the batch is large, so the fast replica fills first; on a
compute-bound CPU curve a busy replica gains little from one more stream while an idle one gains
all of it, so even a slow replica gets a stream rather than idle. Where what a stream adds is
about equal (on a perfectly linear curve it is zero on every busy replica), the replica whose
step with one more stream is cheapest takes it: the new stream's tokens come soonest there. (Ranking by the cost of the
step the new sequence would share, as before, balanced step costs instead: with two replicas of
one 3x apart at four streams, 54.5 ms for a fast step of four against 56.3 ms for a slow step of
one decided whether the slow replica got anything at all.)
"""

from collections.abc import Callable
from dataclasses import dataclass

TIE_SHARE = 0.02  # added rates within this share of the best single stream's rate count as equal


def stream_rate(prefill_ms: float, step_ms: Callable[[int], float], streams: int, output_tokens: int) -> float:
    """Requests per second with `streams` such streams (0 for none): `prefill_ms` scores one
    prompt, `step_ms(n)` is a decode step of n streams."""
    if streams <= 0:
        return 0.0
    cycle_ms = streams * prefill_ms + max(1, output_tokens) * step_ms(streams)
    return 1000.0 * streams / cycle_ms if cycle_ms > 0 else float("inf")


def added_rate(prefill_ms: float, step_ms: Callable[[int], float], streams: int, output_tokens: int) -> float:
    """Requests per second one more stream adds to a replica holding `streams`."""
    return (stream_rate(prefill_ms, step_ms, streams + 1, output_tokens)
            - stream_rate(prefill_ms, step_ms, streams, output_tokens))


@dataclass(frozen=True, slots=True)
class Option:
    """One replica that could take the new stream."""

    added: float  # requests per second one more stream adds there (added_rate)
    alone: float  # requests per second of one stream alone there (stream_rate at 1)
    step_ms: float  # its decode step with the new stream


def pick(options: list[Option]) -> int | None:
    """Index of the option to take the new stream; None when there is none. Ties (within
    TIE_SHARE of the best single stream's rate) go to the cheapest step, then the first listed."""
    if not options:
        return None
    best = max(o.added for o in options)
    tolerance = TIE_SHARE * max(o.alone for o in options)
    close = [i for i, o in enumerate(options) if o.added >= best - tolerance]
    return min(close, key=lambda i: (options[i].step_ms, i))


def option(prefill_ms: float, step_ms: Callable[[int], float], streams: int, output_tokens: int) -> Option:
    return Option(added_rate(prefill_ms, step_ms, streams, output_tokens),
                  stream_rate(prefill_ms, step_ms, 1, output_tokens), step_ms(streams + 1))
