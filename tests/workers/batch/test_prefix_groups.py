"""Prefix keys and groups: lines that open with the same tokens share a group, numbered by the
first line with it; lines too short for a key keep their own place."""

from __future__ import annotations

from workers.batch.prefix_groups import PREFIX_KEY_TOKENS, PrefixGroups, prefix_key


def test_the_key_covers_the_leading_tokens_only() -> None:
    header = list(range(PREFIX_KEY_TOKENS))
    assert prefix_key(header + [1, 2, 3]) == prefix_key(header + [9] * 50) is not None
    assert prefix_key([7] + header[1:] + [1]) != prefix_key(header + [1])
    assert prefix_key(header[:-1]) is None  # shorter than a key: no group to share
    assert prefix_key(tuple(header)) == prefix_key(header)  # the same hash either way


def test_groups_are_numbered_by_their_first_line() -> None:
    a, b = 11, 22
    groups = PrefixGroups()
    numbered = [groups.group_of(line, key) for line, key in
                enumerate([a, b, None, a, b, a, None], 1)]
    assert numbered == [1, 2, 3, 1, 2, 1, 7]
    # Released by (group, line): the a's, the b's, then the keyless ones in their places.
    order = sorted(range(1, 8), key=lambda line: (numbered[line - 1], line))
    assert order == [1, 4, 6, 2, 5, 3, 7]
