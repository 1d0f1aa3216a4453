"""Option parsing: Kafka's names and defaults, and one clear error naming each bad option."""

from __future__ import annotations

import pytest

from kq.spark.options import (
    EARLIEST,
    LATEST,
    KqSourceError,
    OffsetSpec,
    ReadFrom,
    SubscriptionKind,
    TopicPartition,
    check_batch,
    check_streaming,
    parse_options,
)

NODES = {"kq.nodes": "127.0.0.1:9101, 127.0.0.1:9102"}


def test_defaults_follow_kafka() -> None:
    """Only nodes and a topic given: follower reads, failOnDataLoss on, no headers, default offsets."""
    options = parse_options({**NODES, "subscribe": "a, b,a"})
    assert options.nodes == ("127.0.0.1:9101", "127.0.0.1:9102")
    assert options.subscription.kind is SubscriptionKind.SUBSCRIBE
    assert options.subscription.topics == ("a", "b")
    assert options.starting is None and options.ending is None
    assert options.read_from is ReadFrom.FOLLOWER and options.fail_on_data_loss
    assert not options.include_headers and not options.debug_served_by
    assert options.max_offsets_per_trigger is None and options.min_partitions is None
    assert options.fetch_max_records == 10_000 and options.fetch_whole_batches


def test_an_explicit_fetch_size_bounds_every_fetch() -> None:
    """kq.fetch.maxRecords given: fetches are cut at it (no whole batches beyond it)."""
    options = parse_options({**NODES, "subscribe": "a", "kq.fetch.maxRecords": "50"})
    assert options.fetch_max_records == 50 and not options.fetch_whole_batches


def test_spark_lower_cases_option_names() -> None:
    """Spark passes names lower-cased; both spellings parse alike."""
    given = {
        **NODES,
        "assign": '{"t": [1, 0]}',
        "startingOffsets": '{"t": {"0": 5, "1": -2}}',
        "ENDINGOFFSETS": "latest",
        "includeheaders": "TRUE",
        "kq.readFrom": "127.0.0.1:9103",
        "minPartitions": "8",
        "maxOffsetsPerTrigger": "1000",
    }
    options = parse_options(given)
    assert options == parse_options({key.lower(): value for key, value in given.items()})
    assert options.subscription.partitions == (TopicPartition("t", 0), TopicPartition("t", 1))
    assert options.starting == OffsetSpec(
        "specific", ((TopicPartition("t", 0), 5), (TopicPartition("t", 1), EARLIEST))
    )
    assert options.ending == OffsetSpec("latest")
    assert options.include_headers and options.min_partitions == 8 and options.max_offsets_per_trigger == 1000
    assert (options.read_from, options.pinned_node) == (ReadFrom.NODE, "127.0.0.1:9103")


@pytest.mark.parametrize(
    ("options", "named", "says"),
    [
        ({"subscribe": "t"}, "kq.nodes", "required"),
        ({**NODES}, "subscribe", "got none"),
        ({**NODES, "subscribe": "t", "assign": '{"t":[0]}'}, "subscribe", "got subscribe, assign"),
        ({**NODES, "subscribe": " , "}, "subscribe", "no topic"),
        ({**NODES, "subscribePattern": "(unclosed"}, "subscribePattern", "not a regular expression"),
        ({**NODES, "assign": "[0, 1]"}, "assign", "expected JSON like"),
        ({**NODES, "assign": '{"t": [-1]}'}, "assign", "not a partition number"),
        ({**NODES, "subscribe": "t", "startingOffsets": "{oops"}, "startingOffsets", "expected 'earliest'"),
        ({**NODES, "subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "startingOffsets", "'x'"),
        ({**NODES, "subscribe": "t", "endingOffsets": '{"t": {"0": -3}}'}, "endingOffsets", "-3"),
        ({**NODES, "subscribe": "t", "endingOffsets": '{"t": {"0": "5"}}'}, "endingOffsets", "'5'"),
        ({**NODES, "subscribe": "t", "minPartitions": "0"}, "minPartitions", "at least 1"),
        ({**NODES, "subscribe": "t", "maxOffsetsPerTrigger": "lots"}, "maxOffsetsPerTrigger", "whole number"),
        ({**NODES, "subscribe": "t", "failOnDataLoss": "yes"}, "failOnDataLoss", "true or false"),
        ({**NODES, "subscribe": "t", "kq.readFrom": "followers"}, "kq.readFrom", "'follower', 'leader'"),
        (
            {**NODES, "subscribe": "t", "kq.fetch.maxRecords": "20000"},
            "kq.fetch.maxRecords",
            "at most 10,000",
        ),
        (
            {**NODES, "subscribe": "t", "kafka.bootstrap.servers": "h:1"},
            "kafka.bootstrap.servers",
            "kq.nodes",
        ),
        ({**NODES, "subscribe": "t", "startingOffset": "earliest"}, "startingoffset", "unknown option"),
        ({"kq.nodes": "localhost", "subscribe": "t"}, "kq.nodes", "not host:port"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], named: str, says: str) -> None:
    """Each bad option is one KqSourceError that names it and says what is wrong."""
    with pytest.raises(KqSourceError) as raised:
        parse_options(options)
    assert f"kq source option '{named}'" in str(raised.value)
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"startingOffsets": "latest"}, "startingOffsets"),
        ({"startingOffsets": f'{{"t": {{"0": {LATEST}}}}}'}, "startingOffsets"),
        ({"endingOffsets": "earliest"}, "endingOffsets"),
        ({"endingOffsets": f'{{"t": {{"0": {EARLIEST}}}}}'}, "endingOffsets"),
    ],
)
def test_batch_reads_start_before_latest_and_end_after_earliest(given: dict[str, str], named: str) -> None:
    """Kafka's batch rules: no latest start, no earliest end."""
    options = parse_options({**NODES, "subscribe": "t", **given})
    with pytest.raises(KqSourceError, match=f"'{named}'"):
        check_batch(options)


def test_streams_have_no_end() -> None:
    """endingOffsets is a batch option."""
    options = parse_options({**NODES, "subscribe": "t", "endingOffsets": "latest"})
    check_batch(options)
    with pytest.raises(KqSourceError, match="'endingOffsets': not allowed in a streaming query"):
        check_streaming(options)
