"""A minimal Kafka wire client for tests: kio requests over a plain socket, one at a time."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from kq.broker.kafka.framing import request_schema, response_schema

_SIZE = struct.Struct(">i")
TIMEOUT_S = 10.0


def request_frame(request: Any, correlation_id: int = 1, client_id: str = "kq-test") -> bytes:
    """The whole frame (size prefix included) of a kio request object."""
    header_schema = type(request).__header_schema__
    header = header_schema(
        request_api_key=i16(type(request).__api_key__),
        request_api_version=i16(type(request).__version__),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    buffer = io.BytesIO()
    entity_writer(header_schema)(buffer, header)
    entity_writer(type(request))(buffer, request)
    body = buffer.getvalue()
    return _SIZE.pack(len(body)) + body


def read_frame(sock: socket.socket) -> bytes:
    """One response frame's bytes (without the size); ConnectionError when the broker closed."""
    size = _SIZE.unpack(_read_exactly(sock, _SIZE.size))[0]
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(count)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def decode_response(frame: bytes, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, response object) of a response frame."""
    schema = response_schema(api_key, api_version)  # kio's, or kq's for a version kio lacks.
    header, header_bytes = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, header_bytes)
    return header.correlation_id, body


def call(address: str, request: Any, timeout_s: float = TIMEOUT_S) -> Any:
    """Sends one request on a new connection and returns the decoded response."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(request_frame(request, correlation_id=7))
        correlation_id, response = decode_response(
            read_frame(sock), type(request).__api_key__, type(request).__version__
        )
    assert correlation_id == 7
    return response


def request_class(api_key: int, api_version: int) -> Any:
    """kio's request class of an API version (or kq's, broker/kafka/kio_gaps.py, where kio has none)."""
    schema = request_schema(api_key, api_version)
    assert schema is not None, f"no request schema for API {api_key} v{api_version}"
    return schema
