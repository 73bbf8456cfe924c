"""The configuration chain and its validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from memkv_client import (
    Client,
    ConfigError,
    ConfigSources,
    RawSetting,
    RdmaUnavailableError,
    Transport,
    load_config,
)
from memkv_client.auth import user_key, user_key_path


def test_defaults_match_the_vendor_table() -> None:
    c = load_config(env={})
    assert c.servers == ("127.0.0.1:9900",)
    assert c.rdma_devices == ("mlx5_0",)
    assert c.bind_addresses == (None,)
    assert (c.cache_size_mb, c.connect_timeout_ms, c.gid_index) == (256, 5000, 0)
    assert (c.traffic_class, c.service_level, c.mtu, c.num_connections) == (0, 0, 4096, 8)
    assert (c.license, c.auth_key, c.transport) == (None, None, Transport.AUTO)
    assert (c.max_batch_size, c.staging_size_mb, c.staging_slot_mb) == (64, 256, 16)


def test_env_variables() -> None:
    env = {
        "MEMKV_SERVERS": "10.0.0.1:9900, 10.0.0.2:9900",
        "MEMKV_AUTH_KEY": "ab" * 32,
        "MEMKV_TRANSPORT": "TCP",
        "MEMKV_RDMA_DEVICES": "mlx5_1,mlx5_2",
        "MEMKV_CONNECT_TIMEOUT_MS": "250",
        "MEMKV_NUM_CONNECTIONS": "3",
        "MEMKV_MAX_BATCH_SIZE": "16",
        "MEMKV_RDMA_TRAFFIC_CLASS": "106",
        "MEMKV_UNRELATED_PLUGIN_SETTING": "ignored",
    }
    c = load_config(env=env)
    assert c.servers == ("10.0.0.1:9900", "10.0.0.2:9900")
    assert c.auth_key == bytes.fromhex("ab" * 32)
    assert c.transport is Transport.TCP
    assert c.rdma_devices == ("mlx5_1", "mlx5_2")
    assert (c.connect_timeout_ms, c.num_connections, c.max_batch_size) == (250, 3, 16)
    assert c.traffic_class == 106


def test_yaml_comes_first_then_env_then_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "memkv.yaml"
    cfg.write_text("servers: [127.0.0.1:9901]\nnum_connections: 2\nlicense: some.jwt\n")
    env = {"MEMKV_CONFIG": str(cfg), "MEMKV_NUM_CONNECTIONS": "5", "MEMKV_MAX_BATCH_SIZE": "7"}
    c = load_config(env=env)
    assert c.servers == ("127.0.0.1:9901",)
    assert c.num_connections == 2  # YAML wins over the variable
    assert c.max_batch_size == 7  # the variable fills what YAML does not set
    assert c.connect_timeout_ms == 5000  # default
    assert load_config(env=env, num_connections=9).num_connections == 9  # overrides win


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MEMKV_NUM_CONNECTIONS": "0"}, "MEMKV_NUM_CONNECTIONS"),
        ({"MEMKV_NUM_CONNECTIONS": "many"}, "MEMKV_NUM_CONNECTIONS"),
        ({"MEMKV_TRANSPORT": "carrier-pigeon"}, "MEMKV_TRANSPORT"),
        ({"MEMKV_AUTH_KEY": "abc"}, "MEMKV_AUTH_KEY"),
        ({"MEMKV_AUTH_KEY": "zz" * 32}, "MEMKV_AUTH_KEY"),
        ({"MEMKV_SERVERS": "nohost"}, "MEMKV_SERVERS"),
        ({"MEMKV_SERVERS": "a:1,a:1"}, "MEMKV_SERVERS"),
        ({"MEMKV_SERVERS": "h:70000"}, "MEMKV_SERVERS"),
        ({"MEMKV_MTU": "1500"}, "MEMKV_MTU"),
        ({"MEMKV_RDMA_SERVICE_LEVEL": "16"}, "MEMKV_RDMA_SERVICE_LEVEL"),
        ({"MEMKV_MAX_BATCH_SIZE": "5000"}, "MEMKV_MAX_BATCH_SIZE"),
    ],
)
def test_invalid_values_name_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(env=env)


def test_yaml_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "memkv.yaml"
    cfg.write_text("servers: [127.0.0.1:9901]\nnum_conections: 2\n")
    with pytest.raises(
        ConfigError,
        match=rf"MEMKV_CONFIG {cfg}: unknown key\(s\) \['num_conections'\] "
        r"\(did you mean 'num_connections'\?\)",
    ):
        load_config(env={"MEMKV_CONFIG": str(cfg)})
    cfg.write_text("mtu: 9000\n")
    with pytest.raises(ConfigError, match=rf"^MEMKV_CONFIG {cfg}: mtu must be one of \[256, "):
        load_config(env={"MEMKV_CONFIG": str(cfg)})
    cfg.write_text("num_connections: 0\n")
    with pytest.raises(
        ConfigError,
        match=rf"^MEMKV_CONFIG {cfg}: num_connections must be an integer in \[1, 256\], got 0$",
    ):
        load_config(env={"MEMKV_CONFIG": str(cfg)})
    cfg.write_text(f"auth_key: {'ab' * 16}\n")
    with pytest.raises(ConfigError, match=rf"^MEMKV_CONFIG {cfg}: auth_key must be ") as bad:
        load_config(env={"MEMKV_CONFIG": str(cfg)})
    assert "ab" * 16 not in str(bad.value)  # a key is never echoed
    cfg.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(env={"MEMKV_CONFIG": str(cfg)})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(env={"MEMKV_CONFIG": str(tmp_path / "missing.yaml")})


def test_client_overrides_and_key_rules() -> None:
    with pytest.raises(ConfigError, match="bogus"):
        Client(bogus=1)
    with pytest.raises(ConfigError, match="auth_key"):
        Client(servers=["10.1.2.3:9900"], transport="tcp")  # no key off loopback
    with Client(servers=["127.0.0.1:9"], transport="tcp") as c:  # the user key on loopback
        assert c._signer.sign(b"h", b"m") != b""
    with pytest.raises(ConfigError, match="all-zero"):
        Client(servers=["127.0.0.1:9"], auth_key="00" * 32)
    with pytest.raises(ConfigError, match="64 hex digits"):
        Client(servers=["127.0.0.1:9"], auth_key="ab" * 16)  # too short


def test_user_key_file_is_random_private_and_shared(tmp_path: Path) -> None:
    """Without a key, loopback peers use a random per-user key file (not derivable from
    $HOME), created mode 0600; a file others can read is refused."""
    a = user_key(tmp_path / "a" / "auth.key")
    b = user_key(tmp_path / "b" / "auth.key")
    assert a != b
    assert user_key(tmp_path / "a" / "auth.key") == a  # the second user reads the same key
    assert (tmp_path / "a" / "auth.key").stat().st_mode & 0o777 == 0o600
    (tmp_path / "a" / "auth.key").chmod(0o644)
    with pytest.raises(ValueError, match="0600"):
        user_key(tmp_path / "a" / "auth.key")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert user_key_path(env) == tmp_path / "xdg" / "memkv" / "auth.key"
    assert user_key_path({**env, "MEMKV_AUTH_KEY_FILE": "/k"}) == Path("/k")


def test_transport_auto_falls_back_with_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="memkv_client")
    with Client(servers=["127.0.0.1:9"], transport="auto") as c:
        assert c.has_rdma() is False
    lines = [r for r in caplog.records if r.name == "memkv_client"]
    assert len(lines) == 1
    assert "using TCP" in lines[0].getMessage()


def test_transport_rdma_without_device_fails() -> None:
    with pytest.raises(RdmaUnavailableError, match="transport=rdma"):
        Client(servers=["127.0.0.1:9"], transport="rdma")


def test_one_loader_for_the_client_and_its_plugins(tmp_path: Path) -> None:
    """A plugin reads its own keys from the same file with the same precedence
    (file, then `MEMKV_<KEY>`), and the file is parsed once, by `read`."""
    cfg = tmp_path / "memkv.yaml"
    cfg.write_text("servers: [127.0.0.1:9901]\nbackend: mooncake\n")
    env = {"MEMKV_CONFIG": str(cfg), "MEMKV_BACKEND": "memkv", "MEMKV_REPLICAS": "2"}
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['backend'\]"):
        ConfigSources.read(env)  # a key nobody declared is refused
    sources = ConfigSources.read(env, plugin_keys=["backend", "replicas"])
    cfg.unlink()  # everything below uses what `read` parsed
    assert sources.lookup("backend") == RawSetting(
        "mooncake", f"MEMKV_CONFIG {cfg}", "backend", True
    )  # the file wins over the variable
    assert sources.lookup("replicas") == RawSetting("2", "environment", "MEMKV_REPLICAS", False)
    assert sources.lookup("absent") is None
    assert sources.lookup("traffic_class") is None
    assert sources.client_config().servers == ("127.0.0.1:9901",)
    assert sources.client_config(servers=["127.0.0.1:9902"]).servers == ("127.0.0.1:9902",)
    rdma_env = ConfigSources.read({"MEMKV_RDMA_TRAFFIC_CLASS": "7"})
    assert rdma_env.lookup("traffic_class") == RawSetting(
        "7", "environment", "MEMKV_RDMA_TRAFFIC_CLASS", False
    )
    assert ConfigSources.read({}).path == ""


def test_loader_errors_name_the_source(tmp_path: Path) -> None:
    cfg = tmp_path / "memkv.yaml"
    cfg.write_text("mtu: 9000\nbackend: x\n")
    sources = ConfigSources.read({"MEMKV_CONFIG": str(cfg)}, plugin_keys={"backend"})
    with pytest.raises(ConfigError, match=rf"MEMKV_CONFIG {cfg}: mtu must be .*, got 9000$"):
        sources.client_config()
    with pytest.raises(
        ConfigError,
        match=r"^environment: MEMKV_NUM_CONNECTIONS must be an integer in \[1, 256\], got '0'$",
    ):
        ConfigSources.read({"MEMKV_NUM_CONNECTIONS": "0"}).client_config()
    with pytest.raises(ConfigError, match=r"^Client\(\.\.\.\): transport must be one of "):
        ConfigSources.read({}).client_config(transport="carrier-pigeon")
