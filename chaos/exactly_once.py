"""The exactly-once workload (issue 38): transactional consume-transform-produce workers under faults.

A *feeder* (an idempotent confluent-kafka producer) writes numbered, keyed records to the input topic:
a backlog of `SEED_RECORDS` at once, then `FEED_RATE_PER_S` a second, each to an explicit partition in
turn, until the load stops. *Workers* (`WORKERS`, each a thread) consume the input topic in the
consumer group `GROUP` (read_committed, no auto-commit) and process each batch a poll returns in one
transaction of their own transactional id: begin, one output record per input record (same key, to
the output partition of the same number, the value naming its source: `transformed`),
send_offsets_to_transaction with the batch's next offsets, commit. As librdkafka documents it: a
retriable error of commit (or abort) is retried; an abortable one aborts the transaction and rewinds
the consumer to the group's committed offsets; a fatal one (fenced) recreates the producer, which
init_transactions fences and finishes, and rewinds too. A *watcher* polls the group's committed
offsets (OffsetFetch to the coordinator) every `OFFSET_POLL_S`.

At the end (`finish`): the feeder stops, the workers process everything (the committed offsets reach
the input's log end), stop, and the input and the output are read back (`read_final`), the output by
a read_committed consumer; `chaos.exactly_once_check` judges it. Every wait is bounded; the threads
are daemons joined with a deadline.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from kq.chaos.exactly_once_check import (
    ExactlyOnceFinal,
    ExactlyOnceHistory,
    InputRecord,
    OffsetPoll,
    OutputRecord,
    TransactionCommit,
    transformed,
)

logger = logging.getLogger(__name__)

INPUT_TOPIC = "eos-in"
OUTPUT_TOPIC = "eos-out"
GROUP = "eos-group"
WORKERS = 2  # Two, so the group's partitions are shared and change hands when a worker rejoins.
SEED_RECORDS = 2_000  # The input's backlog when the workers start, spread over the partitions.
FEED_RATE_PER_S = 50.0  # Then this many input records a second, until the load stops.
KEYS = 16
BATCH_RECORDS_MAX = 20  # Input records per transaction, at most: many transactions meet the faults.
POLL_TIMEOUT_S = 0.2
CALL_TIMEOUT_S = 15.0  # One transactional call (init, send offsets, commit, abort), one committed().
CALL_TRIES = 4  # A retriable error of a commit or an abort: tried again this often, then recreated.
# A worker stuck longer than its transaction's timeout has it aborted by the coordinator, its producer
# fenced, before its partitions move to the other worker (a consumer that stops polling leaves the
# group after max.poll.interval.ms); TxnOffsetCommit also refuses a zombie's offsets (its member id
# and generation, KIP-447: DESIGN.md "Transactions"), so its transaction cannot commit either way.
TRANSACTION_TIMEOUT_MS = 20_000
MAX_POLL_INTERVAL_MS = 40_000
SESSION_TIMEOUT_MS = 10_000
CALL_OVERDUE_S = 2 * CALL_TIMEOUT_S  # A client call still running this long ignored its timeout.
OFFSET_POLL_S = 0.5
CATCH_UP_TIMEOUT_S = 120.0  # After the load: the workers' backlog of a long fault, and a rebalance.
READ_TIMEOUT_S = 60.0
CLIENT_LOG_FILE = "eos-clients.log"  # librdkafka's transaction (eos) and consumer-group debug lines.
CLIENT_DEBUG = "eos,cgrp"
CONSUMER_DEBUG = "cgrp,fetch"  # The workers' consumers: their fetches too (what offsets came back).
JOIN_TIMEOUT_S = 2 * CALL_TIMEOUT_S * CALL_TRIES + 10.0  # A worker finishing its transaction.


def client_logger(directory: Path | None) -> logging.Logger | None:
    """A logger writing the workers' librdkafka debug lines to CLIENT_LOG_FILE in `directory` (kept
    with the node logs of a failed run: what a stuck transactional call was waiting for)."""
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    client_log = logging.getLogger(f"kq.chaos.rdkafka.{directory}")
    client_log.propagate = False
    client_log.setLevel(logging.DEBUG)
    handler = logging.FileHandler(directory / CLIENT_LOG_FILE)
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    client_log.addHandler(handler)
    return client_log


def _debugged(
    config: dict[str, Any], client_log: logging.Logger | None, debug: str = CLIENT_DEBUG
) -> dict[str, Any]:
    return config if client_log is None else {**config, "debug": debug, "logger": client_log}


def _count(history: ExactlyOnceHistory, name: str) -> None:
    history.counters[name] += 1  # One thread per counter name prefix; a lost increment costs a count.


def _error_name(error: KafkaError) -> str:
    return str(error.name()).lower()


class Feeder(threading.Thread):
    """Writes the input: the backlog, then a steady rate, every record to an explicit partition."""

    def __init__(self, bootstrap: str, partitions: int, history: ExactlyOnceHistory) -> None:
        super().__init__(name="eos-feeder", daemon=True)
        self._servers = bootstrap
        self._partitions = partitions
        self._history = history
        self._stopping = threading.Event()
        self.seeded = threading.Event()
        self.sent = 0
        self.failed = 0

    def stop(self) -> None:
        """Stops after the current record; `run` then flushes what is in flight."""
        self._stopping.set()

    def _producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self._servers,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed += 1
            _count(self._history, f"feeder_{_error_name(error)}")

    def _send(self, producer: Producer) -> Producer:
        """Sends the next record; returns the producer to go on with (a new one after a fatal error:
        the record is then not sent, and the input simply lacks it)."""
        partition = self.sent % self._partitions
        key = f"key-{self.sent % KEYS}".encode()
        value = f"in-{self.sent}".encode()
        self.sent += 1
        while True:
            try:
                producer.produce(INPUT_TOPIC, value, key, partition=partition, on_delivery=self._delivered)
                break
            except BufferError:
                producer.poll(0.1)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                _count(self._history, f"feeder_{_error_name(error)}")
                return self._producer() if error.fatal() else producer
        producer.poll(0)
        return producer

    def run(self) -> None:
        producer = self._producer()
        for _ in range(SEED_RECORDS):
            producer = self._send(producer)
        producer.flush(CALL_TIMEOUT_S)
        self.seeded.set()
        interval_s = 1.0 / FEED_RATE_PER_S
        next_s = time.monotonic()
        while not self._stopping.wait(max(0.0, next_s - time.monotonic())):
            next_s = max(next_s + interval_s, time.monotonic())
            producer = self._send(producer)
        left = producer.flush(READ_TIMEOUT_S)
        if left:
            _count(self._history, "feeder_unflushed")
        self._history.counters["input_sent"] = self.sent


class Outcome:
    """How one transaction ended."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    FATAL = "fatal"


class Worker(threading.Thread):
    """One transactional consume-transform-produce loop: a consumer of the group, a producer of its own
    transactional id (recreated when fenced)."""

    def __init__(
        self, number: int, bootstrap: str, history: ExactlyOnceHistory, client_log: logging.Logger | None
    ) -> None:
        super().__init__(name=f"eos-worker-{number}", daemon=True)
        self._client_log = client_log
        self.call: tuple[str, float] | None = None  # The client call in progress and when it began.
        self.worker = f"w{number}"
        self._transactional_id = f"eos-{number}"
        self._servers = bootstrap
        self._history = history
        self._stopping = threading.Event()

    def stop(self) -> None:
        """Stops after the current transaction."""
        self._stopping.set()

    def _call(self, name: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, noted in `self.call` while it runs (a call stuck past its timeout shows)."""
        self.call = (name, time.monotonic())
        try:
            return call(*args)
        finally:
            self.call = None

    def overdue(self, now_s: float) -> str | None:
        """The call this worker is stuck in, if it ran past CALL_OVERDUE_S."""
        call = self.call
        if call is None or now_s - call[1] < CALL_OVERDUE_S:
            return None
        return f"{self.worker} in {call[0]} for {now_s - call[1]:.0f} s"

    def _consumer(self) -> Consumer:
        consumer = Consumer(
            _debugged(
                {
                    "bootstrap.servers": self._servers,
                    "group.id": GROUP,
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": SESSION_TIMEOUT_MS,
                    "heartbeat.interval.ms": 1_000,
                    "partition.assignment.strategy": "range",
                    "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
                },
                self._client_log,
                CONSUMER_DEBUG,
            )
        )
        consumer.subscribe([INPUT_TOPIC])
        return consumer

    def _producer(self) -> Producer | None:
        """A producer whose init_transactions succeeded (None: not this time; the loop tries again)."""
        producer = Producer(
            _debugged(
                {
                    "bootstrap.servers": self._servers,
                    "transactional.id": self._transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "message.timeout.ms": TRANSACTION_TIMEOUT_MS,
                },
                self._client_log,
            )
        )
        for _ in range(CALL_TRIES):
            try:
                self._call("init_transactions", producer.init_transactions, CALL_TIMEOUT_S)
                return producer
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                _count(self._history, f"init_{_error_name(error)}")
                if not error.retriable():
                    break
        return None

    def run(self) -> None:
        consumer = self._consumer()
        producer: Producer | None = None
        try:
            while not self._stopping.is_set():
                if producer is None:
                    producer = self._producer()
                    _count(self._history, "producers_started")
                    if producer is None:
                        continue
                records = self._poll(consumer)
                if not records:
                    continue
                outcome = self._transaction(producer, consumer, records)
                if outcome != Outcome.COMMITTED:
                    _count(self._history, f"transactions_{outcome}")
                    if outcome == Outcome.FATAL:
                        producer = None  # Recreated: init_transactions fences it and ends its transaction.
                    consumer = self._rewind(consumer)
        finally:
            consumer.close()

    def _poll(self, consumer: Consumer) -> list[Message]:
        records = []
        try:
            messages = self._call("consume", consumer.consume, BATCH_RECORDS_MAX, POLL_TIMEOUT_S)
        except KafkaException as exc:
            _count(self._history, f"consume_{_error_name(exc.args[0])}")
            return []
        for message in messages:
            error = message.error()
            if error is None:
                records.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                _count(self._history, f"consume_{_error_name(error)}")
        return records

    def _transaction(self, producer: Producer, consumer: Consumer, records: Sequence[Message]) -> str:
        """One transaction of the batch: its output records and its input offsets."""
        next_offsets: dict[int, int] = {}
        try:
            self._call("begin_transaction", producer.begin_transaction)
            for message in records:
                partition, offset, value = message.partition(), message.offset(), message.value()
                assert partition is not None and offset is not None and value is not None
                output = transformed(INPUT_TOPIC, partition, offset, value)
                self._produce(producer, output, message.key(), partition)
                next_offsets[partition] = max(next_offsets.get(partition, 0), offset + 1)
            offsets = [TopicPartition(INPUT_TOPIC, p, o) for p, o in sorted(next_offsets.items())]
            metadata = consumer.consumer_group_metadata()
            self._call(
                "send_offsets_to_transaction",
                producer.send_offsets_to_transaction,
                offsets,
                metadata,
                CALL_TIMEOUT_S,
            )
            self._retried(producer.commit_transaction, "commit_transaction")
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            _count(self._history, f"transaction_{_error_name(error)}")
            if error.fatal():
                return Outcome.FATAL
            try:
                self._retried(producer.abort_transaction, "abort_transaction")
            except KafkaException:
                return Outcome.FATAL
            return Outcome.ABORTED
        self._history.commits.append(
            TransactionCommit(self.worker, tuple(sorted(next_offsets.items())), time.monotonic())
        )
        return Outcome.COMMITTED

    @staticmethod
    def _produce(producer: Producer, value: bytes, key: bytes | None, partition: int) -> None:
        while True:
            try:
                producer.produce(OUTPUT_TOPIC, value, key, partition=partition)
                return
            except BufferError:
                producer.poll(0.1)

    def _retried(self, call: Callable[[float], Any], what: str) -> None:
        """`call` (commit or abort), again after a retriable error, CALL_TRIES times at most."""
        for attempt in range(CALL_TRIES):
            try:
                self._call(what, call, CALL_TIMEOUT_S)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not error.retriable() or attempt == CALL_TRIES - 1:
                    raise
                _count(self._history, f"{what}_retried_{_error_name(error)}")

    def _rewind(self, consumer: Consumer) -> Consumer:
        """Seeks every assigned partition back to the group's committed offset (the beginning where
        none is); when that fails, a new consumer (it rejoins and starts from the committed offsets)."""
        try:
            assignment = consumer.assignment()
            if assignment:
                for position in self._call("committed", consumer.committed, assignment, CALL_TIMEOUT_S):
                    offset = position.offset if position.offset >= 0 else OFFSET_BEGINNING
                    consumer.seek(TopicPartition(position.topic, position.partition, offset))
            return consumer
        except KafkaException as exc:
            _count(self._history, f"rewind_{_error_name(exc.args[0])}")
        consumer.close()
        _count(self._history, "consumers_recreated")
        return self._consumer()


class OffsetWatcher(threading.Thread):
    """Polls the group's committed input offsets, as a worker taking a partition over reads them."""

    def __init__(
        self,
        bootstrap: str,
        partitions: int,
        history: ExactlyOnceHistory,
        client_log: logging.Logger | None = None,
    ) -> None:
        super().__init__(name="eos-offset-watcher", daemon=True)
        self._history = history
        self._partitions = partitions
        self._stopping = threading.Event()
        self._consumer = Consumer(
            _debugged(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": GROUP,
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                },
                client_log,
            )
        )

    def stop(self) -> None:
        """Stops after the current poll."""
        self._stopping.set()

    def committed(self) -> dict[int, int | None] | None:
        """One OffsetFetch: partition -> committed offset (None: none), or None when it failed."""
        requested_s = time.monotonic()
        try:
            answer = self._consumer.committed(
                [TopicPartition(INPUT_TOPIC, p) for p in range(self._partitions)], CALL_TIMEOUT_S
            )
        except KafkaException as exc:
            _count(self._history, f"offset_poll_{_error_name(exc.args[0])}")
            return None
        offsets = {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in answer}
        self._history.polls.append(OffsetPoll(requested_s, time.monotonic(), tuple(sorted(offsets.items()))))
        return offsets

    def close(self) -> None:
        """Closes its consumer (the thread does it when it stops)."""
        self._consumer.close()

    def run(self) -> None:
        try:
            while not self._stopping.wait(OFFSET_POLL_S):
                self.committed()
        finally:
            self.close()


class ExactlyOnce:
    """The feeder, the workers and the watcher of one run."""

    def __init__(self, bootstrap: str, partitions: int, log_dir: Path | None = None) -> None:
        """`log_dir`: where the workers' librdkafka debug lines go (None: nowhere)."""
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.history = ExactlyOnceHistory()
        self.feeder = Feeder(bootstrap, partitions, self.history)
        client_log = client_logger(log_dir)
        self.workers = [Worker(number, bootstrap, self.history, client_log) for number in range(WORKERS)]
        self.watcher = OffsetWatcher(bootstrap, partitions, self.history, client_log)
        self._stopped = False

    def start(self, origin_s: float) -> None:
        """Starts the feeder, then (once the backlog is written) the workers and the watcher."""
        self.history.origin_s = origin_s
        self.feeder.start()
        if not self.feeder.seeded.wait(READ_TIMEOUT_S):
            raise TimeoutError(f"the input's backlog of {SEED_RECORDS} records not written in time")
        for thread in [*self.workers, self.watcher]:
            thread.start()

    def finish(self) -> list[str]:
        """Stops the feeder, waits until the group committed the whole input, stops everything;
        returns what went wrong (liveness)."""
        problems = self.stop_feeder()
        try:
            ends = log_ends(self.bootstrap, INPUT_TOPIC, self.partitions)
        except KafkaException as error:
            return [*problems, f"the input's log ends not read: {error}", *self.stop()]
        deadline_s = time.monotonic() + CATCH_UP_TIMEOUT_S
        committed: dict[int, int | None] | None = None
        while time.monotonic() < deadline_s:
            committed = self.watcher.committed()
            if committed is not None and all(committed.get(p) == end for p, end in ends.items()):
                break
            time.sleep(OFFSET_POLL_S)
        else:
            problems.append(
                f"the workers did not commit the whole input within {CATCH_UP_TIMEOUT_S:.0f} s: "
                f"committed {committed}, input ends {ends}"
            )
        now_s = time.monotonic()
        stuck = [where for worker in self.workers if (where := worker.overdue(now_s)) is not None]
        if stuck:
            problems.append(f"client calls past their {CALL_TIMEOUT_S:.0f} s timeout: {'; '.join(stuck)}")
        return problems + self.stop()

    def stop_feeder(self) -> list[str]:
        """Stops the feeder (flushing what it sent); whether it is still running."""
        self.feeder.stop()
        if self.feeder.is_alive():
            self.feeder.join(READ_TIMEOUT_S + 5.0)
        return ["the input feeder did not stop"] if self.feeder.is_alive() else []

    def stop(self) -> list[str]:
        """Stops every thread (idempotent); returns those still running."""
        self.stop_feeder()
        threads: list[Worker | OffsetWatcher] = [*self.workers, self.watcher]
        for thread in threads:
            thread.stop()
        # Once only: a thread stuck in a client call is left (a daemon) after the first stop.
        deadline_s = time.monotonic() + (0.0 if self._stopped else JOIN_TIMEOUT_S)
        self._stopped = True
        for thread in threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline_s - time.monotonic()))
        return [f"{thread.name} still running" for thread in threads if thread.is_alive()]

    def read_final(self) -> ExactlyOnceFinal:
        """The input, the output as read_committed reads it, and the group's final committed offsets."""
        watcher = OffsetWatcher(self.bootstrap, self.partitions, ExactlyOnceHistory())
        try:
            # Asked again after a failure (the coordinator just moved, say): one failed OffsetFetch is
            # no answer, and would read as "nothing committed".
            deadline_s = time.monotonic() + READ_TIMEOUT_S
            answer = watcher.committed()
            while answer is None and time.monotonic() < deadline_s:
                time.sleep(OFFSET_POLL_S)
                answer = watcher.committed()
            final_committed = answer or {}
        finally:
            watcher.close()
        inputs, input_bounds = read_topic(self.bootstrap, INPUT_TOPIC, self.partitions, "read_uncommitted")
        outputs, output_bounds = read_topic(self.bootstrap, OUTPUT_TOPIC, self.partitions, "read_committed")
        return ExactlyOnceFinal(
            {p: [InputRecord(p, m.offset() or 0, m.value() or b"") for m in ms] for p, ms in inputs.items()},
            {p: end for p, (_, end) in input_bounds.items()},
            {p: [OutputRecord(p, m.offset() or 0, m.value()) for m in ms] for p, ms in outputs.items()},
            output_bounds,
            final_committed,
        )


def _reader(bootstrap: str, isolation: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"eos-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def read_topic(
    bootstrap: str, topic: str, partitions: int, isolation: str
) -> tuple[dict[int, list[Message]], dict[int, tuple[int, int]]]:
    """Every record of `topic` an `isolation` consumer reads, by partition, and each partition's
    (end it read to, log end): a read_committed reader ends at the last stable offset."""
    ends = log_ends(bootstrap, topic, partitions)
    reader = _reader(bootstrap, isolation)
    records: dict[int, list[Message]] = {p: [] for p in range(partitions)}
    reached: dict[int, int] = {}
    try:
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline_s = time.monotonic() + READ_TIMEOUT_S
        while time.monotonic() < deadline_s and not all(reached.get(p, -1) >= ends[p] for p in ends):
            message = reader.poll(0.5)
            if message is None:
                continue
            partition, offset, error = message.partition(), message.offset(), message.error()
            assert partition is not None
            if error is None:
                records[partition].append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                reached[partition] = int(offset or 0)
            else:
                logger.warning("reading %s: %s", topic, error)
    finally:
        reader.close()
    return records, {p: (reached.get(p, 0), end) for p, end in ends.items()}


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's log end (high-water mark) of `topic`. A new consumer may not know the
    partitions yet (UNKNOWN_PARTITION until its metadata arrives): asked again until READ_TIMEOUT_S,
    after which the last error is raised."""
    reader = _reader(bootstrap, "read_uncommitted")
    deadline_s = time.monotonic() + READ_TIMEOUT_S
    ends: dict[int, int] = {}
    try:
        while len(ends) < partitions:
            partition = len(ends)
            try:
                watermarks = reader.get_watermark_offsets(TopicPartition(topic, partition), CALL_TIMEOUT_S)
            except KafkaException:
                if time.monotonic() >= deadline_s:
                    raise
                time.sleep(OFFSET_POLL_S)
                # A consumer subscribed to nothing may never ask for the topic's metadata by itself
                # (UNKNOWN_PARTITION for a whole minute was seen): ask for it.
                with contextlib.suppress(KafkaException):
                    reader.list_topics(topic, CALL_TIMEOUT_S)
                continue
            ends[partition] = int(watermarks[1])
        return ends
    finally:
        reader.close()
