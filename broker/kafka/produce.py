"""Kafka Produce: each partition's batch goes through the same checks and the same batcher as a gRPC
produce request, and is answered once its Raft entry is applied.

acks=-1 and acks=1 both answer after the entry commits on a majority (kq has no "leader only" write:
a record is in the log only once Raft commits it), so acks=1 is as safe as acks=all. acks=0 gets no
response, as Kafka defines it; its batches are still checked and appended. Every partition of a
request is queued at once, so the batcher packs them into as few entries as it can, and the wait
for their commit is a coroutine on the loop: no thread is held per partition.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kq.broker.auth import TOPIC, TRANSACTIONAL_ID
from kq.broker.errors import BatchTooLargeError, KqError
from kq.broker.kafka.authorize import (
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ApiKey,
)
from kq.broker.kafka.base import KafkaBase, kafka_code
from kq.broker.kafka.codes import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_REQUEST,
    INVALID_REQUIRED_ACKS,
    MESSAGE_TOO_LARGE,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    RECORD_LIST_TOO_LARGE,
)
from kq.broker.kafka.framing import NO_TAGGED_FIELDS, Request, WrittenResponse
from kq.broker.kafka.listener import Connection
from kq.broker.validation import only_a_record_too_large
from kq.proto import kq_pb2
from kq.proto.limits import (
    KAFKA_PARTITIONS_PER_REQUEST_MAX,
    KAFKA_UNACKNOWLEDGED_APPENDS_MAX,
)
from kq.proto.records import MalformedBatchError, crc_matches, split_batches
from kq.raft.commands import varint

PRODUCE = 0
ACKS = (-1, 0, 1)
T = TypeVar("T")


class ProduceApis(KafkaBase):
    """Kafka's Produce over kq's batcher."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unacknowledged: set[asyncio.Task[Any]] = set()  # acks=0 appends in progress (loop only).

    async def produce(self, request: Request, connection: Connection) -> Any:
        """Appends each partition's records; the response lists each partition's base offset or error."""
        body = request.body
        wanted = [
            (topic.name, data.index, data.records)
            for topic in body.topic_data
            for data in topic.partition_data
        ]
        results: list[tuple[int, int, str | None]]
        if len(wanted) > KAFKA_PARTITIONS_PER_REQUEST_MAX:
            results = [(INVALID_REQUEST, -1, "too many partitions in one request")] * len(wanted)
        elif body.acks not in ACKS:
            results = [(INVALID_REQUIRED_ACKS, -1, f"acks must be -1, 0 or 1, not {body.acks}")] * len(wanted)
        elif body.transactional_id is not None and not self._permitted(
            connection, ApiKey.PRODUCE, TRANSACTIONAL_ID, body.transactional_id
        ):
            results = [
                (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, "not authorized to WRITE the transactional id")
            ] * len(wanted)
        else:
            refused = self._refused(connection, ApiKey.PRODUCE, TOPIC, [name for name, _, _ in wanted])

            def append(
                name: str, index: int, records: bytes | None, queued: Callable[[], None] | None
            ) -> Coroutine[Any, Any, tuple[int, int, str | None]]:
                if name in refused:
                    return _refusal(name)
                return self._append_partition(name, index, records, queued)

            if body.acks == 0:  # Appends run on after the handler returns: they signal no later request.
                self._append_unacknowledged([append(*partition, None) for partition in wanted])
                return None
            # The listener reads the next request once this one's batches are all queued (its appends
            # then queue behind them): one partition's signals itself; several count down, each
            # partition once it queued or ended (refused, failed before queueing).
            if len(wanted) == 1:
                results = [await append(*wanted[0], connection.queued)]  # Usual: no gather's task.
            else:
                # Its partitions are submitted apart: held, they share an entry (`Batcher.hold`).
                release = self._batcher.hold()

                def all_queued() -> None:
                    release()
                    connection.queued()

                marks = _Countdown(len(wanted), all_queued).marks()
                appends = [
                    _counted(append(name, index, records, mark), mark)
                    for (name, index, records), mark in zip(wanted, marks, strict=True)
                ]
                try:
                    results = list(await asyncio.gather(*appends))
                finally:
                    release()  # However the request ended (once: later calls do nothing).
        return produce_response(request.api_version, wanted, results)

    def _append_unacknowledged(self, appends: list[Any]) -> None:
        """acks=0: appends run on without a response; beyond the limit, they are dropped (acks=0 allows)."""
        for append in appends:
            if len(self._unacknowledged) >= KAFKA_UNACKNOWLEDGED_APPENDS_MAX:
                append.close()
                continue
            task = asyncio.ensure_future(append)
            self._unacknowledged.add(task)
            task.add_done_callback(self._unacknowledged.discard)

    async def _append_partition(
        self, topic: str, partition: int, records: bytes | None, queued: Callable[[], None] | None = None
    ) -> tuple[int, int, str | None]:
        """(Kafka error code, base offset, message) of one partition's records; `queued` is called once
        the last of its batches is in the batcher's queue (each waits for the one before it)."""
        if not records:
            return INVALID_RECORD, -1, "no records"
        try:
            batches = split_batches(records)
        except MalformedBatchError as error:
            return INVALID_RECORD, -1, str(error)
        base_offset = -1
        request = kq_pb2.ProduceRequest(topic=topic, partition=partition)  # The batch goes beside it.
        for number, batch in enumerate(batches, 1):
            # One batch, as producers send: the decoded field itself, not a copy of it.
            whole = len(batches) == 1 and len(batch) == len(records)
            last = queued if number == len(batches) else None
            data = records if whole else bytes(batch)
            try:
                answer = await self._service.produce_records(request, data, last)
            except BatchTooLargeError as error:
                return RECORD_LIST_TOO_LARGE, -1, str(error)
            except KqError as error:
                code = kafka_code(error, NOT_LEADER_OR_FOLLOWER)
                if code == INVALID_REQUEST:  # Refused by the shared validation (at the edge or in apply).
                    code = await self._in_workers(_refusal_code, batch)
                return code, -1, str(error)
            base_offset = answer.base_offset if base_offset < 0 else base_offset
        return NONE, base_offset, None


class _Countdown:
    """Calls `done` once each of `count` marks was called (each counts once, however often called):
    a Produce request of several partitions has the listener read the next request only once every
    partition's append queued its batches or ended."""

    def __init__(self, count: int, done: Callable[[], None]) -> None:
        self._left = count
        self._done = done

    def marks(self) -> list[Callable[[], None]]:
        return [self._mark() for _ in range(self._left)]

    def _mark(self) -> Callable[[], None]:
        called = False

        def mark() -> None:
            nonlocal called
            if not called:
                called = True
                self._left -= 1
                if self._left == 0:
                    self._done()

        return mark


async def _counted(append: Coroutine[Any, Any, T], mark: Callable[[], None]) -> T:
    """`append`, marking its partition done when it ends (queued or not)."""
    try:
        return await append
    finally:
        mark()


_PARTITION = struct.Struct(">ihqq")  # index, error code, base offset, log append time (-1: none).
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_NONE = -1  # log_append_time (none: CreateTime) and log_start_offset (not reported), as kq answers.


def produce_response(
    version: int, wanted: list[tuple[str, int, Any]], results: list[tuple[int, int, str | None]]
) -> WrittenResponse:
    """The Produce response (versions 3 to 9) of each partition's (error code, base offset, message),
    in `wanted`'s order, partitions grouped by topic: the bytes kio writes for the same response
    built from its classes (tests/kafka/test_framing.py `kio_produce_response` compares them),
    written directly. Every produce request pays for its response, and building and writing kio's
    frozen classes cost ~60 µs of the serving loop for one partition's, ~12 times this."""
    flexible = version >= 9
    by_topic: dict[str, list[bytes]] = {}
    for (name, index, _), (code, base_offset, message) in zip(wanted, results, strict=True):
        part = _PARTITION.pack(index, code, base_offset, _NONE)
        if version >= 5:
            part += _INT64.pack(_NONE)
        if version >= 8:  # No record errors; the message.
            part += _length(0, flexible) + _nullable_string(message, flexible)
        by_topic.setdefault(name, []).append(part + NO_TAGGED_FIELDS if flexible else part)
    pieces = [_length(len(by_topic), flexible)]
    for name, parts in by_topic.items():
        pieces += (_nullable_string(name, flexible), _length(len(parts), flexible), *parts)
        if flexible:
            pieces.append(NO_TAGGED_FIELDS)
    pieces.append(_INT32.pack(0))  # throttle_time_ms
    if flexible:
        pieces.append(NO_TAGGED_FIELDS)
    return WrittenResponse(flexible, b"".join(pieces))


def _length(count: int, flexible: bool) -> bytes:
    """An array's length: int32, or (flexible) the compact form, an unsigned varint of count + 1 (the
    LEB128 protobuf writes too: raft/commands.py `varint`)."""
    return varint(count + 1) if flexible else _INT32.pack(count)


def _nullable_string(text: str | None, flexible: bool) -> bytes:
    """A (nullable) string: its UTF-8 after an int16 length (-1: null), or (flexible) a compact one."""
    if text is None:
        return b"\x00" if flexible else _INT16.pack(-1)
    data = text.encode()
    return (varint(len(data) + 1) if flexible else _INT16.pack(len(data))) + data



def _refusal_code(batch: memoryview) -> int:
    """Kafka's code for a batch the shared validation refused: CORRUPT_MESSAGE when its CRC does not
    match (Kafka's ensureValid), MESSAGE_TOO_LARGE when a record over RECORD_BYTES_MAX is all that is
    wrong (Kafka's RecordTooLargeException), else INVALID_RECORD."""
    if not crc_matches(batch):
        return CORRUPT_MESSAGE
    return MESSAGE_TOO_LARGE if only_a_record_too_large(batch) else INVALID_RECORD


async def _refusal(topic: str) -> tuple[int, int, str | None]:
    """A partition of a topic the principal may not WRITE: its answer, in the place of an append."""
    return TOPIC_AUTHORIZATION_FAILED, -1, f"not authorized to WRITE topic {topic}"
