"""`kq.bench.floor`: the stack's own cost of one record in flight, beside kq's, measured on real
processes (the floors' three, a real kq cluster), and its table of medians."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kq.bench import floor
from kq.bench.floor import Round, table
from kq.bench.nats_cluster import NatsServerMissingError

REPO = Path(__file__).resolve().parents[2]
FLOOR_RUN_TIMEOUT_S = 240.0  # Four variants' processes start, 40 sends each, they stop: seconds.
USAGE_TIMEOUT_S = 60.0  # A usage error starts nothing: an import and an exit.


def test_the_table_gives_medians_over_rounds_and_the_range_of_rates() -> None:
    rounds = [
        Round(
            p50_ms=1.0,
            p99_ms=3.0,
            msgs_per_s=900.0,
            leader_cpu_us=300.0,
            followers_cpu_us=200.0,
            client_cpu_us=50,
        ),
        Round(
            p50_ms=2.0,
            p99_ms=9.0,
            msgs_per_s=500.0,
            leader_cpu_us=700.0,
            followers_cpu_us=400.0,
            client_cpu_us=70,
        ),
        Round(
            p50_ms=1.5,
            p99_ms=4.0,
            msgs_per_s=600.0,
            leader_cpu_us=400.0,
            followers_cpu_us=100.0,
            client_cpu_us=60,
        ),
    ]
    lines = table({"grpc": rounds}).splitlines()
    assert lines[0].startswith(
        "| variant | p50 ms | p99 ms | msgs/s | server CPU µs/msg | leader | followers |"
    )
    # Server CPU is each round's leader + followers (500, 1,100, 500), then the median of those.
    assert lines[2] == "| grpc | 1.50 | 4.00 | 600 (500..900) | 500 | 400 | 200 | 60 |"
    assert len(lines) == 3  # No round had a failed send: no line about them.


def test_failed_sends_are_listed_by_round_under_the_table() -> None:
    answered = Round(1.0, 2.0, 900.0, 300.0, 200.0, 50.0)
    failed = Round(1.0, 2.0, 900.0, 300.0, 200.0, 50.0, failed=2)
    text = table({"grpc+raft": [answered, failed, answered], "grpc": [answered]})
    assert text.endswith("\ngrpc+raft: sends answered with an error, by round: 0, 2, 0 (not timed)")


def test_kq_is_set_against_each_variant_round_by_round() -> None:
    """Each round's kq figure over the same round's figure of the variant, then their median: a slow
    minute of the machine falls on both figures of a round."""
    kq = [Round(2.0, 5.0, 500.0, 1000.0, 1000.0, 400.0), Round(1.2, 5.0, 800.0, 700.0, 500.0, 300.0)]
    kq.append(Round(1.8, 5.0, 550.0, 900.0, 900.0, 400.0))
    floor_rounds = [Round(1.0, 2.0, 900.0, 800.0, 200.0, 50.0), Round(1.0, 2.0, 900.0, 600.0, 400.0, 50.0)]
    floor_rounds.append(Round(1.2, 2.0, 900.0, 1000.0, 500.0, 50.0))
    text = table({"kq": kq, "grpc+raft+lmdb": floor_rounds, "grpc": floor_rounds[:2]})
    # p50 2.0, 1.2 and 1.5 times; server CPU 2.0, 1.2, 1.2 times. The medians of the sets would give
    # 1.8 / 1.0 = 1.8x and 1,800 / 1,000 = 1.8x. A variant with fewer rounds is not paired.
    assert text.endswith(
        "\nkq / grpc+raft+lmdb, the median of the rounds' ratios: p50 1.50x (2.00, 1.20, 1.50), "
        "server CPU 1.20x (2.00, 1.20, 1.20)"
    )
    assert "kq / grpc," not in text
    assert "kq /" not in table({"grpc": floor_rounds})
    # A round too short for /proc's CPU ticks measured no CPU: it has no CPU ratio (nor a failure).
    idle = [Round(1.0, 2.0, 900.0, 0.0, 0.0, 50.0), Round(1.0, 2.0, 900.0, 600.0, 400.0, 50.0)]
    text = table({"kq": kq[:2], "tcp": idle})
    assert text.endswith("p50 1.60x (2.00, 1.20), server CPU 1.20x (1.20)")
    assert table({"kq": kq[:1], "tcp": idle[:1]}).endswith("server CPU -")


@pytest.mark.system
def test_a_short_run_measures_the_floors_and_kq_on_real_processes() -> None:
    """Plain replication behind gRPC and behind a socket (with LMDB), stock PySyncObj, and a real kq
    cluster: each row has a rate and CPU for its servers, and every process it started has ended
    (the run exits by itself, within the time bound)."""
    variants = ["kq", "grpc+raft", "grpc", "tcp+lmdb"]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kq.bench.floor",
            "--sends",
            "40",
            "--runs",
            "1",
            "--variants",
            ",".join(variants),
        ],
        capture_output=True,
        text=True,
        timeout=FLOOR_RUN_TIMEOUT_S,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    for variant in variants:
        cells = [cell.strip() for cell in rows[variant].split("|")[2:-1]]
        p50_ms, rate, server_cpu = float(cells[0]), cells[2], cells[3]
        assert p50_ms > 0
        assert float(rate.split(" ")[0].replace(",", "")) > 0  # "1,843 (1,569..1,936)"
        assert float(server_cpu.replace(",", "")) >= 0  # 40 sends may fall inside one 10 ms clock tick.


def test_an_unknown_variant_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kq.bench.floor", "--variants", "grpc,zmq"],
        capture_output=True,
        text=True,
        timeout=USAGE_TIMEOUT_S,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    assert "choose from" in result.stderr


def test_a_missing_nats_server_is_one_line_and_a_nonzero_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `nats` variant without the bench extra: click's one-line error naming the way out."""

    def missing(*_arguments: object) -> None:
        raise NatsServerMissingError("nats-server not found")

    monkeypatch.setattr(floor, "run", missing)
    result = CliRunner().invoke(floor.main, ["--variants", "nats,grpc"])
    assert result.exit_code == 1
    last_line = result.output.strip().splitlines()[-1]  # After the run's heading.
    assert last_line == "Error: nats-server not found (or leave out the nats variant: --variants)"
