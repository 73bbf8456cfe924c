"""Hypothesis-fuzzed frames against a live server, and the decoders on their own."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator

import pytest
from conftest import KEY, ServerProcess, make_client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memkv_client import protocol as p
from memkv_client.auth import Signer
from rawclient import RawSession

SIGNER = Signer(KEY)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """This module's own server, so its log can be checked for handler tracebacks."""
    srv = ServerProcess("--memory", "16MiB").start()
    yield srv
    srv.stop()


FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _send(server: ServerProcess, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may close first (it rejected the frame early)
        buf = b""
        try:
            while chunk := s.recv(65536):
                buf += chunk
        except ConnectionResetError:
            pass
        return buf


def _check_replies(buf: bytes, request_id: int | None = None, signer: Signer = SIGNER) -> None:
    """Whatever came back must be well-formed, signed reply frames."""
    dec = p.FrameDecoder()
    dec.feed(buf)
    while (frame := dec.next_frame()) is not None:
        assert frame.header.is_response
        assert signer.verify(frame.header.pack(), frame.meta, frame.mac)
        if request_id is not None and frame.header.op != 0:
            assert frame.header.request_id == request_id


def _healthy(server: ServerProcess) -> None:
    assert server.alive
    with make_client(server.address, num_connections=1) as c:
        c.put("fuzz/health", b"ok")
        assert c.get("fuzz/health") == b"ok"


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes(server: ServerProcess, data: bytes) -> None:
    _check_replies(_send(server, data))


@FUZZ
@given(
    prefix=st.binary(min_size=p.HEADER_SIZE, max_size=p.HEADER_SIZE),
    tail=st.binary(max_size=100),
)
def test_random_headers_with_valid_magic(server: ServerProcess, prefix: bytes, tail: bytes) -> None:
    data = p.MAGIC + prefix[2:]
    _check_replies(_send(server, data + SIGNER.sign(data, tail) + tail))


@FUZZ
@given(
    op=st.sampled_from([*list(p.Op), 0, max(p.Op) + 1, 0xFF]),
    meta=st.one_of(
        st.binary(max_size=200),
        st.builds(
            lambda n, rest: struct.pack("<I", n) + rest,
            st.integers(0, 2000),
            st.binary(max_size=200),
        ),
    ),
    bulk=st.binary(max_size=64),
    claimed_bulk=st.integers(0, 128),
)
def test_signed_frames_with_fuzzed_metadata(
    server: ServerProcess, op: int, meta: bytes, bulk: bytes, claimed_bulk: int
) -> None:
    """Correctly signed frames after a real HELLO reach the metadata decoders; they must
    answer or close."""
    s = RawSession(server.port, KEY)
    try:
        data = s.next_frame(op, meta, bulk, bulk_len=claimed_bulk)
        with contextlib.suppress(OSError):
            s.sock.sendall(data)
            s.sock.shutdown(socket.SHUT_WR)
        buf = b""
        with contextlib.suppress(OSError):
            while chunk := s.sock.recv(65536):
                buf += chunk
        _check_replies(buf, s.rid, s.session)
    finally:
        s.close()


def test_server_survives_fuzzing(server: ServerProcess) -> None:
    # runs after the fuzz tests in this module (file order); the module's server is its own
    _healthy(server)
    assert server.terminate() == 0
    output = "".join(server.output)
    assert "Traceback" not in output, output


@given(data=st.binary(max_size=200))
def test_decoders_raise_only_frame_errors(data: bytes) -> None:
    for fn in (
        p.decode_keys,
        p.decode_key_lengths,
        p.decode_remote_items,
        p.decode_hello,
        p.decode_xfer,
    ):
        with contextlib.suppress(p.FrameError):
            fn(data)
    for fn2 in (p.decode_flags, p.decode_status_lengths):
        with contextlib.suppress(p.FrameError):
            fn2(data, 3)
    dec = p.FrameDecoder()
    dec.feed(data)
    with contextlib.suppress(p.FrameError):
        dec.next_frame()
