"""Where a sequence stops: EOS ids, a stop condition (e.g. stop strings), max tokens, context.

`apply_stops` cuts a round's proposed tokens at the first stop so nothing after it is emitted;
the batching engine commits rounds through it (the cluster router applies stop conditions to
its streams itself, cluster/runtime/router.py).
"""

import numpy as np

from tandem.engine.request import GenerationRequest, StopCondition
from tandem.errors import TandemError, client_message
from tandem.numbers import is_int


class StopConditionError(TandemError):
    """A request's own stop condition raised or answered something other than None or a count:
    that request ends with an error, the others in its step go on."""


def tokens_to_keep(condition: StopCondition, output_ids: list[int]) -> int | None:
    """`condition.tokens_to_keep(output_ids)`, checked: None or a count from 0 to the output's
    length (StopConditionError otherwise, naming what it raised or returned)."""
    try:
        keep = condition.tokens_to_keep(output_ids)
    except Exception as error:  # a library user's callable: anything may come out of it
        raise StopConditionError(f"the request's stop condition raised {type(error).__name__}: "
                                 f"{client_message(error)}") from error
    if keep is None:
        return None
    if isinstance(keep, np.integer):  # numpy's argmax or searchsorted: a count all the same
        keep = int(keep)
    if not is_int(keep) or not 0 <= keep <= len(output_ids):
        raise StopConditionError(f"the request's stop condition returned {keep!r}: it must return None "
                                 f"or how many of the {len(output_ids)} output tokens to keep")
    return keep


def apply_stops(
    emitted: list[int], output: list[int], request: GenerationRequest, context_room: int
) -> tuple[list[int], str | None]:
    """Cut a round's tokens at the first stop. Returns the tokens to emit and why generation
    ends: None (it goes on), "stop" (EOS or a stop condition) or "length" (max tokens or the
    context is used up)."""
    room = min(request.max_tokens - len(output), context_room)
    reason = "length" if len(emitted) >= room else None
    emitted = emitted[:room]
    for i, token in enumerate(emitted):
        if token in request.stop_token_ids:
            emitted, reason = emitted[:i], "stop"  # a stop string may end earlier in the same round
            break
    if request.stop_condition is not None:
        keep = tokens_to_keep(request.stop_condition, output + emitted)
        if keep is not None:
            return emitted[: max(0, keep - len(output))], "stop"
    return emitted, reason
