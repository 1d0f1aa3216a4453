"""The kq-kafka column of `python -m kq.bench.compare`: kq driven through its Kafka port by confluent-kafka.

A `--quick --systems kq-kafka` run (never speed): every scenario must report a positive rate, so a
broken Kafka path (produce, delivery reports, fetch from the beginning, failover retries) fails here
rather than in a long benchmark run. The report pieces are checked on synthetic runs.
"""

from __future__ import annotations

from typing import Any

import click
import pytest

from kq.bench.compare import merge_round, parse_durabilities, parse_systems
from kq.bench.compare_report import build_document, markdown
from kq.bench.side_by_side import (
    CONSUME,
    FAILOVER,
    LATENCY,
    PRODUCE_LARGE,
    PRODUCE_SMALL,
    PRODUCE_SMALL_THREADS,
    SCENARIOS,
    SYSTEMS,
    column_for,
)
from tests.bench.quick import report_meta

QUICK_RUN_TIMEOUT_S = 300.0  # A quick run takes about twenty seconds; this only bounds a hung cluster.
RATE_FIGURES = {
    LATENCY: "latency_msgs_per_s",
    PRODUCE_SMALL: "produce_100b_msgs_per_s",
    PRODUCE_LARGE: "produce_1kib_msgs_per_s",
    CONSUME: "consume_msgs_per_s",
}


def test_systems_option_takes_commas_and_keeps_the_report_order() -> None:
    """`--systems nats,kq-kafka` and repeated values both work; the default is every system."""
    assert parse_systems(("nats,kq-kafka",)) == ("kq-kafka", "nats")
    assert parse_systems(("kq", "nats")) == ("kq", "nats")
    assert parse_systems(()) == SYSTEMS == ("kq", "kq-kafka", "nats")


def _throughput(scenario: str, rate: float) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "run": 1,
        "sample": {
            "records": int(rate),
            "payload_bytes": int(rate) * 100,
            "requests": 1,
            "errors": 0,
            "elapsed_s": 1.0,
        },
        "server_cpu_s": {"1": 1.0},
        "client_cpu_s": 0.5,
        "wall_s": 1.0,
        "host_cpu_busy": 0.5,
        "host_cpu_s": 2.0,
    }


def test_report_gives_kq_kafka_its_own_ratio_to_nats() -> None:
    """kq-kafka sits beside kq and NATS with its own ratio; kq's gRPC-only send_batch rows stay empty."""
    raws = {
        name: {"system": name, "describe": {"client": name}, "runs": [_throughput(PRODUCE_SMALL, rate)]}
        for name, rate in (("kq", 30_000.0), ("kq-kafka", 20_000.0), ("nats", 40_000.0))
    }
    meta = report_meta(command="compare")
    document = build_document(meta, {"runs": 1}, raws)
    rows = {row["key"]: row for row in document["figures"]}
    produce = rows["produce_100b_msgs_per_s"]
    assert produce["ratios"] == {"kq": pytest.approx(0.75), "kq-kafka": pytest.approx(0.5)}
    assert produce["ratio"] == pytest.approx(0.75)
    assert "kq-kafka" not in rows["send_batch_100b_msgs_per_s"]
    text = markdown(document)
    assert "| kq | kq (Kafka) | NATS | kq/NATS | kq (Kafka)/NATS | better |" in text
    assert "| 0.75 | 0.50 |" in text


def test_durability_option_takes_both_modes_and_names_their_columns() -> None:
    """`--kq-durability replicated,fsync` keeps the order; fsync runs get their own "-fsync" column."""
    assert parse_durabilities("replicated, fsync,replicated") == ("replicated", "fsync")
    assert parse_durabilities("fsync") == ("fsync",)
    for bad in ("", "sync", "fsync,power"):
        with pytest.raises(click.BadParameter):
            parse_durabilities(bad)
    assert [column_for("kq", d) for d in ("replicated", "fsync")] == ["kq", "kq-fsync"]
    assert column_for("kq-kafka", "fsync") == "kq-kafka-fsync" and column_for("nats", "replicated") == "nats"


def test_interleaved_rounds_add_up_to_one_column_numbered_by_round() -> None:
    """Round N's single run of a system joins its column as run N; a plain run keeps its own numbers."""
    raws: dict[str, dict[str, Any]] = {}
    for round_number in (1, 2, 3):
        raw = {"system": "kq", "describe": {"client": "kq"}, "runs": [_throughput(PRODUCE_SMALL, 1.0)]}
        merge_round(raws, "kq-fsync", raw, round_number)
    assert [run["run"] for run in raws["kq-fsync"]["runs"]] == [1, 2, 3]
    merge_round(raws, "nats", {"system": "nats", "describe": {}, "runs": [{"run": 7}]}, None)
    assert raws["nats"]["runs"] == [{"run": 7}]


def test_report_puts_kq_fsync_beside_kq_with_its_send_batch_rows() -> None:
    """A kq-fsync column gets its own ratio to NATS and, being kq's gRPC client, the send_batch rows."""
    raws = {
        name: {
            "system": name.removesuffix("-fsync"),
            "describe": {"client": name},
            "runs": [_throughput(PRODUCE_SMALL, rate), _throughput(PRODUCE_SMALL_THREADS, 2 * rate)],
        }
        for name, rate in (("kq", 30_000.0), ("kq-fsync", 10_000.0), ("nats", 40_000.0))
    }
    meta = report_meta(
        command="compare", load_average_start=[1.0, 2.0, 3.0], load_average_end=[4.0, 5.0, 6.0]
    )
    document = build_document(meta, {"runs": 1}, raws)
    rows = {row["key"]: row for row in document["figures"]}
    ratios = rows["produce_100b_msgs_per_s"]["ratios"]
    assert ratios == {"kq": pytest.approx(0.75), "kq-fsync": pytest.approx(0.25)}
    assert rows["send_batch_100b_msgs_per_s"]["kq-fsync"]["median"] == pytest.approx(20_000.0)
    text = markdown(document)
    assert "| kq | kq (fsync) | NATS | kq/NATS | kq (fsync)/NATS | better |" in text
    assert "at the start: 1.00, 2.00, 3.00; at the end: 4.00, 5.00, 6.00" in text


def check_quick_kq_kafka(document: dict[str, Any]) -> None:
    """What a `--quick` run that includes kq-kafka (tests/bench/test_compare.py runs every system once,
    so the Kafka port is not started a second time) must report: every scenario moved messages."""
    system = document["systems"]["kq-kafka"]
    assert [run["scenario"] for run in system["runs"]] == list(SCENARIOS)
    assert all(len(run["server_cpu_s"]) >= 2 for run in system["runs"])  # Measured on the node PIDs.
    rows = {row["key"]: row for row in document["figures"]}
    for scenario, key in RATE_FIGURES.items():
        assert rows[key]["kq-kafka"]["median"] > 0, scenario
        assert system["scenarios"][scenario]["summary"]["errors"]["max"] == 0, scenario
    assert 0 < rows["latency_p50_ms"]["kq-kafka"]["median"] <= rows["latency_p99_ms"]["kq-kafka"]["median"]
    failover = system["scenarios"][FAILOVER]["run_metrics"][0]
    assert failover["gap_missing"] == 0  # Writes were acknowledged again after the kill.
    sample = system["runs"][-1]["sample"]
    assert sample["acks_after_kill"] / sample["window_s"] > 0
