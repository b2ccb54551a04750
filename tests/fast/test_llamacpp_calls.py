"""How the llama.cpp runner lays a forward's items out in llama_decode calls (`plan_calls`): no
call reaching the flash kernel's tile holds short verify rounds of several slots, and every
position is scored once, in order."""

import random

import pytest

from tandem.models.batch_runner import BatchItem
from tandem.models.llamacpp_batch_runner import FEW_ROWS, FLASH_TILE_ROWS, _runs, plan_calls


def slots_per_call(calls) -> list[set[int]]:
    return [{item.slot for _, item, _ in call} for call in calls]


def test_sixteen_verify_rounds_go_in_calls_below_the_tile():
    items = [BatchItem(slot, [1, 2, 3, 4], 4) for slot in range(16)]  # 64 positions
    calls = plan_calls(items, 512, 272)
    assert [len(call) for call in calls] == [FLASH_TILE_ROWS - 1, 1]


def test_a_forward_below_the_tile_is_one_call():
    items = [BatchItem(slot, [7], 1) for slot in range(16)] + [BatchItem(16, list(range(40)), 0)]
    assert len(plan_calls(items, 512, 272)) == 1


def test_longer_items_of_several_slots_share_a_call():
    items = [BatchItem(slot, list(range(16)), 16) for slot in range(16)]  # 256 positions, 4 slots a tile
    assert [len(call) for call in plan_calls(items, 512, 272)] == [256]


def test_a_long_prompt_chunk_is_scored_apart_from_the_rounds():
    rounds = [BatchItem(slot, [7], 1) for slot in range(16)]
    chunk = BatchItem(16, list(range(300)), 0)
    calls = plan_calls(rounds[:8] + [chunk] + rounds[8:], 512, 272)
    assert slots_per_call(calls) == [set(range(16)), {16}]
    assert [i for _, _, i in calls[1]] == list(range(300))


def test_one_sequence_alone_keeps_its_big_calls():
    calls = plan_calls([BatchItem(0, list(range(600)), 1)], 512, 17)
    assert [len(call) for call in calls] == [512, 88]


def test_every_position_once_in_order_within_every_limit():
    rng = random.Random(5)
    for _ in range(200):
        items = [BatchItem(slot, [0] * rng.choice([1, 3, 17, 63, 64, 200, 700]), 0)
                 for slot in range(rng.randint(1, 12))]
        items = [BatchItem(item.slot, item.token_ids, rng.randint(0, min(17, len(item.token_ids))))
                 for item in items]
        max_tokens, max_outputs = rng.choice([(512, 17), (512, 136), (96, 40)])
        calls = plan_calls(items, max_tokens, max_outputs)
        for call in calls:
            assert 0 < len(call) <= max_tokens
            assert sum(i >= len(item.token_ids) - item.num_logits for _, item, i in call) <= max_outputs
            if len(call) >= FLASH_TILE_ROWS:
                assert all(len(item.token_ids) >= FEW_ROWS for _, item, _ in call)
        for index, item in enumerate(items):
            scored = [i for call in calls for j, _, i in call if j == index]
            assert scored == list(range(len(item.token_ids)))


def test_an_item_asking_more_logits_than_it_has_tokens_is_refused():
    """Such rows were never scored: a runner would hand back whatever its buffer held."""
    with pytest.raises(ValueError, match="3 logits asked of 2 tokens"):
        BatchItem(0, (5, 6), 3)
    with pytest.raises(ValueError):
        BatchItem(0, (5,), -1)
    assert BatchItem(0, (5, 6), 2).num_logits == 2


def test_rows_are_grouped_into_each_items_runs():
    """A call's flagged rows, by owner: the views handed over are these runs' slices."""
    assert _runs([]) == []
    assert _runs([0, 0, 0, 1, 2, 2]) == [(0, 0, 3), (1, 3, 1), (2, 4, 2)]
    assert _runs([3, 1, 3]) == [(3, 0, 1), (1, 1, 1), (3, 2, 1)]
