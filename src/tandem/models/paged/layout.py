"""Where each token of a fused step goes: built once per step, read by every layer.

A step scores the new tokens of several slots in one forward pass (ragged: each slot its own
number of tokens, positions and cached context). The tokens are laid out flat, slot after slot.
Attention runs per group of slots: the slots with few new tokens (decode and verify rounds)
are padded into one batched call, and each slot with a long chunk (prefill) gets its own call,
so a prefill chunk's padding is never multiplied by the batch.
"""

from dataclasses import dataclass

import torch

from tandem.models.paged.kv_blocks import BlockManager

GROUP_QUERY_LIMIT = 32  # slots with at most this many new tokens share one attention call


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    query_index: torch.Tensor  # [n, queries] flat token index of each (padded) query
    context_rows: torch.Tensor  # [n, context] pool row of each (padded) cached position
    mask: torch.Tensor  # [n, 1, queries, context] True where a query may attend
    token_rows: torch.Tensor  # [real queries] flat token index of each real query
    padded_rows: torch.Tensor  # [real queries] its row in the group's [n * queries] output


@dataclass(frozen=True, slots=True)
class StepLayout:
    positions: torch.Tensor  # [tokens]
    write_rows: torch.Tensor  # [tokens] pool row each new token's key and value go to
    logit_rows: torch.Tensor  # [logits] flat token index of each position whose logits are wanted
    groups: tuple[AttentionGroup, ...]


@dataclass(frozen=True, slots=True)
class SlotSpan:
    slot: int
    start: int  # cached positions before this step
    count: int  # new tokens this step
    offset: int  # index of the first of them in the flat token list


def build_layout(spans: list[SlotSpan], logit_rows: list[int], blocks: BlockManager,
                 device: torch.device) -> StepLayout:
    """spans: the slots of the step, their blocks already made writable for `count` tokens."""
    positions = torch.cat([torch.arange(s.start, s.start + s.count) for s in spans])  # [tokens]
    write_rows = torch.cat([_rows(blocks, s.slot, torch.arange(s.start, s.start + s.count)) for s in spans])
    short = [s for s in spans if s.count <= GROUP_QUERY_LIMIT]
    groups = ([_group(short, blocks)] if short else []) + [_group([s], blocks) for s in spans
                                                           if s.count > GROUP_QUERY_LIMIT]
    logits = torch.tensor(logit_rows, dtype=torch.long, device=device)  # [logits]
    return StepLayout(positions.to(device), write_rows.to(device), logits, tuple(_to(g, device) for g in groups))


def _rows(blocks: BlockManager, slot: int, positions: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(blocks.slots[slot].table, dtype=torch.long)  # [blocks]
    size = blocks.block_size
    return table[positions // size] * size + positions % size


def _group(spans: list[SlotSpan], blocks: BlockManager) -> AttentionGroup:
    queries = max(s.count for s in spans)
    context = max(s.start + s.count for s in spans)
    query_index = torch.zeros(len(spans), queries, dtype=torch.long)
    query_position = torch.zeros(len(spans), queries, dtype=torch.long)  # padded queries see position 0 only
    context_rows = torch.zeros(len(spans), context, dtype=torch.long)
    token_rows, padded_rows = [], []
    for row, s in enumerate(spans):
        length = s.start + s.count
        query_index[row, : s.count] = torch.arange(s.offset, s.offset + s.count)
        query_position[row, : s.count] = torch.arange(s.start, length)
        context_rows[row, :length] = _rows(blocks, s.slot, torch.arange(length))
        token_rows.append(torch.arange(s.offset, s.offset + s.count))
        padded_rows.append(torch.arange(row * queries, row * queries + s.count))
    mask = torch.arange(context)[None, None, :] <= query_position[:, :, None]  # [n, queries, context]
    return AttentionGroup(query_index, context_rows, mask[:, None], torch.cat(token_rows), torch.cat(padded_rows))


def _to(group: AttentionGroup, device: torch.device) -> AttentionGroup:
    return AttentionGroup(*(t.to(device) for t in (group.query_index, group.context_rows, group.mask,
                                                    group.token_rows, group.padded_rows)))
