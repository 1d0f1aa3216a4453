"""`kq topics` and `kq cluster status` against a real 3-node cluster."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import Result

from kq.client import KqClient, ProducerRecord, TopicNotFoundError
from kq.deploy.cluster import LocalCluster, free_ports

RunKq = Callable[..., Result]

pytestmark = pytest.mark.system


def test_create_list_describe_delete_round_trip(run_kq: RunKq, client: KqClient, topic_name: str) -> None:
    """A topic created by `kq` is listed and described with empty partitions, and `--yes` deletes it."""
    created = run_kq("topics", "create", topic_name, "--partitions", "3")
    assert created.exit_code == 0, created.output
    assert created.stdout.startswith(f"created topic {topic_name} with 3 partitions (id ")
    assert client.describe_topic(topic_name).topic.partitions == 3

    listed = run_kq("topics", "list")
    assert listed.exit_code == 0
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith(topic_name + " "))
    assert row[1] == "3"
    listed_json = json.loads(run_kq("topics", "list", "--format", "json").stdout)
    assert {"name": topic_name, "partitions": 3} == {
        k: v for k, v in _named(listed_json, topic_name).items() if k in ("name", "partitions")
    }

    described = run_kq("topics", "describe", topic_name)
    assert described.exit_code == 0
    lines = described.stdout.splitlines()
    assert lines[0].startswith(f"topic {topic_name} (id ") and "served by node" in lines[0]
    assert [line.split() for line in lines[3:6]] == [[str(p), "0", "0", "0", "0"] for p in range(3)]

    deleted = run_kq("topics", "delete", topic_name, "--yes")
    assert (deleted.exit_code, deleted.stdout) == (0, f"deleted topic {topic_name}\n")
    with pytest.raises(TopicNotFoundError):
        client.describe_topic(topic_name)


def _named(documents: list[dict[str, object]], name: str) -> dict[str, object]:
    return next(document for document in documents if document["name"] == name)


def test_create_if_not_exists_succeeds_without_change(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """A second create fails with exit 1, but with --if-not-exists it succeeds and keeps the first topic."""
    client.create_topic(topic_name, 2)
    again = run_kq("topics", "create", topic_name, "--partitions", "5")
    assert (again.exit_code, again.stderr) == (1, f"kq: error: topic {topic_name} already exists\n")
    tolerant = run_kq("topics", "create", topic_name, "--partitions", "5", "--if-not-exists")
    assert (tolerant.exit_code, tolerant.stdout) == (0, f"topic {topic_name} already exists\n")
    assert client.describe_topic(topic_name).topic.partitions == 2


def test_describe_shows_offsets_and_sizes_on_the_chosen_node(
    run_kq: RunKq, client: KqClient, cluster: LocalCluster, topic_name: str
) -> None:
    """`describe --node` reports that node's log ends and sizes and names it as the server."""
    client.create_topic(topic_name, 2)
    index = client.send_batch(topic_name, _records(3, partition=1))[-1].index
    cluster.wait_applied(index, list(cluster.nodes))
    for node_id, spec in cluster.nodes.items():
        result = run_kq("topics", "describe", topic_name, "--node", spec.grpc_address, "--format", "json")
        document = json.loads(result.stdout)
        assert document["served_by"] == node_id
        assert document["applied_index"] >= index
        ends = [
            (p["partition"], p["log_start_offset"], p["log_end_offset"])
            for p in document["partition_offsets"]
        ]
        assert ends == [(0, 0, 0), (1, 0, 3)]
        assert document["partition_offsets"][1]["size_bytes"] > 0


def _records(count: int, partition: int) -> list[ProducerRecord]:
    return [ProducerRecord(f"v{i}".encode(), partition=partition) for i in range(count)]


def test_delete_asks_and_respects_the_answer(
    run_kq: RunKq, client: KqClient, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal, delete asks first: `n` keeps the topic (exit 1), `y` deletes it."""
    monkeypatch.setattr("kq.cli.topics.stdin_is_interactive", lambda: True)
    client.create_topic(topic_name, 1)
    refused = run_kq("topics", "delete", topic_name, stdin="n\n")
    assert refused.exit_code == 1
    assert f"Delete topic {topic_name} (1 partition, 0 records)?" in refused.stdout
    assert client.describe_topic(topic_name).topic.name == topic_name
    accepted = run_kq("topics", "delete", topic_name, stdin="y\n")
    assert accepted.exit_code == 0, accepted.output
    with pytest.raises(TopicNotFoundError):
        client.describe_topic(topic_name)


def test_delete_without_yes_and_without_a_terminal_refuses(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """With stdin not a terminal and no --yes, delete fails with one usage line and keeps the topic."""
    client.create_topic(topic_name, 1)
    result = run_kq("topics", "delete", topic_name)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"kq: error: deleting topic {topic_name} needs confirmation: pass --yes")
    assert result.stderr.count("\n") == 1
    assert client.describe_topic(topic_name).topic.name == topic_name


def test_cluster_status_shows_every_node_and_exactly_one_leader(run_kq: RunKq, cluster: LocalCluster) -> None:
    """`cluster status` has one row per node, exactly one leader, and every node agrees who it is."""
    table = run_kq("cluster", "status")
    assert table.exit_code == 0, table.output
    rows = [line.split() for line in table.stdout.splitlines()[2:]]
    assert sorted(row[1] for row in rows) == sorted(cluster.bootstrap)
    assert [row[2] for row in rows].count("leader") == 1
    leader = next(row[0] for row in rows if row[2] == "leader")
    assert {row[6] for row in rows} == {leader}

    statuses = json.loads(run_kq("cluster", "status", "--format", "json").stdout)
    assert [s["role"] for s in statuses].count("leader") == 1
    assert all(s["error"] is None and s["ready"] for s in statuses)
    assert all(peer["connected"] for s in statuses for peer in s["peers"])


def test_cluster_status_shows_an_unreachable_node_as_down(run_kq: RunKq, cluster: LocalCluster) -> None:
    """A bootstrap address nobody listens on is a `down` row with the reason; the command still succeeds,
    and lists the members the answering node names too."""
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    result = run_kq("--bootstrap", f"{dead},{cluster.bootstrap[0]}", "cluster", "status", "--format", "json")
    assert result.exit_code == 0, result.output
    down, *up = json.loads(result.stdout)
    assert (down["address"], down["role"]) == (dead, "down")
    assert dead in down["error"]
    assert [status["address"] for status in up] == [cluster.bootstrap[0], *sorted(cluster.bootstrap[1:])]
    assert all(status["error"] is None for status in up)


def test_topic_configs_are_set_shown_altered_and_refused(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """`--config` at create, `describe` lists every config with its source, `alter-config` sets and
    removes overrides; an unknown name or a bad value is one line on stderr, exit 1, nothing changed."""
    created = run_kq(
        "topics", "create", topic_name, "--config", "retention.ms=60000", "-c", "cleanup.policy=delete"
    )
    assert created.exit_code == 0, created.output
    described = run_kq("topics", "describe", topic_name)
    rows = {
        line.split()[0]: line.split()[1:] for line in described.stdout.splitlines() if "." in line.split()[0]
    }
    assert rows["retention.ms"] == ["60000", "topic"]
    assert rows["retention.bytes"] == ["-1", "default"]

    altered = run_kq(
        "topics", "alter-config", topic_name, "--set", "retention.bytes=1048576", "--delete", "retention.ms"
    )
    assert altered.exit_code == 0, altered.output
    configs = {c.name: c for c in client.describe_topic(topic_name).configs}
    assert (configs["retention.bytes"].value, configs["retention.bytes"].is_default) == ("1048576", False)
    assert (configs["retention.ms"].value, configs["retention.ms"].is_default) == ("-1", True)

    for bad in ("retention.ms=soon", "segment.bytes=1", "max.message.bytes=0"):
        refused = run_kq("topics", "alter-config", topic_name, "--set", bad)
        assert (
            refused.exit_code == 1
            and refused.stderr.startswith("kq: error: ")
            and refused.stderr.count("\n") == 1
        )
    assert {c.name: c.value for c in client.describe_topic(topic_name).configs} == {
        name: config.value for name, config in configs.items()
    }
    checked = run_kq("topics", "alter-config", topic_name, "--set", "retention.ms=5", "--validate-only")
    assert checked.exit_code == 0 and checked.stdout.startswith("valid;")
    assert (
        next(c for c in client.describe_topic(topic_name).configs if c.name == "retention.ms").value == "-1"
    )
    missing = run_kq("topics", "create", topic_name + "-x", "--config", "retention.ms")
    assert missing.exit_code == 2 and "is not name=value" in missing.stderr


def test_add_partitions_grows_a_topic_and_keeps_its_records(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """`kq topics add-partitions` grows a topic (over gRPC CreatePartitions; --validate-only changes
    nothing), the old partition keeps its records, and a count that does not grow fails with exit 1."""
    client.create_topic(topic_name, 1)
    client.send_batch(topic_name, _records(2, partition=0))
    checked = run_kq("topics", "add-partitions", topic_name, "--partitions", "3", "--validate-only")
    assert (checked.exit_code, checked.stdout) == (0, f"would grow topic {topic_name} to 3 partitions\n")
    assert client.describe_topic(topic_name).topic.partitions == 1
    grown = run_kq("topics", "add-partitions", topic_name, "--partitions", "3")
    assert (grown.exit_code, grown.stdout) == (0, f"grew topic {topic_name} to 3 partitions\n")
    offsets = client.list_offsets(topic_name)
    assert {p: o.log_end_offset for p, o in offsets.items()} == {0: 2, 1: 0, 2: 0}
    assert client.send(topic_name, b"new", partition=2).offset == 0
    same = run_kq("topics", "add-partitions", topic_name, "--partitions", "3")
    assert same.exit_code == 1 and "must be larger" in same.stderr
