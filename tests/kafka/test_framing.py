"""Decoding Kafka request frames: a null array where Kafka's schema allows none is refused at the
decoder, for every API (kio reads a -1 length as None whatever the schema says)."""

from __future__ import annotations

import struct
import uuid

import pytest
from kio.schema.incremental_alter_configs.v1.request import IncrementalAlterConfigsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import TopicName

from kq.broker.kafka.framing import FrameError, decode_request, null_array, request_schema
from tests.kafka.wire import request_frame


def test_a_null_array_the_schema_does_not_allow_is_undecodable() -> None:
    """The fuzzed frame that crashed IncrementalAlterConfigs: `resources` null."""
    frame = request_frame(IncrementalAlterConfigsRequest(resources=None, validate_only=False))  # type: ignore[arg-type]
    with pytest.raises(FrameError, match="resources is a null array"):
        decode_request(frame[4:], IncrementalAlterConfigsRequest)


def test_a_null_array_the_schema_allows_decodes() -> None:
    """Metadata's `topics` may be null (all topics): it decodes as None."""
    request = MetadataRequest(
        topics=None, allow_auto_topic_creation=True, include_topic_authorized_operations=False
    )
    assert decode_request(request_frame(request)[4:], MetadataRequest).body.topics is None
    assert null_array(request) is None


def _frame(api_key: int, version: int, body: bytes, flexible: bool = False) -> bytes:
    """A request frame (without its size prefix): header v1 (v2 with its tag byte when flexible)."""
    header = struct.pack(">hhih", api_key, version, 0, 7) + b"kq-test" + (b"\x00" if flexible else b"")
    return header + body


@pytest.mark.parametrize(
    ("api_key", "version", "body", "flexible"),
    [
        (42, 0, b"\x7f\xff\xff\xff", False),  # DeleteGroups: 2**31 - 1 group names in no bytes.
        (3, 12, b"\xff\xff\xff\xff\x0f", True),  # Metadata v12: a compact array of 2**32 - 2 topics.
        (37, 0, b"\x00\x00\x00\x01\x7f\xff", False),  # CreatePartitions: a topic name of 32,767 bytes.
        (
            0,
            3,
            b"\xff\xff"
            + b"\x00\x01"
            + b"\x00\x00\x00\x00"
            + b"\x00\x00\x00\x01\x00\x01t"
            + b"\x00\x00\x00\x01\x00\x00\x00\x00\x7f\xff\xff\xff",
            False,
        ),  # Produce: records of 2 GiB.
    ],
)
def test_a_length_beyond_the_frame_is_refused_before_kios_reader_reserves_it(
    api_key: int, version: int, body: bytes, flexible: bool
) -> None:
    """kio's native reader reserves a declared length's room before reading; a hostile length aborted
    a node (the listener fuzz). The decoder refuses it first, as an undecodable frame, in this process."""
    schema = request_schema(api_key, version)
    assert schema is not None
    with pytest.raises(FrameError, match=r"declares|bytes in"):
        decode_request(_frame(api_key, version, body, flexible), schema)


def test_the_length_walk_lets_real_requests_through() -> None:
    """Valid requests with arrays, strings and tagged fields decode as before (nothing is refused)."""
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.uuid4(), name=TopicName("a")),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    decoded = decode_request(request_frame(request)[4:], MetadataRequest)
    assert decoded.body == request
