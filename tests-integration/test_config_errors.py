"""A bad connector setting stops the real OpenAI server early with one line that names the
key, the value and the accepted form: the first error the user sees, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import connector_config
from vllm_env import offline_engine_env
from vllm_server import VllmServer, first_error

pytestmark = [pytest.mark.vllm, pytest.mark.newest]


@pytest.mark.parametrize(
    ("extra", "config_file", "named"),
    [
        (
            {"cpu_bytes_to_use": "lots"},
            None,
            ["cpu_bytes_to_use must be a byte count in [1, 2^60] such as 8GiB", "got 'lots'"],
        ),
        ({}, "load_mode: sync\n", ["{file}: load_mode must be one of [", "got 'sync'"]),
        (  # no filesystem here has 1000 TiB free: the tmpfs-too-small case
            {"cpu_bytes_to_use": "1000TiB"},
            None,
            ["cpu_bytes_to_use: cannot reserve 1099511627776000 bytes in ", "or free space"],
        ),
        (  # the same from the config file: the line names the file
            {},
            "cpu_bytes_to_use: 1000TiB\n",
            ["{file}: cpu_bytes_to_use: cannot reserve 1099511627776000 bytes in "],
        ),
    ],
    ids=["inline", "config-file", "no-room", "no-room-config-file"],
)
def test_a_bad_setting_is_the_first_error_in_one_line(
    tiny_llama: str,
    tmp_path: Path,
    extra: dict[str, str],
    config_file: str | None,
    named: list[str],
) -> None:
    env = offline_engine_env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    file = tmp_path / "offload.yaml"
    if config_file is not None:
        file.write_text(config_file)
        env["MARCONI_OFFLOAD_CONFIG"] = str(file)
    config = connector_config(**extra)
    server = VllmServer(tiny_llama, tmp_path / "server.log", kv_transfer_config=config, env=env)
    log, seconds = server.refused()
    line = first_error(log)
    print(f"stopped after {seconds:.1f} s with: {line}")
    for part in named:
        assert part.format(file=file) in line, log
    assert line.startswith("ERROR MarconiOffloadConnector: bad kv_connector_extra_config: "), log
    assert "Traceback" not in log
