"""The free-slot stack against a set model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kvpool_mmap._index import FreeList


@settings(deadline=None)
@given(n=st.integers(1, 64), data=st.data())
def test_free_list_matches_a_set(n: int, data: st.DataObject) -> None:
    used = data.draw(st.sets(st.integers(0, n - 1)))
    fl = FreeList(n, used)
    free = set(range(n)) - used
    assert sorted(fl.snapshot()) == sorted(free)
    taken: list[int] = []
    for op in data.draw(st.lists(st.booleans(), max_size=100)):
        if op and len(fl):
            s = fl.pop()
            assert s in free
            free.remove(s)
            taken.append(s)
        elif taken:
            s = taken.pop()
            fl.push(s)
            free.add(s)
        assert len(fl) == len(free)
    assert sorted(fl.snapshot()) == sorted(free)


def test_lifo_order() -> None:
    fl = FreeList(4)
    assert [fl.pop() for _ in range(4)] == [0, 1, 2, 3]
    fl.push(2)
    assert fl.pop() == 2
