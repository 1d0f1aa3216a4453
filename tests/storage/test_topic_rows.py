"""A deleted topic's producer state and committed offsets are found by topic (no scan of every
producer or group) and deleted in bounded steps; stores of the older layout are upgraded at open."""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb

from kq.proto.records import NewRecord, encode_batch
from kq.storage import ProducerAppend, Store
from kq.storage.store import DATABASE_NAMES, LAYOUT_VERSION, MAX_DATABASES


def rows(store: Store, database: bytes) -> list[tuple[bytes, bytes]]:
    return [(key, value) for name, key, value in store.dump() if name == database]


def fill(store: Store) -> tuple[int, int]:
    """Two topics of two partitions, each with producer state of 3 producers and offsets of 2 groups."""
    with store.write() as writer:
        doomed, kept = writer.create_topic("doomed", 2, 0), writer.create_topic("kept", 2, 0)
        for topic in (doomed, kept):
            for partition in range(2):
                writer.append(topic.topic_id, partition, encode_batch([NewRecord(b"k", b"v", (), 1)]))
                for producer_id in (1, 2, 3):
                    append = ProducerAppend(0, 1, 0)
                    writer.remember_producer_append(
                        producer_id, topic.topic_id, partition, 0, append, None, appended_ms=0
                    )
                for group in ("g1", "g2"):
                    writer.commit_offset(group, topic.topic_id, partition, 1, 5)
    return doomed.topic_id, kept.topic_id


def test_a_deleted_topics_rows_go_in_bounded_purges_and_nothing_else_does(tmp_path: Path) -> None:
    """Each purge deletes at most its bound of rows; in the end only the kept topic's rows remain."""
    store = Store.open(tmp_path / "store")
    doomed_id, kept_id = fill(store)
    kept_before = {
        name: [row for row in rows(store, name) if row[0][:8] == struct.pack(">Q", kept_id)]
        for name in (b"producers", b"offset_topics", b"records")
    }
    with store.read() as reader:
        doomed = reader.topic("doomed")
    assert doomed is not None
    with store.write() as writer:
        assert not writer.delete_topic(doomed, 3)  # 2 batches + 6 producer rows + 4 offsets: 12 rows.
    steps = 1
    while True:
        before = len(store.dump())
        with store.write() as writer:
            done = writer.purge(doomed_id, 3)
        assert before - len(store.dump()) <= 3 * 2 + (1 if done else 0)  # An offset is two rows.
        steps += 1
        if done:
            break
    assert steps == 4  # 12 rows, 3 a step.
    with store.read() as reader:
        assert reader.purges() == []
        assert {t for t, *_ in reader.committed_offsets("g1")} == {kept_id}
        assert reader.producer_window(1, doomed_id, 0) is None
        assert reader.producer_window(1, kept_id, 1) is not None
    for name, kept_rows in kept_before.items():
        assert rows(store, name) == kept_rows
    assert len(rows(store, b"offsets")) == 4
    store.close()


def test_deleting_a_group_deletes_its_rows_by_topic_too(tmp_path: Path) -> None:
    """The `offset_topics` index never names an offset that is gone."""
    store = Store.open(tmp_path / "store")
    fill(store)
    with store.write() as writer:
        writer.delete_group("g1")
    assert len(rows(store, b"offsets")) == len(rows(store, b"offset_topics")) == 4
    assert all(key.endswith(b"g2") for key, _ in rows(store, b"offset_topics"))
    store.close()


def test_a_store_of_the_older_layout_is_upgraded_at_open(tmp_path: Path) -> None:
    """Producer rows keyed by producer first are re-keyed by topic; the offset index is built; an
    upgraded store equals one written in the new layout from the start."""
    new = Store.open(tmp_path / "new")
    fill(new)
    expected = new.dump()
    new.close()
    environment = lmdb.open(str(tmp_path / "new"), max_dbs=MAX_DATABASES, subdir=True)
    old_path = tmp_path / "old"
    old = lmdb.open(str(old_path), max_dbs=MAX_DATABASES, subdir=True, map_size=1 << 30)
    with environment.begin() as source, old.begin(write=True) as target:  # What kq wrote before.
        for name in DATABASE_NAMES:
            source_db, target_db = environment.open_db(name, txn=source), old.open_db(name, txn=target)
            for key, value in source.cursor(db=source_db):
                if name == b"offset_topics" or (name == b"meta" and key == b"layout"):
                    continue
                if name == b"producers":
                    topic_id, partition, producer_id = struct.unpack(">QIQ", key)
                    target.put(struct.pack(">QQI", producer_id, topic_id, partition), value, db=target_db)
                else:
                    target.put(key, value, db=target_db)
    environment.close()
    old.close()
    upgraded = Store.open(old_path)
    try:
        assert upgraded.dump() == expected
        assert (b"meta", b"layout", struct.pack(">Q", LAYOUT_VERSION)) in expected
    finally:
        upgraded.close()
