"""What the fuzz test found, grouped so that each server bug appears once with its smallest input.

`Findings` is filled by the worker threads; `render` turns it into the failure message. Node logs
are scanned here too: CRITICAL lines, tracebacks (grouped by the log line that introduced them and
the exception that ended them), and continuation lines that show one bad request flooding the log.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tests.system.fuzz_requests import Case

HEX_BYTES_SHOWN = 64
RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
DIGITS = re.compile(r"\d+")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: |$)")  # "module.SomeError: message" ending a traceback.
# More lines than records that are not log-record starts means one event spans many lines.
CONTINUATION_LINES_MAX = 20
TRACEBACK_EXCERPT_LINES = 14


def payload_text(payload: bytes) -> str:
    """The request bytes as hex (the start of them when long), with their length."""
    shown = payload[:HEX_BYTES_SHOWN].hex()
    return f"{len(payload)} bytes: {shown}{'…' if len(payload) > HEX_BYTES_SHOWN else ''}"


@dataclass
class StatusGroup:
    """Every response with one (RPC, status, message shape): a count and the smallest input."""

    rpc: str
    code: grpc.StatusCode
    details: str
    node: str
    example: Case
    count: int = 0
    nodes: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Suspect:
    """A write request sent shortly before a node died or the cluster stopped committing."""

    case: Case
    node: str
    started_s: float  # Seconds since the fuzzing began.
    outcome: str


@dataclass
class Findings:
    """Problems found so far (thread-safe)."""

    statuses: dict[tuple[str, str, str], StatusGroup] = field(default_factory=dict)
    malformed_responses: dict[str, tuple[Case, str]] = field(default_factory=dict)
    deaths: list[str] = field(default_factory=list)
    stalls: list[str] = field(default_factory=list)
    canary: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def outcome(self, case: Case, node: str, code: grpc.StatusCode, details: str) -> None:
        """Counts one answer; INTERNAL and UNKNOWN are findings, grouped by RPC and message shape."""
        with self.lock:
            self.counts[(case.rpc, code.name)] += 1
            if code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
                return
            shape = DIGITS.sub("#", details)[:160]
            key = (case.rpc, code.name, shape)
            group = self.statuses.get(key)
            if group is None:
                group = self.statuses[key] = StatusGroup(case.rpc, code, details, node, case)
            elif len(case.payload) < len(group.example.payload):
                group.example, group.details, group.node = case, details, node
            group.count += 1
            group.nodes.add(node)

    def status_table(self) -> str:
        """Per RPC, how many answers of each status (printed, to show how deep the cases reached)."""
        rpcs = sorted({rpc for rpc, _ in self.counts})
        return "\n".join(
            f"  {rpc}: "
            + ", ".join(f"{code} {n}" for (name, code), n in sorted(self.counts.items()) if name == rpc)
            for rpc in rpcs
        )

    def malformed(self, case: Case, error: str) -> None:
        with self.lock:
            self.malformed_responses.setdefault(case.rpc, (case, error))

    def problems(self) -> list[str]:
        """Every finding as report lines (empty: the server passed)."""
        lines: list[str] = [*self.deaths, *self.stalls, *self._status_lines()]
        for rpc, (case, error) in sorted(self.malformed_responses.items()):
            lines.append(f"[response] {rpc} answered OK with bytes that do not parse ({error}): {case.label}")
        return [*lines, *self.canary, *self.logs]

    def _status_lines(self) -> list[str]:
        """One line per (status, message shape); the RPCs that gave it, and the smallest input of all."""
        by_shape: dict[tuple[str, str], list[StatusGroup]] = {}
        for (_, code, shape), group in self.statuses.items():
            by_shape.setdefault((code, shape), []).append(group)
        lines = []
        for (code, _), groups in sorted(by_shape.items()):
            smallest = min(groups, key=lambda g: len(g.example.payload))
            rpcs = ", ".join(f"{g.rpc} x{g.count}" for g in sorted(groups, key=lambda g: -g.count))
            nodes = ",".join(sorted(set().union(*(g.nodes for g in groups))))
            lines.append(
                f"[status] {code} {smallest.details!r} from {len(groups)} RPC(s) [{rpcs}] on nodes {nodes}; "
                f"smallest input: {smallest.rpc} to node {smallest.node}: {smallest.example.label} "
                f"| {payload_text(smallest.example.payload)}"
            )
        return lines


def describe_suspects(suspects: list[Suspect]) -> str:
    """Lines naming the requests that may have caused a death or a stall, oldest first."""
    if not suspects:
        return "\n      (no write request was sent shortly before)"
    return "".join(
        f"\n      t={s.started_s:.2f}s {s.case.rpc} to node {s.node} ({s.outcome}): {s.case.label} "
        f"| {payload_text(s.case.payload)}"
        for s in suspects
    )


def log_tail(path: Path, lines: int = 6) -> str:
    """The last log records of a node and the exception lines ending tracebacks, indented for the report."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"\n      (log unreadable: {error})"
    kept = [line for line in text if RECORD_START.match(line) or EXCEPTION_LINE.match(line)][-lines:]
    return "".join(f"\n      | {line[:300]}" for line in kept)


@dataclass(frozen=True, slots=True)
class LogScan:
    """What one node's log holds."""

    lines: int
    critical: list[str]
    tracebacks: Counter[tuple[str, str]]  # (log line before it, exception type) -> count
    first_traceback: list[str]
    continuation_lines: int


def scan_log(path: Path) -> LogScan:
    """CRITICAL lines, tracebacks grouped by cause, and lines that are not log-record starts."""
    lines = path.read_text(errors="replace").splitlines()
    critical = [line for line in lines if " CRITICAL " in line or line.startswith("CRITICAL")]
    tracebacks: Counter[tuple[str, str]] = Counter()
    first: list[str] = []
    continuation = 0
    last_record = ""
    position = 0
    while position < len(lines):
        line = lines[position]
        if RECORD_START.match(line):
            last_record = TIMESTAMP.sub("", line)[:200]
        else:
            continuation += 1
        if line.startswith("Traceback"):
            end = position + 1
            while end < len(lines) and not RECORD_START.match(lines[end]):
                end += 1
            block = lines[position:end]
            final = next((text for text in reversed(block) if EXCEPTION_LINE.match(text)), block[-1])
            tracebacks[(last_record, final.split(":")[0][:120])] += 1
            if not first:
                first = [last_record, *block[-TRACEBACK_EXCERPT_LINES:]]
            continuation += end - position - 1
            position = end
            continue
        position += 1
    return LogScan(len(lines), critical, tracebacks, first, continuation)


def log_problems(node: str, path: Path, bad_requests: int) -> list[str]:
    """Report lines for one node's log: CRITICAL, tracebacks, and a flood of multi-line records."""
    try:
        scan = scan_log(path)
    except OSError as error:
        return [f"[log] node {node}: cannot read {path}: {error}"]
    problems = [f"[log] node {node}: CRITICAL line: {line[:300]}" for line in scan.critical[:3]]
    if len(scan.critical) > 3:
        problems.append(f"[log] node {node}: {len(scan.critical)} CRITICAL lines in all")
    for (before, final), count in scan.tracebacks.most_common(3):
        problems.append(f"[log] node {node}: {count} traceback(s) of {final}, logged after {before!r}")
    if scan.tracebacks:
        excerpt = "".join(f"\n      | {line[:200]}" for line in scan.first_traceback)
        problems.append(f"[log] node {node}: first traceback:{excerpt}")
    if scan.continuation_lines > CONTINUATION_LINES_MAX:
        problems.append(
            f"[log] node {node}: log flood: {scan.continuation_lines} continuation lines "
            f"(multi-line records) in {scan.lines} lines, for {bad_requests} rejected requests to the cluster"
        )
    return problems
