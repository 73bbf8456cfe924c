"""Fast tests without an engine: config errors, key names, lookup batching, registration."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import kv_offload_settings
import pytest
from memkv_server import MemKVServer
from memkv_vllm import register
from memkv_vllm.config import ConfigError, DirectConfig, TierConfig
from memkv_vllm.jobs import JobOutcome, JobRunner
from memkv_vllm.load_errors import LoadErrors, attached, current
from memkv_vllm.lookup import Answer, BatchedLookup
from memkv_vllm.metrics import LOOKUPS, TierMetrics
from memkv_vllm.naming import MAX_NAME, TierNamer, direct_key, direct_prefix
from memkv_vllm.store import StoreConfig
from memkv_vllm.store.memkv import MemKVStore
from memkv_vllm.store.mooncake import MooncakeStore


def test_tier_config_names_the_bad_key_and_the_accepted_values() -> None:
    assert TierConfig.from_dict({"n_read_threads": 2, "locality": "REMOTE"}).n_read_threads == 2
    with pytest.raises(ConfigError) as excinfo:
        TierConfig.from_dict({"n_read_thread": 2})
    assert str(excinfo.value).startswith(
        "memkv-vllm: secondary_tiers[memkv]: unknown key(s) ['n_read_thread'] (did you mean "
        "'n_read_threads'?); accepted keys: ["
    )
    assert "'stall_budget_s'" in str(excinfo.value)
    with pytest.raises(ConfigError) as excinfo:
        TierConfig.from_dict({"blocks_per_op": 0})
    assert str(excinfo.value) == (
        "memkv-vllm: secondary_tiers[memkv]: blocks_per_op must be an integer >= 1, got 0"
    )
    with pytest.raises(ConfigError, match=r"max_store_backlog_mb must be an integer >= 0, got"):
        TierConfig.from_dict({"max_store_backlog_mb": "lots"})
    with pytest.raises(ConfigError, match=r"prefix must be a non-empty relative name"):
        TierConfig.from_dict({"prefix": "/abs"})


def test_direct_config_checks_only_memkv_keys() -> None:
    cfg = DirectConfig.from_extra_config({"spec_name": "x", "memkv_num_threads": 3})
    assert cfg.memkv_num_threads == 3
    with pytest.raises(
        ConfigError,
        match=r"^memkv-vllm: kv_connector_extra_config: memkv_scratch_medium must be one of "
        r"\['auto', 'host', 'gpu'\], got 'nvme'$",
    ):
        DirectConfig.from_extra_config({"memkv_scratch_medium": "nvme"})
    with pytest.raises(
        ConfigError, match=r"\['memkv_threads'\] \(did you mean 'memkv_num_threads'"
    ):
        DirectConfig.from_extra_config({"memkv_threads": 3})


def test_direct_lookup_ttls_are_the_tiers_and_the_old_spelling_still_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = DirectConfig.from_extra_config({"memkv_lookup_hit_ttl_s": 300})
    assert cfg.memkv_lookup_hit_ttl_s == 300
    assert DirectConfig().memkv_lookup_hit_ttl_s == TierConfig().lookup_hit_ttl_s
    with caplog.at_level("WARNING", logger="vllm.memkv_vllm"):
        old = DirectConfig.from_extra_config(
            {"memkv_lookup_hit_ttl": 7, "memkv_lookup_miss_ttl": 2}
        )
    assert (old.memkv_lookup_hit_ttl_s, old.memkv_lookup_miss_ttl_s) == (7, 2)
    assert "memkv_lookup_hit_ttl is now memkv_lookup_hit_ttl_s" in caplog.text
    with pytest.raises(ConfigError, match=r"memkv_lookup_hit_ttl and memkv_lookup_hit_ttl_s "):
        DirectConfig.from_extra_config({"memkv_lookup_hit_ttl": 7, "memkv_lookup_hit_ttl_s": 9})


def test_a_misspelt_store_key_gets_did_you_mean_in_both_modes() -> None:
    with pytest.raises(ConfigError, match=r"\['stall_budget'\] \(did you mean 'stall_budget_s'"):
        TierConfig.from_dict({"stall_budget": 1})
    with pytest.raises(
        ConfigError, match=r"\['memkv_stall_budget'\] \(did you mean 'memkv_stall_budget_s'"
    ):
        DirectConfig.from_extra_config({"memkv_stall_budget": 1})


def test_every_error_about_a_value_in_memkv_config_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "memkv.yaml"
    env = {"MEMKV_CONFIG": str(config)}
    config.write_text("stall_budget_s: soon\n")
    with pytest.raises(ConfigError, match=rf"^memkv-vllm: MEMKV_CONFIG {config}: stall_budget_s "):
        StoreConfig.resolve({}, "secondary_tiers[memkv]", env=env)
    config.write_text("stall_budget: 1\n")
    with pytest.raises(
        kv_offload_settings.ConfigError,
        match=rf"^MEMKV_CONFIG {config}: unknown key\(s\) \['stall_budget'\] \(did you mean "
        "'stall_budget_s'",
    ):
        StoreConfig.resolve({}, "secondary_tiers[memkv]", env=env)
    config.write_text("servers: [127.0.0.1:9900]\nnum_connections: 0\n")
    with pytest.raises(
        kv_offload_settings.ConfigError, match=rf"^MEMKV_CONFIG {config}: num_connections must be "
    ):
        StoreConfig.resolve({}, "secondary_tiers[memkv]", env=env).sources.client_config()


class _Mapper:
    base_path = "memkv-vllm/m_abc123"

    def get_file_name(self, key: bytes) -> str:
        h = key[:-4].hex()
        return f"{self.base_path}_r0/{h[:3]}/{h[3:5]}_g0/{h}.bin"


def test_tier_names_fold_the_weights_fingerprint_into_the_run_folder() -> None:
    namer = TierNamer(_Mapper(), "f00d")
    name = namer.name(b"\x01" * 32 + b"\0\0\0\0")
    assert name.startswith(b"memkv-vllm/m_abc123_wf00d_r0/010/10_g0/0101")
    assert TierNamer(_Mapper(), "beef").name(b"\x01" * 36) != name
    long_mapper = _Mapper()
    long_mapper.base_path = "x" * 600
    assert TierNamer(long_mapper, "f").name(b"\x02" * 36).startswith(b"memkv-vt:")
    assert len(TierNamer(long_mapper, "f").name(b"\x02" * 36)) <= MAX_NAME


def test_direct_keys_are_rank_qualified_under_one_digest() -> None:
    ident = {"model": "m", "dtype": "bf16", "tp_size": 2, "layout": [[2, 32, 128]]}
    prefix = direct_prefix(ident, "w1", "")
    assert prefix == direct_prefix(dict(ident), "w1", "")
    assert prefix != direct_prefix(ident, "w2", "")  # new checkpoint, new keys
    assert prefix != direct_prefix({**ident, "tp_size": 4}, "w1", "")
    k0, k1 = direct_key(prefix, 0, b"k" * 36), direct_key(prefix, 1, b"k" * 36)
    assert k0 != k1
    assert k0.startswith(prefix)
    assert len(k0) == len(prefix) + 2 + 36


def test_lookup_sends_one_round_per_flush_and_caches_answers(memkv: MemKVServer) -> None:
    import memkv_client

    with memkv_client.Client(servers=[memkv.address], transport="tcp") as client:
        client.put(b"present", b"x")
        calls: list[list[bytes]] = []

        def exists(names: list[bytes]) -> list[bool]:
            calls.append(names)
            return list(client.exists(names))

        lookup = BatchedLookup(
            exists, hit_ttl=60, miss_ttl=60, timeout=5, settings_hint=MemKVStore.settings_hint
        )
        assert lookup.query(b"present") is Answer.PENDING
        assert lookup.query(b"absent") is Answer.PENDING
        assert lookup.query(b"present") is Answer.PENDING  # queued once
        lookup.flush()
        lookup.flush()  # the round is in flight: no second round
        while lookup.pending():
            lookup.flush()
        assert calls == [[b"present", b"absent"]]
        assert lookup.query(b"present") is Answer.HIT
        assert lookup.query(b"absent") is Answer.MISS
        assert lookup.query_all([b"present", b"absent"]) is Answer.MISS
        lookup.mark([b"absent"], True)
        assert lookup.query(b"absent") is Answer.HIT
        lookup.close()


def test_names_asked_while_a_round_flies_go_out_when_it_ends() -> None:
    """Not at the next scheduler step: vLLM's steps under load last 50-100 ms."""
    gate = threading.Event()
    calls: list[list[bytes]] = []
    second = threading.Event()

    def exists(names: list[bytes]) -> list[bool]:
        calls.append(names)
        if len(calls) == 1:
            gate.wait(10)
        else:
            second.set()
        return [True] * len(names)

    lookup = BatchedLookup(
        exists, hit_ttl=60, miss_ttl=60, timeout=5, settings_hint=MemKVStore.settings_hint
    )
    assert lookup.query(b"a") is Answer.PENDING
    lookup.flush()
    assert lookup.query(b"b") is Answer.PENDING  # queued behind the round in flight
    lookup.flush()  # still in flight: nothing sent
    gate.set()
    assert second.wait(5), "the round for b waited for another flush"
    while lookup.pending():
        time.sleep(0.01)
    assert calls == [[b"a"], [b"b"]]
    assert lookup.query_all([b"a", b"b"]) is Answer.HIT
    lookup.close()


@pytest.mark.parametrize(
    ("hint", "names"),
    [
        (MemKVStore.settings_hint, ("MEMKV_SERVERS", "MEMKV_CONFIG")),
        (MooncakeStore.settings_hint, ("mooncake_master", "MEMKV_MOONCAKE_MASTER")),
    ],
)
def test_lookup_round_that_hangs_or_fails_resolves_as_absent(
    caplog: pytest.LogCaptureFixture, hint: str, names: tuple[str, str]
) -> None:
    """...and the warning names where the configured backend's address is set."""
    # vLLM's logging setup stops "vllm.*" records from reaching the root logger
    logging.getLogger("vllm.memkv_vllm").addHandler(caplog.handler)
    gate = threading.Event()
    now = [0.0]

    def hangs(names: list[bytes]) -> list[bool]:
        gate.wait(10)
        return [True] * len(names)

    lookup = BatchedLookup(
        hangs, hit_ttl=60, miss_ttl=60, timeout=5, settings_hint=hint, clock=lambda: now[0]
    )
    lookup.query(b"k")
    lookup.flush()
    now[0] = 6.0
    assert lookup.query(b"k") is Answer.MISS
    gate.set()
    lookup.close()

    def fails(names: list[bytes]) -> list[bool]:
        raise ConnectionError("down")

    lookup = BatchedLookup(fails, hit_ttl=60, miss_ttl=60, timeout=5, settings_hint=hint)
    lookup.query(b"k")
    lookup.flush()
    while lookup.pending():
        lookup.flush()
    assert lookup.query(b"k") is Answer.MISS
    lookup.close()
    warnings = [r.getMessage() for r in caplog.records if "exists round" in r.getMessage()]
    assert len(set(warnings)) == 2  # the hung round, then the failed one
    assert all(names[0] in w and names[1] in w for w in warnings)
    logging.getLogger("vllm.memkv_vllm").removeHandler(caplog.handler)


def test_forget_drops_cached_answers_and_the_round_in_flight() -> None:
    gate = threading.Event()
    present = [True]

    def exists(names: list[bytes]) -> list[bool]:
        gate.wait(10)
        return [present[0]] * len(names)

    lookup = BatchedLookup(
        exists, hit_ttl=60, miss_ttl=60, timeout=5, settings_hint=MemKVStore.settings_hint
    )
    lookup.query(b"a")
    lookup.flush()
    gate.set()
    while lookup.pending():
        lookup.flush()
    assert lookup.query(b"a") is Answer.HIT
    gate.clear()
    lookup.query(b"b")
    lookup.flush()  # b's round asked before the value went away ...
    lookup.forget()  # ... and a load then found it gone
    assert lookup.query(b"a") is Answer.PENDING  # asks MemKV again
    gate.set()
    while lookup.pending():
        lookup.flush()
    present[0] = False
    assert lookup.query(b"b") is Answer.PENDING  # the stale round's answer was dropped
    lookup.flush()
    while lookup.pending():
        lookup.flush()
    assert lookup.query_all([b"a", b"b"]) is Answer.MISS
    lookup.close()


def test_store_backlog_sheds_over_its_byte_limit() -> None:
    gate = threading.Event()

    def slow() -> JobOutcome:
        gate.wait(10)
        return JobOutcome(True, nbytes=10)

    runner = JobRunner(1, 1, max_backlog_bytes=15)
    assert runner.submit_store(1, 10, slow)  # an empty backlog always admits one job
    assert not runner.submit_store(2, 10, slow)  # 20 > 15: shed
    gate.set()
    runner.drain()
    done = {f.job_id: f for f in runner.finished()}
    assert done[2].shed
    assert not done[2].outcome.success
    assert done[1].outcome.success
    assert not done[1].shed
    runner.shutdown()


@pytest.mark.vllm
def test_register_is_idempotent_and_honours_vllm_plugins(monkeypatch: Any) -> None:
    import memkv_vllm
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    register()
    register()
    assert SecondaryTierFactory.get_tier_class({"type": "memkv"}).__name__ == "MemKVTierManager"
    monkeypatch.setattr(memkv_vllm, "_registered", False)
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    register()
    assert memkv_vllm._registered is False


@pytest.mark.vllm
def test_scheduler_adopts_the_prefix_only_if_every_rank_agrees(
    memkv: MemKVServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memkv_vllm.direct_manager import adopt_prefix
    from memkv_vllm.naming import publish_key

    for name, value in memkv.env().items():
        monkeypatch.setenv(name, value)
    store = MemKVStore(StoreConfig(), probe=True, who="test")
    store.put_record(publish_key("e1", 0), b"P")
    store.put_record(publish_key("e1", 1), b"P")
    assert adopt_prefix(store, "e1", 2, timeout=1) == b"P"
    assert store.get_record(publish_key("e1", 0)) is None  # records are cleaned up
    store.put_record(publish_key("e2", 0), b"P")
    store.put_record(publish_key("e2", 1), b"Q")
    with pytest.raises(RuntimeError, match="ranks key KV blocks differently"):
        adopt_prefix(store, "e2", 2, timeout=1)
    store.put_record(publish_key("e3", 0), b"P")
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] published no key prefix"):
        adopt_prefix(store, "e3", 2, timeout=0.5)
    store.close()


def _offloading_config(pp: int = 1, pcp: int = 1, blocks_per_chunk: int = 1) -> Any:
    from types import SimpleNamespace as Ns

    return Ns(
        extra_config={"spec_name": "MemKVOffloadingSpec"},
        enable_kv_cache_events=False,
        groups=(Ns(tokens_per_block=32),),
        cache=Ns(tokens_per_hash=32, blocks_per_chunk=blocks_per_chunk),
        parallel=Ns(rank=0, world_size=pp, tp_size=1, pp_size=pp, pcp_size=pcp, dcp_size=1),
        model=Ns(name="m", dtype="bfloat16"),
        engine_id="e",
    )


@pytest.mark.vllm
def test_direct_spec_refuses_pipeline_and_prefill_context_parallelism_and_chunks() -> None:
    from memkv_vllm.spec import MemKVOffloadingSpec

    MemKVOffloadingSpec(_offloading_config())
    with pytest.raises(RuntimeError, match="pipeline_parallel_size=2"):
        MemKVOffloadingSpec(_offloading_config(pp=2))
    with pytest.raises(RuntimeError, match="prefill_context_parallel_size=2"):
        MemKVOffloadingSpec(_offloading_config(pcp=2))
    with pytest.raises(ConfigError, match="remove block_size"):
        MemKVOffloadingSpec(_offloading_config(blocks_per_chunk=4))


@pytest.mark.vllm
def test_hash_seed_warning_follows_the_vllm_version(monkeypatch: Any) -> None:
    from memkv_vllm._compat import hash_seed_problem
    from vllm.v1.core import kv_cache_utils

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert hash_seed_problem() is None
    monkeypatch.delenv("PYTHONHASHSEED")
    if hasattr(kv_cache_utils, "resolve_none_hash_seed"):  # >= 0.29: sha256 is seeded fixed
        assert hash_seed_problem() is None
    else:  # <= 0.28: random per process
        assert "seeds block hashes per process" in (hash_seed_problem() or "")


def test_load_errors_reach_only_what_is_built_under_the_connector() -> None:
    assert current() is None  # the plain OffloadingConnector: workers fail such loads
    errors = LoadErrors()
    seen: list[str] = []
    with attached(errors):
        assert current() is errors
        current_errors = current()
        assert current_errors is not None
        current_errors.on_scheduler_failure(lambda: seen.append("forget"))
    assert current() is None
    errors.add_blocks([3, 4])
    errors.add_blocks([4, 9])
    assert errors.take_blocks() == {3, 4, 9}
    assert errors.take_blocks() == set()  # handed to vLLM once
    errors.scheduler_saw_failure()
    assert seen == ["forget"]


def test_unreachable_server_error_names_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("MEMKV_CONFIG", raising=False)
    monkeypatch.setenv("MEMKV_SERVERS", f"127.0.0.1:{port}")
    with pytest.raises(RuntimeError) as exc_info:
        MemKVStore(StoreConfig(), probe=True, who="tier")
    message = str(exc_info.value)
    assert f"MemKV server 127.0.0.1:{port} does not answer" in message
    assert f"MEMKV_CONFIG (unset), else MEMKV_SERVERS (127.0.0.1:{port})" in message
    config = tmp_path / "memkv.yaml"
    config.write_text(f"servers: ['127.0.0.1:{port}']\n")
    monkeypatch.setenv("MEMKV_CONFIG", str(config))
    monkeypatch.delenv("MEMKV_SERVERS")
    with pytest.raises(RuntimeError, match=f"MEMKV_CONFIG \\({config}\\)"):
        MemKVStore(StoreConfig(), probe=True, who="tier")


def test_lookups_count_once_by_final_answer() -> None:
    metrics = TierMetrics()
    for answer in (Answer.PENDING, Answer.PENDING, Answer.HIT, Answer.MISS):
        metrics.count_lookup(answer)
    assert dict(metrics.totals) == {(LOOKUPS, ("hit",)): 1, (LOOKUPS, ("miss",)): 1}
