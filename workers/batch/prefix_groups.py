"""Prefix groups: which lines of a batch open with the same prompt tokens, so the releaser can
send them one after another and the engines' prefix cache can serve all but the first.

A bulk job's lines usually share a long header (a system prompt, few-shot examples) and differ
after it. Released in file order, lines of several headers interleave and spread over every
instance, and each instance computes each header again whenever its cache has let it go.

A line's key is the hash of its prompt's first `PREFIX_KEY_TOKENS` token ids, the way engines
and routers hash prompt units (`workers.sim.snapshot.prefix_unit_hashes`): lines with one key
share at least those tokens, which is what the cache matches. Its group is the number of the
batch's first line with that key (`PrefixGroups`): ordering by (group, line) releases lines that
share a key together, groups in order of first appearance, file order within a group.

NOTE: the key is shallow on purpose. A deeper one (say 1,024 tokens) would tell apart headers
that only share their opening, but would give every line of a batch with a shorter header a
key of its own (it reaches into the unique part): no grouping at all. A shallow key at worst
merges two headers with the same first 128 tokens into one group, still released far closer
together than file order. 128 is a multiple of the engines' prefix unit for the usual block
sizes (64 tokens for blocks of 16, 32 or 64; 128 for blocks of 128: `live_prefix_unit_tokens`).

NOTE: groups go in order of first appearance, not largest first: the first group starts at the
batch's first line as before, a batch whose lines share nothing is released in file order
exactly as before, and expansion, which reads the file once as a stream, can number a group as
soon as it sees its first line (largest first would need every line counted before any row is
written). Within one window it makes no difference which group comes first.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.sim.snapshot import prefix_unit_hashes

__all__ = ["PREFIX_KEY_TOKENS", "PrefixGroups", "prefix_key"]

#: Leading prompt tokens a line's prefix key covers (see the module's note on its depth).
PREFIX_KEY_TOKENS = 128


def prefix_key(token_ids: Sequence[int], key_tokens: int = PREFIX_KEY_TOKENS) -> int | None:
    """The hash of the prompt's first `key_tokens` token ids; None when it is shorter (too
    short a shared prefix for the cache to save much)."""
    hashes = prefix_unit_hashes(token_ids[:key_tokens], key_tokens)
    return hashes[0] if hashes else None


class PrefixGroups:
    """Numbers the prefix groups of one batch's lines as expansion reads them in file order.

    Holds one entry per distinct key: at most one per line (a few MB for 50,000 lines).
    """

    def __init__(self) -> None:
        self._first_line: dict[int, int] = {}

    def group_of(self, line: int, key: int | None) -> int:
        """Line `line`'s group: the first line seen with `key`, or `line` itself (no key, or
        the first line with it). Lines must come in increasing order."""
        if key is None:
            return line
        return self._first_line.setdefault(key, line)
