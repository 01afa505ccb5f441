"""Session affinity's decision (workers/route/affinity.py): pure, no services."""

from __future__ import annotations

from workers.route.affinity import AffinityOutcome, prefer
from workers.route.policies import Decision, RequestView

REQUEST = RequestView("req_1", num_prompt_tokens=100, predicted_output_tokens=50, max_tokens=256)
#: (TTFT, end-to-end) what-ifs: gpu.0 the fastest, gpu.1 10 % slower, gpu.2 saturated.
WHAT_IFS = {"gpu.0": (0.10, 2.0), "gpu.1": (0.12, 2.2), "gpu.2": (4.0, 9.0)}


def _chose(instance_id: str = "gpu.0", meets: bool | None = None) -> Decision:
    return Decision("block", instance_id, {i: e2e for i, (_, e2e) in WHAT_IFS.items()},
                    meets_target=meets)


def test_the_previous_instance_wins_within_the_margin() -> None:
    affinity = prefer(_chose(), WHAT_IFS, REQUEST, "gpu.1", margin=0.2)
    assert (affinity.instance_id, affinity.outcome) == ("gpu.1", AffinityOutcome.APPLIED)
    assert affinity.record() == {"preferred": "gpu.1", "outcome": "applied"}


def test_a_saturated_previous_instance_is_declined() -> None:
    affinity = prefer(_chose(), WHAT_IFS, REQUEST, "gpu.2", margin=0.2)
    assert (affinity.instance_id, affinity.outcome) == ("gpu.0", AffinityOutcome.DECLINED)
    # The margin is a share of the chosen instance's end-to-end what-if.
    assert prefer(_chose(), WHAT_IFS, REQUEST, "gpu.1", margin=0.05).instance_id == "gpu.0"
    assert prefer(_chose(), WHAT_IFS, REQUEST, "gpu.1", margin=0.1).instance_id == "gpu.1"


def test_no_previous_instance_or_the_same_one_changes_nothing() -> None:
    assert prefer(_chose(), WHAT_IFS, REQUEST, None, margin=0.2).outcome is AffinityOutcome.NONE
    kept = prefer(_chose("gpu.1"), WHAT_IFS, REQUEST, "gpu.1", margin=0.2)
    assert (kept.instance_id, kept.outcome) == ("gpu.1", AffinityOutcome.KEPT)


def test_an_instance_that_is_no_candidate_or_was_not_simulated_is_unavailable() -> None:
    gone = prefer(_chose(), WHAT_IFS, REQUEST, "gpu.9", margin=0.2)
    assert (gone.instance_id, gone.outcome) == ("gpu.0", AffinityOutcome.UNAVAILABLE)
    # A policy that does not simulate: no what-if to judge room by.
    plain = Decision("least_requests", "gpu.0", {"gpu.0": 0.0, "gpu.1": 1.0})
    unsimulated = prefer(plain, {}, REQUEST, "gpu.1", margin=10.0)
    assert (unsimulated.instance_id, unsimulated.outcome) == ("gpu.0",
                                                              AffinityOutcome.UNAVAILABLE)


def test_latency_targets_come_first() -> None:
    # gpu.1 is within the margin but misses the TTFT target gpu.0 meets.
    targeted = RequestView("req_t", 100, 50, 256, ttft_target_s=0.11)
    affinity = prefer(_chose(meets=True), WHAT_IFS, targeted, "gpu.1", margin=0.2)
    assert (affinity.instance_id, affinity.outcome) == ("gpu.0", AffinityOutcome.DECLINED)
    loose = RequestView("req_t", 100, 50, 256, ttft_target_s=0.5, e2e_target_s=3.0)
    assert prefer(_chose(meets=True), WHAT_IFS, loose, "gpu.1", margin=0.2).instance_id == (
        "gpu.1")
    # No instance meets them: the closest one `decide` chose stands.
    missed = prefer(_chose(meets=False), WHAT_IFS, targeted, "gpu.1", margin=0.2)
    assert (missed.instance_id, missed.outcome) == ("gpu.0", AffinityOutcome.DECLINED)
