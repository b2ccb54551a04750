"""Suffix counts for suffix drafting: every run of at most `depth` consecutive tokens of the text
added so far, as a trie whose nodes count how often their run occurred.

The node of a run knows which tokens followed it and how often, so the continuation of a context
is found by matching the context's longest suffix that occurred before, then following the most
frequent next token while its share of what followed stays high: a variable-length proposal with
a frequency-based confidence (the idea of ArcticInference's suffix decoding, over a bounded-depth
trie instead of a full suffix tree).

Two uses: `SuffixIndex` over recent requests' outputs, shared across requests, with a bound on the
tokens it holds (the oldest sequence's counts are taken back out first); and `GrowingSuffixIndex`
over one request's prompt and output, extended one committed token at a time, which answers as
the trie of its runs would from the text and its positions alone (a trie costs ~16 nodes a
token, too dear for a whole prompt at every request's first draft offer).
"""

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_DEPTH = 16  # longest run counted: match length + continuation length
MAX_MATCH = 12  # longest context suffix looked up
MIN_SHARE = 0.3  # a continuation stops at a token followed less often than this, of its node's count


class Node:
    """A run's count and the tokens that followed it. Most nodes have one follower (a run seen
    once continues one way), so the first follower is held inline and a dict is made only where
    the runs branch: about 70 bytes a node instead of about 270 with a dict each."""

    __slots__ = ("count", "token", "next", "more")

    def __init__(self):
        self.count = 0
        self.token = -1  # the inline follower's token, -1 when there is none
        self.next: "Node | None" = None
        self.more: dict[int, "Node"] | None = None  # every follower, once there are two

    def get(self, token: int) -> "Node | None":
        if self.more is not None:
            return self.more.get(token)
        return self.next if token == self.token else None

    def child(self, token: int) -> "Node":
        """The follower for `token`, made if missing."""
        found = self.get(token)
        if found is not None:
            return found
        found = Node()
        if self.more is not None:
            self.more[token] = found
        elif self.next is None:
            self.token, self.next = token, found
        else:
            self.more = {self.token: self.next, token: found}
            self.token, self.next = -1, None
        return found

    def remove(self, token: int) -> None:
        if self.more is None:
            self.token, self.next = -1, None
            return
        del self.more[token]
        if len(self.more) == 1:
            (self.token, self.next), = self.more.items()
            self.more = None

    def followers(self) -> list[tuple[int, "Node"]]:
        if self.more is not None:
            return list(self.more.items())
        return [] if self.next is None else [(self.token, self.next)]


@dataclass(frozen=True, slots=True)
class SuffixProposal:
    match_len: int  # context tokens matched
    tokens: tuple[int, ...]  # the proposed continuation
    confidence: float  # the first proposed token's share of what followed the match


def _add_runs(root: Node, tokens: Sequence[int], depth: int, delta: int) -> None:
    """Count (delta +1) or uncount (-1) every run of at most `depth` tokens in `tokens`."""
    for start in range(len(tokens)):
        node = root
        for token in tokens[start:start + depth]:
            child = node.child(token)
            child.count += delta
            if child.count <= 0:
                node.remove(token)
                break
            node = child


def _continue(node: Node, limit: int, min_share: float) -> tuple[list[int], float]:
    """From a matched node, the most frequent next tokens while their share stays >= min_share."""
    tokens: list[int] = []
    first_share = 0.0
    while len(tokens) < limit and (followers := node.followers()):
        token, child = max(followers, key=lambda item: item[1].count)
        total = sum(c.count for _, c in followers)
        share = child.count / total
        if share < min_share:
            break
        if not tokens:
            first_share = share
        tokens.append(token)
        node = child
    return tokens, first_share


def lookup(root: Node, context: Sequence[int], limit: int, max_match: int = MAX_MATCH,
           min_share: float = MIN_SHARE) -> SuffixProposal | None:
    """The continuation after the longest suffix of `context` (at most max_match) seen with a
    successor; None when no suffix of it was followed by anything."""
    for length in range(min(max_match, len(context)), 0, -1):
        node = root
        for token in context[len(context) - length:]:
            node = node.get(token)
            if node is None:
                break
        if node is not None and (node.next is not None or node.more):
            tokens, share = _continue(node, limit, min_share)
            return SuffixProposal(length, tuple(tokens), share) if tokens else None
    return None


MAX_BYTES_PER_TOKEN = 1200  # a token adds at most `depth` nodes: ~1.1 KB at depth 16 where no run repeats


class SuffixIndex:
    """Recent sequences' runs, shared across requests; holds at most `max_tokens` tokens, so at
    most ~MAX_BYTES_PER_TOKEN x max_tokens bytes (36 MB at the default 32,768, measured with
    tracemalloc on text that never repeats: test_suffix_drafting.py)."""

    def __init__(self, max_tokens: int = 32768, depth: int = DEFAULT_DEPTH):
        self.root = Node()
        self.depth = depth
        self.max_tokens = max_tokens
        self.held: deque[tuple[int, ...]] = deque()
        self.tokens = 0

    def add(self, tokens: Sequence[int]) -> None:
        kept = tuple(tokens[-self.max_tokens:])
        if not kept:
            return
        _add_runs(self.root, kept, self.depth, +1)
        self.held.append(kept)
        self.tokens += len(kept)
        while self.tokens > self.max_tokens:
            oldest = self.held.popleft()
            _add_runs(self.root, oldest, self.depth, -1)
            self.tokens -= len(oldest)

    def lookup(self, context: Sequence[int], limit: int) -> SuffixProposal | None:
        return lookup(self.root, context, limit)

    @property
    def charged_bytes(self) -> int:
        """What the tokens held are charged against the bound: MAX_BYTES_PER_TOKEN each, at or
        above what they hold (text that repeats adds fewer nodes)."""
        return self.tokens * MAX_BYTES_PER_TOKEN

    def clear(self) -> None:
        self.root = Node()
        self.held.clear()
        self.tokens = 0


class GrowingSuffixIndex:
    """One sequence's runs, extended token by token as the sequence grows, read as the trie of
    its runs would be (`lookup` above) without building it: the text itself and, for each pair
    of adjacent tokens, where it ends. A trie cost ~16 nodes a token (~70 bytes each), so a
    request's first draft offer indexed its whole prompt at 9 ms a request on the short-answer
    workload, ~40% of the drafting stage's time; here a token costs two list appends.

    The trie's lookup, by positions: the longest suffix of the context (at most MAX_MATCH, and
    depth - 1) that occurred before with a successor is the longest backward match among the
    earlier occurrences of its last two tokens (of its last token alone, for a match of one);
    the matched run's followers are the tokens after those occurrences, counted; the proposal
    follows the most frequent while its share stays >= MIN_SHARE and the run stays within
    `depth`, keeping the occurrences that followed it. Among equally frequent followers it takes
    the one that occurred first, as the trie's insertion order does. Checked against the trie
    and brute-force counts (test_suffix_drafting.py)."""

    def __init__(self, depth: int = DEFAULT_DEPTH):
        self.depth = depth
        self.text: list[int] = []
        self.ends: dict[int, list[int]] = {}  # a token, or a pair (_pair_key), -> positions where it ends

    @property
    def length(self) -> int:
        """Tokens added."""
        return len(self.text)

    def extend(self, tokens: Sequence[int]) -> None:
        text, ends = self.text, self.ends
        for token in tokens:
            position = len(text)
            if position:
                ends.setdefault(_pair_key(text[-1], token), []).append(position)
            ends.setdefault(token, []).append(position)
            text.append(token)

    def lookup(self, context: Sequence[int], limit: int) -> SuffixProposal | None:
        """As `lookup`, where `context` is what was added (its own last occurrence has no successor yet)."""
        longest = min(MAX_MATCH, len(context), self.depth - 1)
        if longest < 1 or limit < 1:
            return None
        text = self.text
        last = len(text) - 1  # an occurrence ending here has no successor
        occurrences: list[int] = []
        if longest >= 2:
            ends = [p for p in self.ends.get(_pair_key(context[-2], context[-1]), ()) if p < last]
            matched = [_backward_match(text, p, context, longest) for p in ends]
            if ends:
                length = max(matched)
                occurrences = [p for p, m in zip(ends, matched) if m >= length]
        if not occurrences:
            length = 1
            occurrences = [p for p in self.ends.get(context[-1], ()) if p < last]
            if not occurrences:
                return None
        tokens: list[int] = []
        first_share = 0.0
        while len(tokens) < limit and length + len(tokens) < self.depth and occurrences:
            counts: dict[int, int] = {}
            for p in occurrences:  # in text order, so a dict's order is the followers' first occurrence
                follower = text[p + 1]
                counts[follower] = counts.get(follower, 0) + 1
            token = max(counts, key=counts.__getitem__)
            share = counts[token] / len(occurrences)
            if share < MIN_SHARE:
                break
            first_share = first_share or share
            tokens.append(token)
            occurrences = [p + 1 for p in occurrences if text[p + 1] == token and p + 1 < last]
        return SuffixProposal(length, tuple(tokens), first_share) if tokens else None


def _pair_key(first: int, second: int) -> int:
    """Two adjacent tokens as one dict key, apart from every single token's (token ids < 2^32)."""
    return -1 - (first << 32 | second)


def _backward_match(text: list[int], end: int, context: Sequence[int], longest: int) -> int:
    """How many tokens of text ending at `end` equal the context's last ones, at most `longest`."""
    matched = 0
    while matched < longest and matched <= end and text[end - matched] == context[-1 - matched]:
        matched += 1
    return matched
