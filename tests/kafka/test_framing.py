"""Decoding Kafka request frames: a null array where Kafka's schema allows none is refused at the
decoder, for every API (kio reads a -1 length as None whatever the schema says)."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.schema.incremental_alter_configs.v1.request import IncrementalAlterConfigsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import TopicName

from kq.broker.kafka.build import build, response_module
from kq.broker.kafka.framing import FrameError, decode_request, encode_response, null_array, request_schema
from kq.broker.kafka.produce import produce_response
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


Result = tuple[int, int, "str | None"]
KAFKA_CODES = sorted(code.value for code in KafkaErrorCode)


def kio_produce_response(version: int, wanted: list[tuple[str, int, Any]], results: list[Result]) -> bytes:
    """The Produce response frame as kio writes it, from kio's classes (what kq built before it wrote
    the response itself)."""
    module = response_module(0, version)
    by_topic: dict[str, list[Any]] = {}
    for (name, index, _), (code, base_offset, message) in zip(wanted, results, strict=True):
        by_topic.setdefault(name, []).append(
            build(
                module.PartitionProduceResponse,
                index=index,
                error_code=code,
                base_offset=base_offset,
                log_start_offset=-1,
                error_message=message,
            )
        )
    topics = tuple(
        build(module.TopicProduceResponse, name=name, partition_responses=tuple(partitions))
        for name, partitions in by_topic.items()
    )
    return encode_response(7, build(module.ProduceResponse, responses=topics, throttle_time=0))



@settings(max_examples=300, deadline=None)
@given(
    st.integers(3, 9),
    st.lists(
        st.tuples(
            st.sampled_from(["t", "topic-a", "ü" * 70, "x" * 200]),
            st.integers(0, 2**31 - 1),
            st.sampled_from(KAFKA_CODES),
            st.integers(-1, 2**63 - 1),
            st.one_of(st.none(), st.text(max_size=150)),
        ),
        max_size=12,
    ),
)
def test_the_produce_response_is_written_as_kio_writes_it(
    version: int, partitions: list[tuple[str, int, int, int, str | None]]
) -> None:
    """Every served version (3 to 9), any topics, partitions, codes, offsets and messages (null, empty,
    non-ASCII, long enough for a two-byte length): kq's own writer gives kio's bytes."""
    wanted = [(name, index, b"") for name, index, _, _, _ in partitions]
    results = [(code, base_offset, message) for _, _, code, base_offset, message in partitions]
    frame = encode_response(7, produce_response(version, wanted, results))
    assert frame == kio_produce_response(version, wanted, results)
