"""Every bad request to `kq` fails with one `kq: error:` line, a non-zero exit code, and no change to data
(topics, records, groups and their committed offsets)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from kq.cli.main import kq
from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import free_ports
from kq.proto.limits import RECORD_BYTES_MAX

RunKq = Callable[..., Result]
STABLE_TOPIC = "cli-errors-stable"  # Three partitions holding records; no error case may change it.
CONSUME_G = ["consume", STABLE_TOPIC, "--group", "g"]
RESET_G = ["groups", "reset-offsets", "g", "--topic", STABLE_TOPIC]

pytestmark = pytest.mark.system

# (arguments, stdin, exit code, text the error line must contain)
ERROR_CASES: list[tuple[list[str], str | None, int, str]] = [
    (["topics", "create", ""], None, 1, "topic name is empty"),
    (["topics", "create", "bad/name"], None, 1, "topic name may contain only"),
    (["topics", "create", "x" * 250], None, 1, "topic name is longer than 249 bytes"),
    (
        ["topics", "create", "cli-errors-new", "--partitions", "0"],
        None,
        1,
        "partition count must be between 1 and",
    ),
    (["topics", "create", "cli-errors-new", "--partitions", "5000"], None, 1, "got 5000"),
    (
        ["topics", "create", STABLE_TOPIC, "--partitions", "3"],
        None,
        1,
        f"topic {STABLE_TOPIC} already exists",
    ),
    (["topics", "describe", "no-such-topic"], None, 1, "unknown topic no-such-topic"),
    (["topics", "delete", "no-such-topic", "--yes"], None, 1, "unknown topic no-such-topic"),
    (["topics", "delete", STABLE_TOPIC], None, 2, "pass --yes"),
    (["produce", "no-such-topic", "x"], None, 1, "unknown topic no-such-topic"),
    (["produce", "no-such-topic"], "", 1, "unknown topic no-such-topic"),
    (["produce", STABLE_TOPIC, "x", "--partition", "3"], None, 2, "has 3 partitions (0-2), not 3"),
    (["produce", STABLE_TOPIC, "x", "--partition", "-1"], None, 2, "'--partition'"),
    (["produce", STABLE_TOPIC], "x" * (RECORD_BYTES_MAX + 1), 1, f"the limit is {RECORD_BYTES_MAX}"),
    (
        ["produce", STABLE_TOPIC, "--key-separator", ":"],
        "a:1\nno separator\n",
        1,
        "line 2 has no key separator",
    ),
    (
        ["produce", STABLE_TOPIC, "x", "--key", "k", "--key-separator", ":"],
        None,
        2,
        "cannot be used together",
    ),
    (["produce", STABLE_TOPIC, "x", "--header", "novalue"], None, 2, "is not name=value"),
    (["produce", STABLE_TOPIC, "x", "--file", "/no/such/file"], None, 2, "'--file'"),
    (["consume", "no-such-topic", "--from-beginning"], None, 1, "unknown topic no-such-topic"),
    (["consume", STABLE_TOPIC, "--partition", "7"], None, 2, "has 3 partitions (0-2), not 7"),
    (["consume", STABLE_TOPIC, "--offset", "99"], None, 2, "offset 99 is outside partition 0's range"),
    (["consume", STABLE_TOPIC, "--offset", "1", "--from-beginning"], None, 2, "cannot be used together"),
    (["consume", STABLE_TOPIC, "--format", "xml"], None, 2, "'--format'"),
    (["consume", STABLE_TOPIC, "--node", "nonsense"], None, 2, "is not host:port"),
    (["consume", STABLE_TOPIC, "--group", "bad/name"], None, 1, "group name may contain only"),
    (["consume", "no-such-topic", "--group", "g"], None, 1, "unknown topic no-such-topic"),
    ([*CONSUME_G, "--partition", "0"], None, 2, "--group and --partition cannot be used together"),
    ([*CONSUME_G, "--offset", "0"], None, 2, "--group and --offset cannot be used together"),
    ([*CONSUME_G, "--node", "127.0.0.1:1"], None, 2, "--group and --node cannot be used together"),
    ([*CONSUME_G, "--pattern", "x"], None, 2, "name either a TOPIC or a --pattern"),
    ([*CONSUME_G, "--from-beginning", "--reset", "latest"], None, 2, "cannot be used together"),
    ([*CONSUME_G, "--assignor", "best"], None, 2, "'--assignor'"),
    (["consume", STABLE_TOPIC, "--commit", "manual"], None, 2, "--commit needs --group"),
    (["consume", "--pattern", "cli-.*"], None, 2, "--pattern needs --group"),
    (["consume", "--group", "g"], None, 2, "name either a TOPIC or a --pattern"),
    (["consume", "--from-beginning"], None, 2, "Missing argument 'TOPIC'"),
    (["groups", "describe", "bad/name"], None, 1, "group name may contain only"),
    (["groups", "describe", "no-such-group"], None, 1, "unknown group no-such-group"),
    (["groups", "delete", "no-such-group", "--yes"], None, 1, "unknown group no-such-group"),
    (["groups", "delete", "no-such-group"], None, 1, "unknown group no-such-group"),
    (RESET_G, None, 2, "choose exactly one of --to-earliest"),
    ([*RESET_G, "--to-earliest", "--to-latest"], None, 2, "choose exactly one of --to-earliest"),
    ([*RESET_G, "--to-datetime", "May 1st"], None, 2, "not an ISO 8601 date and time"),
    ([*RESET_G, "--to-offset", "99", "--yes"], None, 1, "offset 99 is outside"),
    ([*RESET_G, "--to-latest"], None, 2, "pass --yes (stdin is not a terminal)"),
    (["groups", "reset-offsets", "g", "--to-earliest"], None, 2, "Missing option '--topic'"),
    (["groups", "reset-offsets", "g", "-t", "no-such-topic", "--to-latest", "-y"], None, 1, "unknown topic"),
    (["groups", "reset-offsets", "bad/name", "-t", STABLE_TOPIC, "--to-latest", "-y"], None, 1, "group name"),
    (["--bootstrap", "nonsense", "topics", "list"], None, 2, "is not host:port"),
    (["no-such-command"], None, 2, "No such command"),
    (["topics", "create"], None, 2, "Missing argument 'NAME'"),
]


@pytest.fixture(scope="module")
def stable_topic(client: KqClient) -> Iterator[str]:
    """A topic with records in every partition, created once for this module."""
    client.create_topic(STABLE_TOPIC, 3)
    client.send_batch(STABLE_TOPIC, [_record(i) for i in range(12)])
    yield STABLE_TOPIC


def _record(i: int) -> ProducerRecord:
    return ProducerRecord(b"v%d" % i, partition=i % 3)


def _stored_state(client: KqClient) -> dict[str, object]:
    """Every topic with each partition's (log start, log end, size), and every group with its
    committed offsets: what an error must not change."""
    topics = {
        topic.name: [
            (p.log_start_offset, p.log_end_offset, p.size_bytes)
            for p in client.list_offsets(topic.name).values()
        ]
        for topic in client.list_topics()
    }
    groups = {group.name: client.committed_offsets(group.name) for group in client.list_groups()}
    return {"topics": topics, "groups": groups}


def _assert_one_error_line(result: Result, exit_code: int, text: str) -> None:
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # Not an escaped exception.
    assert "Traceback" not in result.output
    assert result.stderr.startswith("kq: error: ")
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    assert text in result.stderr


@pytest.mark.parametrize(("arguments", "stdin", "exit_code", "text"), ERROR_CASES, ids=lambda v: str(v)[:40])
def test_error_is_one_line_with_exit_code_and_changes_nothing(
    run_kq: RunKq,
    client: KqClient,
    stable_topic: str,
    arguments: list[str],
    stdin: str | None,
    exit_code: int,
    text: str,
) -> None:
    """The request fails with one `kq: error:` line and its exit code; topics and offsets stay unchanged."""
    before = _stored_state(client)
    result = run_kq(*arguments, stdin=stdin)
    _assert_one_error_line(result, exit_code, text)
    assert result.stdout == ""
    assert _stored_state(client) == before


def test_unreachable_cluster_fails_with_one_line_after_the_timeout() -> None:
    """With no node listening, a command fails after --timeout with one line naming the address."""
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    result = CliRunner().invoke(kq, ["--bootstrap", dead, "--timeout", "0.5", "topics", "list"])
    _assert_one_error_line(result, 1, f"cannot reach {dead}")
