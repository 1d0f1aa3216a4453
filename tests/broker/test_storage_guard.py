"""The leader's disk bound: the headroom decision (pure), the guard's measuring and counting, and the
edge in-process: writes that grow the store are refused with STORAGE_FULL, reads and deletes are not."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from kq.broker.config import ConfigError, parse_byte_size
from kq.broker.errors import StorageFullError
from kq.broker.main import main
from kq.broker.storage_guard import (
    StorageGuard,
    disk_room_bytes,
    headroom_bytes,
    map_room_bytes,
    storage_problem,
)
from kq.proto import kq_pb2
from kq.proto.errors import ERROR_TABLE, ErrorCode, code_from_metadata
from kq.proto.limits import DISK_HEADROOM_BYTES_MAX, DISK_HEADROOM_BYTES_MIN
from kq.storage import StoreUsage
from tests.broker.conftest import Edge, produce

MIB = 1024 * 1024
GIB = 1024 * MIB
ROOMY_DISK = 100 * GIB


def usage(
    map_mib: int, used_mib: float, file_mib: float | None = None, free_bytes: int = ROOMY_DISK
) -> StoreUsage:
    used = int(used_mib * MIB)
    return StoreUsage(
        map_mib * MIB, used, int((file_mib if file_mib is not None else used_mib) * MIB), free_bytes
    )


def test_headroom_is_five_percent_of_the_bound_within_its_floor_and_ceiling() -> None:
    """A small bound keeps the floor, a middling one 5 %, a huge one (the 64 GiB default) the ceiling."""
    assert headroom_bytes(64 * MIB) == DISK_HEADROOM_BYTES_MIN
    assert headroom_bytes(10 * GIB) == 512 * MIB
    assert headroom_bytes(64 * GIB) == DISK_HEADROOM_BYTES_MAX


def test_writes_go_until_the_map_is_within_its_headroom() -> None:
    """With 64 MiB of map the leader keeps 16 MiB free: 47 MiB used accepts a 1 MiB write, 48 refuses it."""
    assert storage_problem(usage(64, 47), 0, MIB) is None
    problem = storage_problem(usage(64, 48), 0, MIB)
    assert problem is not None and "--max-disk-bytes" in problem and "48.0 MiB of its 64.0 MiB" in problem
    assert storage_problem(usage(64, 48), 0, 0) is None  # Exactly the headroom left: still room.


def test_bytes_accepted_since_the_measure_count_against_the_room() -> None:
    """A burst between two measures cannot overshoot: what was accepted is counted as stored."""
    measured = usage(64, 40)
    assert storage_problem(measured, 7 * MIB, MIB) is None
    assert storage_problem(measured, 8 * MIB, MIB) is not None


def test_refusals_end_only_when_a_whole_entry_fits_again() -> None:
    """Hysteresis: at 44 MiB of 64 a 1 MiB write fits the headroom, but after a refusal it is refused
    until the room also holds one full entry (3.5 MiB), so the edge does not flap."""
    assert storage_problem(usage(64, 44), 0, MIB) is None
    assert storage_problem(usage(64, 44), 0, MIB, refusing=True) is not None
    assert storage_problem(usage(64, 43), 0, MIB, refusing=True) is None


def test_a_nearly_full_disk_refuses_below_the_bound() -> None:
    """The filesystem's free bytes bound the store too, and the refusal says it is the disk."""
    low_disk = usage(1024, 100, free_bytes=40 * MIB)  # headroom of a 1 GiB map: 51.2 MiB.
    problem = storage_problem(low_disk, 0, 0)
    assert problem is not None and "its disk has 40.0 MiB free" in problem
    assert disk_room_bytes(low_disk) < map_room_bytes(low_disk)


def test_pages_freed_inside_the_file_are_room_on_a_full_disk() -> None:
    """After retention, LMDB reuses freed pages below its high-water mark without growing the file: a
    disk with nothing free still takes writes into them."""
    trimmed = usage(1024, 100, file_mib=900, free_bytes=0)
    assert storage_problem(trimmed, 0, MIB) is None
    assert disk_room_bytes(trimmed) == 800 * MIB


class FakeMeasure:
    """A store whose usage the test sets, counting how often it is measured."""

    def __init__(self, measured: StoreUsage) -> None:
        self.usage = measured
        self.calls = 0

    def __call__(self) -> StoreUsage:
        self.calls += 1
        return self.usage


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_the_guard_measures_once_per_interval_and_counts_what_it_accepts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Between measures the guard counts accepted bytes; the refusal is STORAGE_FULL; one log line when
    refusals start and one when they end."""
    measure, clock = FakeMeasure(usage(64, 40)), FakeClock()
    guard = StorageGuard(measure, "7", clock, interval_s=1.0)
    caplog.set_level(logging.INFO, logger="kq.broker.storage_guard")
    for _ in range(8):
        guard.check(MIB)  # 40 + 8 MiB: the headroom of 16 MiB is reached exactly.
    with pytest.raises(StorageFullError) as refused:
        guard.check(MIB)
    assert refused.value.code == ErrorCode.STORAGE_FULL and "node 7 refuses writes" in str(refused.value)
    assert measure.calls == 1
    with pytest.raises(StorageFullError):
        guard.check(100)  # Refusing: a small write does not slip in under the large ones refused.
    clock.now_s += 1.0
    measure.usage = usage(64, 10)  # Retention freed most of it.
    guard.check(MIB)
    assert measure.calls == 2
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("refusing writes that grow the store") and lines[1].startswith(
        "accepting writes"
    )


def test_storage_full_is_resource_exhausted_retriable_and_kafkas_storage_error() -> None:
    """The table's row: what gRPC and Kafka clients see, and that they may retry (space may be freed)."""
    spec = ERROR_TABLE[ErrorCode.STORAGE_FULL]
    assert (spec.status, spec.kafka_code, spec.retriable) == (grpc.StatusCode.RESOURCE_EXHAUSTED, 56, True)


def test_a_full_leader_refuses_growth_and_still_reads_trims_and_deletes(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process: Produce and CreateTopic answer RESOURCE_EXHAUSTED with STORAGE_FULL and change
    nothing; Fetch, DeleteRecords, config changes and DeleteTopic go through; once room returns, Produce
    does too."""
    measure = FakeMeasure(usage(64, 60))
    monkeypatch.setattr(edge.service, "_storage_guard", StorageGuard(measure, "1", interval_s=0.0))
    for rpc, request in (
        ("Produce", produce("t", 0, b"refused")),
        ("CreateTopic", kq_pb2.CreateTopicRequest(name="u", partitions=1)),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            getattr(edge.stub, rpc)(request)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert code_from_metadata(caught.value.trailing_metadata()) == ErrorCode.STORAGE_FULL
    fetched = edge.stub.Fetch(kq_pb2.FetchRequest(topic="t", partition=0, offset=0))
    assert [record.value for record in fetched.records] == [b"v", b"v", b"v"]
    edge.stub.DeleteRecords(kq_pb2.DeleteRecordsRequest(topic="t", partition=0, before_offset=2))
    alter = kq_pb2.AlterTopicConfigRequest(
        name="t", set=[kq_pb2.ConfigEntry(name="retention.ms", value="1000")]
    )
    edge.stub.AlterTopicConfig(alter)
    measure.usage = usage(64, 1)
    assert edge.stub.Produce(produce("t", 1, b"accepted")).base_offset == 0
    edge.stub.DeleteTopic(kq_pb2.DeleteTopicRequest(name="t"))


def test_max_disk_bytes_takes_bytes_or_binary_units_within_its_limits() -> None:
    """64MiB, 10 GiB or a plain number; decimal units (ambiguous) and bounds below 64 MiB are refused."""
    assert parse_byte_size("64MiB", "--max-disk-bytes") == 64 * MIB
    assert parse_byte_size("10 GiB", "--max-disk-bytes") == 10 * GIB
    assert parse_byte_size(str(100 * MIB), "--max-disk-bytes") == 100 * MIB
    for bad in ("1MiB", "64MB", "64 mb", "-64MiB", "", "17TiB"):
        with pytest.raises(ConfigError, match="--max-disk-bytes"):
            parse_byte_size(bad, "--max-disk-bytes")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_kq_node_refuses_a_bad_bound_before_starting(how: str, tmp_path: Path) -> None:
    """`kq-node --max-disk-bytes` (or KQ_MAX_DISK_BYTES) out of range: a usage error, nothing started."""
    arguments = ["--node-id", "1", "--grpc-address", "127.0.0.1:1", "--raft-address", "127.0.0.1:2"]
    arguments += ["--peers", "1=127.0.0.1:2=127.0.0.1:1", "--data-dir", str(tmp_path), "--secret", "s"]
    env = {"KQ_MAX_DISK_BYTES": "1MiB"} if how == "environment" else {}
    if how == "flag":
        arguments += ["--max-disk-bytes", "1MiB"]
    result = CliRunner().invoke(main, arguments, env=env)
    assert result.exit_code == 2 and "--max-disk-bytes must be between 64 MiB and 16 TiB" in result.output
    assert not any(tmp_path.iterdir())
