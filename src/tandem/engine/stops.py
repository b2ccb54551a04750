"""Where a sequence stops: EOS ids, a stop condition (e.g. stop strings), max tokens, context.

`apply_stops` cuts a round's proposed tokens at the first stop so nothing after it is emitted;
the batching engine commits rounds through it (the cluster router applies stop conditions to
its streams itself, cluster/runtime/router.py).
"""

from tandem.engine.request import GenerationRequest


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
        keep = request.stop_condition.tokens_to_keep(output + emitted)
        if keep is not None:
            return emitted[: max(0, keep - len(output))], "stop"
    return emitted, reason
