"""The Python half of `tests/external/kafka_python_suite.sh`: kafka-python's own integration tests on kq.

Three commands, each called by the shell script (not a test module: pytest's default run does not
collect it, its name does not start with `test_`):

- `cluster`: starts a three-node kq cluster with Kafka listeners on free loopback ports (the project's
  own `LocalCluster`, PID files in its directory), writes the Kafka bootstrap and the node PIDs to a
  ready file, and runs until SIGTERM or SIGINT, then stops every node by PID.
- `probe`: the KAFKA_VERSION to give kafka-python's suite: the Kafka release kafka-python infers from
  kq's ApiVersions (what a client without `api_version` assumes). The suite builds every client with
  `api_version=KAFKA_VERSION` and gates tests on it; the clients still send only the API versions kq
  advertises (they adopt the broker's ApiVersions answer when it differs from their built-in table).
- `summary`: merges the per-test JUnit XML files into one, and prints and writes the pass, fail, skip
  and timeout counts with each failure's first line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from kq.deploy.cluster import LocalCluster

OUTCOMES = ("passed", "failed", "error", "skipped", "timeout")
SIGNAL_CHECK_S = 1.0  # Event.wait wakes for a signal only between these timeouts.
MESSAGE_CHARS_MAX = 300  # One failure's message in the summary: its first line, cut here.


def run_cluster(base_dir: Path, ready_file: Path) -> int:
    """Starts the cluster, announces it in `ready_file`, and stops it by PID on SIGTERM or SIGINT."""
    # A handler that only sets an event (not a blocked signal mask, which the nodes would inherit and
    # then ignore SIGTERM): a signal during start lets start finish, then everything stops.
    stopping = threading.Event()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signal_number, lambda _number, _frame: stopping.set())
    # Auto-created topics get two partitions, as kafka-python's KafkaFixture configures its broker
    # (num.partitions=2): its transactional and consumer tests use partition 1 of such a topic.
    cluster = LocalCluster(base_dir, record_pids=True, node_args=("--default-partitions", "2"))
    try:
        leader = cluster.start()
        pids = " ".join(f"{node_id}:{pid}" for node_id, pid in sorted(cluster.pids().items()))
        partial = ready_file.with_suffix(".partial")
        partial.write_text(f"bootstrap={cluster.kafka_bootstrap}\npids={pids}\nleader={leader}\n")
        partial.rename(ready_file)  # The script polls for the file: it appears complete or not at all.
        while not stopping.wait(SIGNAL_CHECK_S):
            pass
    finally:
        cluster.stop()
    return 0


def probe_version(bootstrap: str) -> str:
    """The Kafka release, dotted, that kafka-python infers from kq's ApiVersions."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=None)
    try:
        return ".".join(map(str, consumer.config["api_version"]))
    finally:
        consumer.close()


@dataclass(slots=True)
class Tally:
    """Outcomes of the run: a count per outcome and (test, outcome, message) of those that did not pass."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    problems: list[tuple[str, str, str]] = field(default_factory=list)


def case_outcome(case: ElementTree.Element) -> tuple[str, str]:
    """A JUnit testcase's outcome and the first line of its message ("" when it passed)."""
    for outcome in ("failure", "error", "skipped"):
        child = case.find(outcome)
        if child is not None:
            message = (child.get("message") or child.text or "").strip().splitlines()
            name = {"failure": "failed", "error": "error", "skipped": "skipped"}[outcome]
            return name, (message[0] if message else "")[:MESSAGE_CHARS_MAX]
    return "passed", ""


def summarize(results: Path, merged_xml: Path, summary_file: Path) -> Tally:
    """Reads `results/index.tsv` (node id, exit code, XML file per test) and the XML files they name."""
    tally = Tally()
    suite = ElementTree.Element("testsuite", name="kafka-python-integration-on-kq")
    for line in (results / "index.tsv").read_text().splitlines():
        node_id, exit_code, xml_name = line.split("\t")
        cases = []
        xml_path = results / xml_name
        if xml_path.is_file() and xml_path.stat().st_size > 0:
            cases = list(ElementTree.parse(xml_path).getroot().iter("testcase"))
        if not cases:  # Killed by the per-test timeout (or pytest died): no XML of its own.
            case = ElementTree.SubElement(suite, "testcase", name=node_id)
            reason = f"no result: pytest exited with {exit_code} (124/137: killed by the per-test timeout)"
            ElementTree.SubElement(case, "error", message=reason)
            tally.counts["timeout"] += 1
            tally.problems.append((node_id, "timeout", reason))
            continue
        for case in cases:
            suite.append(case)
            outcome, message = case_outcome(case)
            tally.counts[outcome] += 1
            if outcome != "passed":
                tally.problems.append((node_id, outcome, message))
    for outcome, count in tally.counts.items():
        suite.set(outcome, str(count))
    ElementTree.ElementTree(suite).write(merged_xml, encoding="utf-8", xml_declaration=True)
    lines = [" ".join(f"{outcome} {count}" for outcome, count in tally.counts.items())]
    lines += [f"{outcome.upper():8} {node_id}: {message}" for node_id, outcome, message in tally.problems]
    summary_file.write_text("\n".join(lines) + "\n")
    return tally


def main(argv: list[str] | None = None) -> int:
    """Dispatches one of the three commands (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    cluster = commands.add_parser("cluster", help="run a 3-node kq cluster until SIGTERM")
    cluster.add_argument("--dir", type=Path, required=True, help="data, logs and PID files")
    cluster.add_argument("--ready-file", type=Path, required=True, help="written once the cluster is ready")
    probe = commands.add_parser("probe", help="print the KAFKA_VERSION to run the suite with")
    probe.add_argument("--bootstrap", required=True)
    summary = commands.add_parser("summary", help="merge per-test JUnit XML; print the counts")
    summary.add_argument("--results", type=Path, required=True, help="holds index.tsv and the XML files")
    summary.add_argument("--junit", type=Path, required=True, help="the merged JUnit XML to write")
    summary.add_argument("--summary", type=Path, required=True, help="the text summary to write")
    arguments = parser.parse_args(argv)
    if arguments.command == "cluster":
        return run_cluster(arguments.dir, arguments.ready_file)
    if arguments.command == "probe":
        print(probe_version(arguments.bootstrap))
        return 0
    summarize(arguments.results, arguments.junit, arguments.summary)
    sys.stdout.write(arguments.summary.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
