"""Direct mode at tensor parallelism > 1: every worker publishes its key prefix through a
real `memkv serve`; the scheduler refuses ranks that disagree and says in what."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.vllm  # direct_manager imports vLLM
pytest.importorskip("vllm")

from memkv_server import MemKVServer  # noqa: E402
from memkv_vllm.direct_manager import adopt_prefix  # noqa: E402
from memkv_vllm.naming import direct_prefix, prefix_record, publish_key  # noqa: E402
from memkv_vllm.store import StoreConfig  # noqa: E402
from memkv_vllm.store.memkv import MemKVStore  # noqa: E402

IDENT = {
    "model": "m",
    "dtype": "torch.bfloat16",
    "tp_size": 2,
    "world_size": 2,
    "layout": [[[2, 32, 128], 16384]],
    "kv_cache_layout": "NHD",
}


@pytest.fixture
def store(memkv: MemKVServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[MemKVStore]:
    for name, value in memkv.env().items():
        monkeypatch.setenv(name, value)
    opened = MemKVStore(StoreConfig(), probe=True, who="test")
    yield opened
    opened.close()


def publish(store: MemKVStore, engine_id: str, idents: list[dict[str, object]]) -> None:
    for rank, ident in enumerate(idents):
        store.put_record(publish_key(engine_id, rank), prefix_record(ident, "w1", ""))


def test_agreeing_ranks_share_the_prefix_their_keys_use(store: MemKVStore) -> None:
    publish(store, "same", [IDENT, IDENT])
    assert adopt_prefix(store, "same", 2, timeout=1) == direct_prefix(IDENT, "w1", "")


def test_a_rank_with_another_kv_layout_is_refused_naming_rank_and_field(
    store: MemKVStore,
) -> None:
    other = {**IDENT, "layout": [[[2, 128, 32], 16384]], "kv_cache_layout": "HND"}
    publish(store, "mixed", [IDENT, IDENT, other, IDENT])
    with pytest.raises(RuntimeError, match="ranks key KV blocks differently") as caught:
        adopt_prefix(store, "mixed", 4, timeout=1)
    message = str(caught.value)
    assert "rank 2: kv_cache_layout='HND' where rank 0 has 'NHD'" in message
    assert "layout=[[[2, 128, 32], 16384]] where rank 0 has [[[2, 32, 128], 16384]]" in message
    assert "rank 1" not in message  # ranks 1 and 3 agree with rank 0
    assert "rank 3" not in message
