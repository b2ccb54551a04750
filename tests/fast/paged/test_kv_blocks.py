"""Block bookkeeping of the paged KV cache: allocation, rollback, prefix sharing, copy-on-write,
a full pool, and no leaks after random work."""

import random

import pytest

from tandem.models.paged.kv_blocks import BlockManager, KvPoolFullError


def _write(blocks: BlockManager, slot: int, count: int) -> list[tuple[int, int]]:
    copies = blocks.prepare_write(slot, count)
    blocks.advance(slot, count)
    return copies


def test_a_write_allocates_whole_blocks_and_rows_follow_the_table():
    blocks = BlockManager(num_blocks=8, block_size=4, num_slots=2)
    _write(blocks, 0, 6)
    assert len(blocks.slots[0].table) == 2 and blocks.num_free == 6
    table = blocks.slots[0].table
    assert blocks.rows(0, 0, 6) == [table[0] * 4 + i for i in range(4)] + [table[1] * 4, table[1] * 4 + 1]


def test_rollback_moves_the_length_and_frees_only_whole_blocks_past_it():
    blocks = BlockManager(num_blocks=8, block_size=4, num_slots=1)
    _write(blocks, 0, 10)  # 3 blocks
    kept = blocks.slots[0].table[:2]
    blocks.rollback(0, 5)
    assert blocks.length(0) == 5 and blocks.slots[0].table == kept and blocks.num_free == 6
    blocks.rollback(0, 0)
    assert blocks.num_free == 8 and blocks.slots[0].table == []


def test_shared_prefix_references_blocks_and_copies_on_write():
    blocks = BlockManager(num_blocks=8, block_size=4, num_slots=2)
    _write(blocks, 0, 6)
    blocks.share_prefix(0, 1, 6)
    assert blocks.slots[1].table == blocks.slots[0].table and blocks.num_free == 6
    partial = blocks.slots[0].table[1]
    copies = _write(blocks, 1, 1)  # appending into the shared, partly filled second block
    assert len(copies) == 1 and copies[0][0] == partial
    assert blocks.slots[1].table[0] == blocks.slots[0].table[0]  # the full block stays shared
    assert blocks.slots[1].table[1] != partial and blocks.refs[partial] == 1
    assert _write(blocks, 0, 1) == []  # the source owns its block alone again


def test_the_source_copies_too_when_it_rewrites_a_block_it_shares():
    blocks = BlockManager(num_blocks=8, block_size=4, num_slots=2)
    _write(blocks, 0, 8)
    blocks.share_prefix(0, 1, 8)
    blocks.rollback(0, 3)  # the source backs into the first shared block
    copies = _write(blocks, 0, 2)
    assert copies and copies[0][0] == blocks.slots[1].table[0]  # slot 1's positions 0..7 stay intact


def test_a_full_pool_raises_before_changing_anything():
    blocks = BlockManager(num_blocks=2, block_size=4, num_slots=2)
    _write(blocks, 0, 8)
    with pytest.raises(KvPoolFullError, match="KV pool is full"):
        blocks.check_free(blocks.blocks_needed(1, 1))
    assert blocks.slots[1].table == [] and blocks.num_free == 0


def test_blocks_needed_counts_growth_and_copies():
    blocks = BlockManager(num_blocks=16, block_size=4, num_slots=2)
    _write(blocks, 0, 6)
    blocks.share_prefix(0, 1, 6)
    assert blocks.blocks_needed(1, 1) == 1  # copy of the shared partial block
    assert blocks.blocks_needed(1, 3) == 2  # that copy and one new block
    before = blocks.num_free
    _write(blocks, 1, 3)
    assert before - blocks.num_free == 2


def test_no_block_leaks_after_random_work():
    rng = random.Random(7)
    blocks = BlockManager(num_blocks=64, block_size=4, num_slots=6)
    for _ in range(2000):
        slot = rng.randrange(6)
        action = rng.random()
        if action < 0.5:
            count = rng.randint(1, 9)
            if blocks.blocks_needed(slot, count) <= blocks.num_free:
                _write(blocks, slot, count)
        elif action < 0.8:
            blocks.rollback(slot, rng.randint(0, blocks.length(slot)))
        else:
            source = rng.randrange(6)
            if source != slot:
                blocks.share_prefix(source, slot, rng.randint(0, blocks.length(source)))
        in_use = {b for s in blocks.slots for b in s.table}
        assert blocks.num_free + len(in_use) == 64
        assert all(blocks.refs[b] == sum(s.table.count(b) for s in blocks.slots) for b in in_use)
    for slot in range(6):
        blocks.rollback(slot, 0)
    assert blocks.num_free == 64 and not any(blocks.refs)
