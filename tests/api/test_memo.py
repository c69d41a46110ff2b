"""``api.memo.ProcessMemo``: bounded, oldest first out, emptied when its generation moves
(what the worker-token cache and the identity headers' memo rely on)."""

from __future__ import annotations

from api.memo import ProcessMemo


def test_it_keeps_at_most_its_bound_and_drops_the_oldest_first() -> None:
    memo: ProcessMemo[str, int] = ProcessMemo(2, lambda: 0)
    memo.put("a", 1)
    memo.put("b", 2)
    memo.put("a", 3)  # a key it holds is replaced, nothing dropped
    assert (memo.get("a"), memo.get("b")) == (3, 2)
    memo.put("c", 4)
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == (None, 2, 4)


def test_it_forgets_everything_when_the_generation_moves() -> None:
    generation = [0]
    memo: ProcessMemo[str, int] = ProcessMemo(10, lambda: generation[0])
    memo.put("a", 1)
    assert memo.get("a") == 1
    generation[0] += 1
    assert memo.get("a") is None
    memo.put("a", 2)
    assert memo.get("a") == 2
    memo.clear()
    assert memo.get("a") is None
