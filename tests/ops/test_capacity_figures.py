"""``bench.capacity`` counts what it judges: a lease lost by a live agent, whether a write
said so on its own or a batch heartbeat said so for one of its attempts (issue 27)."""

from __future__ import annotations

from bench import capacity


def test_a_lost_lease_is_counted_alone_or_inside_a_batch_and_nothing_else_is() -> None:
    w0, w1 = 100.0, 200.0
    calls = [
        ("checkpoint", 110.0, 0.01, "ok"),
        ("checkpoint", 120.0, 0.01, "409 stale_worker"),
        ("heartbeat", 130.0, 0.01, "409 stale_worker (in a batch)"),
        ("ask", 140.0, 0.01, "409 stale_checkpoint"),  # not a lost lease
        ("ask", 150.0, 60.0, "gave up after 503 overloaded"),  # refused, not lost
        ("heartbeat", 90.0, 0.01, "409 stale_worker"),  # before the window
    ]
    gathered = [(calls, [], [], [], [], [], [])]
    plan = {"agents": 10, "think": 2.0, "per_process": 1}
    figures = capacity.call_figures(gathered, w0, w1, plan)
    assert figures["checkpoint"]["errors"] == {"409 stale_worker": 1}
    assert figures["heartbeat"]["errors"] == {"409 stale_worker (in a batch)": 1}
    assert capacity.lost_leases(figures) == 2
