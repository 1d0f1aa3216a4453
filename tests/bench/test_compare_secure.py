"""`python -m kq.bench.compare --kq-security`: the kq systems measured with TLS on, in columns of their own.

The option and the column names are checked alone; a `--quick --systems kq,kq-kafka --kq-security tls`
run (about 25 s quiet, 50 s loaded) must measure every scenario over TLS (gRPC with mutual TLS, and
the Kafka listener with SSL), with the certificates made into the run's directory and the nodes
checked to refuse plain text before the first scenario.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from kq.bench.compare import parse_securities
from kq.bench.compare_report import LABELS, build_document, markdown
from kq.bench.side_by_side import COLUMNS, KQ_GRPC_COLUMNS, PRODUCE_SMALL, SCENARIOS, column_for
from tests.bench.quick import report_meta, run_quick

QUICK_RUN_TIMEOUT_S = 300.0  # Two quick systems take 25-50 s; this only bounds a hung cluster.
RATE_FIGURES = (
    "latency_msgs_per_s",
    "produce_100b_msgs_per_s",
    "produce_1kib_msgs_per_s",
    "consume_msgs_per_s",
)


def test_security_option_takes_both_modes_and_names_their_columns() -> None:
    """`--kq-security plain,tls` keeps the order; TLS runs get a "-tls" column after any durability's."""
    assert parse_securities("plain, tls,plain") == ("plain", "tls")
    assert parse_securities("tls") == ("tls",)
    for bad in ("", "ssl", "tls,mtls"):
        with pytest.raises(click.BadParameter):
            parse_securities(bad)
    assert column_for("kq", "replicated", "tls") == "kq-tls"
    assert column_for("kq-kafka", "fsync", "tls") == "kq-kafka-fsync-tls"
    assert column_for("kq", "fsync") == "kq-fsync" and column_for("nats", "replicated", "plain") == "nats"
    assert set(LABELS) == set(COLUMNS), "every column has a label"
    assert "kq-tls" in KQ_GRPC_COLUMNS and "kq-kafka-tls" not in KQ_GRPC_COLUMNS


def _produce(rate: float) -> dict[str, Any]:
    return {
        "scenario": PRODUCE_SMALL,
        "run": 1,
        "sample": {"records": int(rate), "payload_bytes": int(rate) * 100, "requests": 1, "errors": 0,
                   "elapsed_s": 1.0},
        "server_cpu_s": {"1": 1.0},
        "client_cpu_s": 0.5,
        "wall_s": 1.0,
        "host_cpu_busy": 0.5,
        "host_cpu_s": 2.0,
    }  # fmt: skip


def test_report_puts_the_tls_column_beside_the_plain_one() -> None:
    """kq (TLS) sits right after kq, before kq (Kafka), each with its own ratio to NATS."""
    raws = {
        name: {"system": name.removesuffix("-tls"), "describe": {"client": name}, "runs": [_produce(rate)]}
        for name, rate in (("nats", 40_000.0), ("kq-kafka", 20_000.0), ("kq-tls", 10_000.0), ("kq", 30_000.0))
    }
    document = build_document(report_meta(command="compare"), {"runs": 1}, raws)
    produce = next(row for row in document["figures"] if row["key"] == "produce_100b_msgs_per_s")
    assert produce["ratios"] == {
        "kq": pytest.approx(0.75),
        "kq-kafka": pytest.approx(0.5),
        "kq-tls": pytest.approx(0.25),
    }
    text = markdown(document)
    assert (
        "| kq | kq (TLS) | kq (Kafka) | NATS | kq/NATS | kq (TLS)/NATS | kq (Kafka)/NATS | better |" in text
    )


@pytest.mark.system
@pytest.mark.bench
def test_quick_secure_run_measures_every_scenario_over_tls(tmp_path: Path) -> None:
    """`--quick --systems kq --kq-security tls`: kq ran every scenario on a cluster with certificates
    in its directory, moved messages, and says how it was secured. (The Kafka port's TLS column is
    the same cluster setup with librdkafka over SSL; the default suite's secure chaos run covers
    Kafka clients over TLS, so it is not measured again here.)"""
    document, _ = run_quick(
        "kq.bench.compare", tmp_path, QUICK_RUN_TIMEOUT_S, ["--systems", "kq", "--kq-security", "tls"]
    )

    assert list(document["systems"]) == ["kq-tls"]
    assert document["settings"]["kq_securities"] == ["tls"]
    rows = {row["key"]: row for row in document["figures"]}
    for column, system in (("kq-tls", "kq"),):
        measured = document["systems"][column]
        assert {run["scenario"] for run in measured["runs"]} >= set(SCENARIOS), column
        assert "over TLS" in measured["describe"]["security"], column
        assert (tmp_path / "nodes" / column / system / "certs" / "admin.pem").is_file(), column
        for key in RATE_FIGURES:
            assert rows[key][column]["median"] > 0, (column, key)
        assert measured["scenarios"][PRODUCE_SMALL]["summary"]["errors"]["max"] == 0, column
    assert rows["send_batch_100b_msgs_per_s"]["kq-tls"]["median"] > 0
