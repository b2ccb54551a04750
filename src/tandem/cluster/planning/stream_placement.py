"""Which verifier replica takes a new stream: the one whose step with it costs least, unless a
replica would otherwise sit idle and one stream there is worth more than one more stream on the
cheapest one.

The step rule (least expected completion: each of the new sequence's tokens costs one step of
the batch it joins) fills a fast flat-curve device before a slow one gets anything, and on
compute-bound curves spreads streams until their steps cost the same. Its weak spot is a slow
replica left idle: with two CPU replicas 3x apart and four streams, the fast replica's step of
four (54.5 ms on one profile) against the slow one's step of one (56.3 ms) decided whether the
slow replica got any work at all.

So an idle replica is also priced by throughput. A replica holding n streams like the new one
(closed loop: each finished request is followed by another) spends, per n requests, n prefills
of the prompt, each scored alone, and the output's decode steps, each shared by the n streams:

    rate(n) = n / (n x cost(prompt) + output x cost(n))    requests per second

from its cost curve (cost(m) = one forward over m new tokens). An idle replica takes the stream
where rate(1) there exceeds rate(n + 1) - rate(n) on the cheapest-step replica. Only idle
replicas are priced this way: pricing every replica by added rate (tried, commit c7a54bd) gave a
slow replica a second stream at eight streams, and its last requests then outlasted the fast
replica's (0.82x of the solo sum against 0.94x).
"""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replica with a free slot, as the placement sees it."""

    streams: int  # sequences it holds (running, or placed and about to prefill)
    prefill_ms: float  # its forward over the new sequence's prompt alone
    step_ms: Callable[[int], float]  # its decode step of n streams (one token each)


def stream_rate(c: Candidate, streams: int, output_tokens: int) -> float:
    """Requests per second the replica serves with `streams` streams like the new one."""
    if streams <= 0:
        return 0.0
    cycle_ms = streams * c.prefill_ms + max(1, output_tokens) * c.step_ms(streams)
    return 1000.0 * streams / cycle_ms if cycle_ms > 0 else float("inf")


def added_rate(c: Candidate, output_tokens: int) -> float:
    """Requests per second one more stream adds to the replica."""
    return stream_rate(c, c.streams + 1, output_tokens) - stream_rate(c, c.streams, output_tokens)


def choose(candidates: list[Candidate], output_tokens: int) -> int | None:
    """Index of the candidate to take the new stream; None when there is none. The cheapest
    step wins (ties: the first listed), unless an idle candidate's one stream serves more
    requests per second than one more stream adds to it (then the best such idle one)."""
    if not candidates:
        return None
    cheapest = min(range(len(candidates)), key=lambda i: (candidates[i].step_ms(candidates[i].streams + 1), i))
    idle = [i for i, c in enumerate(candidates) if c.streams == 0 and i != cheapest]
    if not idle:
        return cheapest
    alone = {i: stream_rate(candidates[i], 1, output_tokens) for i in idle}
    best_idle = max(idle, key=lambda i: (alone[i], -i))
    return best_idle if alone[best_idle] > added_rate(candidates[cheapest], output_tokens) else cheapest
