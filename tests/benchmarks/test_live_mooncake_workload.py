"""The live benchmark's Mooncake workload: prompts as token ids that share a prefix exactly where
the trace's hash ids do, so the engines' prefix cache (and the router, hashing them the same
way) finds what the trace says is shared."""

from __future__ import annotations

import pytest

from benchmarks.live.workloads import mooncake, mooncake_token_ids
from benchmarks.paths import DATA_DIR
from workers.serve.prefixes import PrefixMemory
from workers.sim.snapshot import live_prefix_unit_tokens

DATA = DATA_DIR


def test_prompts_share_tokens_where_the_hashes_do() -> None:
    a = mooncake_token_ids((0, 1, 2), 1300, "a", 32000)
    b = mooncake_token_ids((0, 1, 9), 1100, "b", 32000)
    c = mooncake_token_ids((5, 1), 1100, "c", 32000)
    assert len(a) == 1300 and len(b) == 1100
    assert a[:1024] == b[:1024] and a[1024:1100] != b[1024:1100]
    assert a[:512] != c[:512] and a[512:1024] == c[512:1024]  # same block, other prefix
    memory = PrefixMemory(live_prefix_unit_tokens(16), 1000)
    keys_a, keys_c = memory.keys_of(a), memory.keys_of(c)
    assert memory.keys_of(b)[:16] == keys_a[:16]  # 1,024 tokens in 64-token units
    assert not set(keys_a) & set(keys_c)  # chained: nothing of c's matches a's
    whole = mooncake_token_ids((0, 1), 1024, "d", 32000)
    assert whole[:512] == a[:512] and whole[512:] != a[512:1024]  # its own last token(s)
    assert all(16 <= t < 32000 for t in a)


@pytest.mark.skipif(not (DATA / "traces" / "mooncake").exists(), reason="no Mooncake trace")
def test_the_workload_keeps_the_trace_order_lengths_and_room() -> None:
    workload = mooncake(DATA, num_requests=50, max_model_len=4096, seed=0,
                        decode=lambda ids: " ".join(map(str, ids)), vocab_size=32000)
    assert len(workload.requests) == len(workload.unit_arrival_s) == 50
    for r in workload.requests:
        assert isinstance(r.prompt, list) and len(r.prompt) == r.prompt_tokens < 4096
        assert 1 <= r.output_tokens <= r.max_tokens == 4096 - r.prompt_tokens
    # The trace's conversations share their first blocks: so do the prompts.
    firsts = [tuple(r.prompt[:512]) for r in workload.requests if r.prompt_tokens > 512]
    assert len(set(firsts)) < len(firsts)
