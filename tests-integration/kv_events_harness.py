"""A KV-aware router's view of one engine: a ZMQ SUB that decodes vLLM's `KVEventBatch`
and replays the events, in order, into the blocks each medium holds.

The subscriber binds on loopback and vLLM's publisher connects to it (an endpoint without
a wildcard), so no event is sent before anyone listens. Also: JSON requests to the
OpenAI server with fields `VllmServer.complete` does not send.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
from local_ports import free_port
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

Block = tuple[int, Any]
"""(group, block hash as the events publish it)."""


@dataclass
class Replica:
    """What the events said each medium holds: block -> its token ids ([] if not told)."""

    media: dict[str, dict[Block, list[int]]] = field(default_factory=dict)
    stored: dict[str, int] = field(default_factory=dict)
    removed: dict[str, int] = field(default_factory=dict)
    clears: int = 0
    gpu_tokens: dict[Any, list[int]] = field(default_factory=dict)
    """Token ids of every block vLLM's own (GPU) events described, by hash."""

    def apply(self, event: Any) -> None:
        if isinstance(event, AllBlocksCleared):
            self.clears += 1
            for blocks in self.media.values():
                blocks.clear()
            return
        medium = event.medium or "GPU"
        blocks = self.media.setdefault(medium, {})
        group = event.group_idx or 0
        if isinstance(event, BlockStored):
            self.stored[medium] = self.stored.get(medium, 0) + len(event.block_hashes)
            for i, block_hash in enumerate(event.block_hashes):
                size = event.block_size
                tokens = list(event.token_ids[i * size : (i + 1) * size]) if size else []
                blocks[(group, block_hash)] = tokens
                if medium == "GPU":
                    self.gpu_tokens[block_hash] = tokens
        elif isinstance(event, BlockRemoved):
            self.removed[medium] = self.removed.get(medium, 0) + len(event.block_hashes)
            for block_hash in event.block_hashes:
                blocks.pop((group, block_hash), None)

    def holds(self, medium: str) -> dict[Block, list[int]]:
        return self.media.get(medium, {})


class Subscriber:
    """Receives every batch on a background thread; `events` in arrival order."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.RCVTIMEO, 200)
        self._socket.bind(self.endpoint)
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._lock = threading.Lock()
        self.events: list[Any] = []
        self.batches = 0
        self._running = True
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def kv_events_config(self) -> str:
        """`--kv-events-config` for a server publishing to this subscriber."""
        return json.dumps(
            {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint}
        )

    def _receive(self) -> None:
        while self._running:
            try:
                _topic, _seq, payload = self._socket.recv_multipart()
            except zmq.Again:
                continue
            batch = self._decoder.decode(payload)
            with self._lock:
                self.events.extend(batch.events)
                self.batches += 1

    def replica(self) -> Replica:
        replica = Replica()
        with self._lock:
            events = list(self.events)
        for event in events:
            replica.apply(event)
        return replica

    def close(self) -> None:
        self._running = False
        self._thread.join(5)
        self._socket.close(linger=0)


def post(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def complete(
    server_url: str, model: str, prompt: list[int], max_tokens: int = 2, **fields: Any
) -> dict[str, Any]:
    """A greedy completion with extra request fields (kv_transfer_params, cache_salt)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    return post(server_url + "/v1/completions", {**body, **fields})


def cached_tokens(server_url: str, model: str, prompt: list[int], **fields: Any) -> int:
    """Tokens of `prompt` a completion reports served from a cache (vLLM's own or a
    connector's: `usage.prompt_tokens_details`, with `--enable-prompt-tokens-details`)."""
    details = complete(server_url, model, prompt, **fields)["usage"]["prompt_tokens_details"]
    return int((details or {}).get("cached_tokens") or 0)


def wait_until(check: Callable[[], bool], nudge: Callable[[], object], timeout: float = 60) -> bool:
    """Call `nudge` (a request: vLLM publishes events and stats only while it steps) until
    `check` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nudge()
        time.sleep(0.3)
        if check():
            return True
    return False
