"""Decoding Kafka request frames: a null array where Kafka's schema allows none is refused at the
decoder, for every API (kio reads a -1 length as None whatever the schema says)."""

from __future__ import annotations

import pytest
from kio.schema.incremental_alter_configs.v1.request import IncrementalAlterConfigsRequest
from kio.schema.metadata.v12.request import MetadataRequest

from kq.broker.kafka.framing import FrameError, decode_request, null_array
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
