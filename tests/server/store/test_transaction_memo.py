"""What the SQLite writer remembers from its own transactions (``store/cache.TransactionMemo``): only what
committed is known after a rollback, and what a transaction may have changed is unknown, never stale."""

from __future__ import annotations

from stepwatch.server.store.cache import MISS, TransactionMemo


def test_only_a_commit_makes_a_value_known() -> None:
    memo = TransactionMemo()
    memo.put("a", 1)
    assert memo.get("a") == 1  # the open transaction sees its own
    memo.rollback()
    assert memo.get("a") is MISS
    memo.put("a", None)  # None is a value (a rank with no report yet)
    memo.commit()
    assert memo.get("a") is None
    memo.put("a", 2)
    memo.rollback()
    assert memo.get("a") is None


def test_what_a_transaction_forgets_is_unknown_even_if_it_was_committed() -> None:
    memo = TransactionMemo()
    memo.put("a", 1)
    memo.commit()
    memo.forget("a")  # a savepoint rolled back: the database holds 1 or what the transaction wrote
    assert memo.get("a") is MISS
    memo.commit()
    assert memo.get("a") is MISS
    memo.put("a", 3)
    memo.commit()
    memo.forget("a")
    memo.rollback()  # the whole transaction rolled back: the committed value stands
    assert memo.get("a") == 3


def test_it_is_bounded_and_can_forget_everything() -> None:
    memo = TransactionMemo(capacity=4)
    for key in range(4):
        memo.put(key, key)
    memo.commit()
    memo.put(9, 9)
    memo.commit()  # past the capacity: the old keys go, the new ones stay
    assert memo.get(0) is MISS and memo.get(9) == 9
    memo.put(8, 8)
    memo.clear()
    assert memo.get(9) is MISS and memo.get(8) is MISS
