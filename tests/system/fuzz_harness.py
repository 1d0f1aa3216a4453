"""Runs fuzz cases against a LocalCluster: raw gRPC calls, liveness after each call, a commit canary.

Every request travels as bytes through identity serializers, so valid, hostile and malformed
requests take one path. Worker threads send; the main thread draws cases (seeded, in order) and
produces a known canary record every CANARY_INTERVAL_S. Findings go to `Findings` (fuzz_report.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from kq.client import KqClient, KqClientError
from kq.deploy.cluster import LocalCluster
from kq.proto.limits import CATCH_UP_WAIT_S, JOIN_WAIT_S, PROPOSAL_TIMEOUT_S
from tests.system.fuzz_report import Findings, Suspect, describe_suspects, log_tail
from tests.system.fuzz_requests import LEADER, RPCS, Case, parse_response
from tests.system.fuzz_values import Known

CHANNEL_MESSAGE_BYTES_MAX = 16 * 1024 * 1024  # Above the server's limit, so the server is what refuses.
# A unary call's deadline lies midway between the node's bounded waits, never on one. A metadata read
# whose min_index the node has not applied (the generator draws such indexes on purpose) answers
# NOT_CAUGHT_UP after CATCH_UP_WAIT_S; joins and stuck proposals answer after JOIN_WAIT_S and
# PROPOSAL_TIMEOUT_S. This was 2.0 s, CATCH_UP_WAIT_S itself, so the node's answer and the deadline's
# cancel met inside grpc.aio: when the failed send of the status reaches the server's loop before
# the cancel does (rpc_state.client_closed still false), grpc logs "ExecuteBatchError raised in core
# by servicer method [/kq.v1.Broker/DescribeTopic]" with a traceback (grpc's race, not kq's), which
# the log check reports; and the test saw DEADLINE_EXCEEDED instead of the node's own answer.
UNARY_TIMEOUT_S = (CATCH_UP_WAIT_S + min(JOIN_WAIT_S, PROPOSAL_TIMEOUT_S)) / 2
STREAM_TIMEOUT_S = 1.0
WORKERS = 6
CANARY_TOPIC = "fuzz-canary"  # No fuzz case names it: only the canary writes to it.
CANARY_INTERVAL_S = 2.0
# A committed write takes milliseconds and an election about a second; the margin is for a loaded
# machine (CI runs other clusters beside this one), so that a stall report always means a stuck cluster.
CANARY_DEADLINE_S = 10.0
SUSPECTS_SHOWN = 6
RECENT_WRITES_KEPT = 400
STOP_TIMEOUT_S = 3.0
# Outcomes of a write that may still be in Raft: the first of these is the likeliest cause of a stall.
UNANSWERED = ("no answer", "DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "INTERNAL", "UNKNOWN")
EDGE_REFUSALS = ("INVALID_ARGUMENT", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED")


@dataclass(frozen=True, slots=True)
class CanaryRecord:
    """A record the canary wrote and where; every node must serve it identically at the end."""

    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    index: int


class RawNode:
    """One channel to a node and a bytes-in, bytes-out callable per RPC."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", CHANNEL_MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", CHANNEL_MESSAGE_BYTES_MAX),
            ],
        )
        self.unary = {
            rpc: self.channel.unary_unary(f"/kq.v1.Broker/{rpc}", None, None)
            for rpc, spec in RPCS.items()
            if not spec.streams and not spec.request_streams
        }
        self.stream = self.channel.unary_stream("/kq.v1.Broker/FetchStream", None, None)
        self.produce_stream = self.channel.stream_stream("/kq.v1.Broker/ProduceStream", None, None)

    def call(self, case: Case) -> tuple[grpc.StatusCode, str, bytes | None]:
        """(status, details, response bytes when OK) of one request."""
        try:
            if case.spec.streams:
                return self._first_of_stream(case.payload)
            if case.spec.request_streams:
                return self._answer_on_stream(case.payload)
            response: bytes = self.unary[case.rpc](case.payload, timeout=UNARY_TIMEOUT_S)
            return grpc.StatusCode.OK, "", response
        except grpc.RpcError as error:
            return error.code(), error.details() or "", None

    def _first_of_stream(self, payload: bytes) -> tuple[grpc.StatusCode, str, bytes | None]:
        call = self.stream(payload, timeout=STREAM_TIMEOUT_S)
        try:
            for first in call:  # Only the first response: the stream would run until the deadline.
                return grpc.StatusCode.OK, "", bytes(first)
            return call.code(), call.details() or "", None
        finally:
            call.cancel()  # type: ignore[no-untyped-call]

    def _answer_on_stream(self, payload: bytes) -> tuple[grpc.StatusCode, str, bytes | None]:
        """The answer to `payload` as the one message of a ProduceStream (the client then closes it)."""
        call = self.produce_stream(iter([payload]), timeout=UNARY_TIMEOUT_S)
        for answer in call:
            return grpc.StatusCode.OK, "", bytes(answer)
        return call.code(), call.details() or "", None

    def close(self) -> None:
        self.channel.close()


class FuzzRun:
    """Sends cases to the cluster and checks it after each; stops early when a node dies or stalls."""

    def __init__(self, cluster: LocalCluster, findings: Findings, seed: int, known: Known) -> None:
        self.cluster = cluster
        self.known = known
        self.findings = findings
        self.seed = seed
        self.nodes = {node_id: RawNode(spec.grpc_address) for node_id, spec in cluster.nodes.items()}
        self.leader = cluster.wait_ready()
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.canaries: list[CanaryRecord] = []
        self.sent = 0
        self.bad_requests = 0
        self._lock = threading.Lock()
        self._dead: set[str] = set()
        self._in_flight: dict[int, Suspect] = {}
        self._recent_writes: collections.deque[Suspect] = collections.deque(maxlen=RECENT_WRITES_KEPT)
        self._last_commit_s = 0.0
        self._canary_client = KqClient(
            cluster.bootstrap, retry_timeout_s=CANARY_DEADLINE_S, rpc_timeout_s=2.0
        )

    def close(self) -> None:
        self._canary_client.close()
        for node in self.nodes.values():
            node.close()

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    # Sending ------------------------------------------------------------------------------------

    def send(self, case: Case) -> None:
        """Sends one case (on a worker thread) and checks the answer and every node's process."""
        node = self.leader if case.node == LEADER else case.node
        suspect = Suspect(case, node, self._elapsed(), "no answer yet")
        with self._lock:
            self._in_flight[id(suspect)] = suspect
        code, details, response = self.nodes[node].call(case)
        with self._lock:
            del self._in_flight[id(suspect)]
            self.sent += 1
            if code != grpc.StatusCode.OK:
                self.bad_requests += 1
            if case.spec.writes:
                self._recent_writes.append(
                    Suspect(case, node, suspect.started_s, f"{code.name} {details[:80]!r}")
                )
        self.findings.outcome(case, node, code, details)
        if case.node == LEADER and "not the leader; leader is " in details:
            self._follow(details.rsplit(" ", 1)[-1])
        if response is not None:
            self._learn(case, response)
        self._check_alive(case, node)

    def _follow(self, address: str) -> None:
        """Sends later leader-bound cases to the node a redirect named."""
        for node_id, spec in self.cluster.nodes.items():
            if spec.grpc_address == address:
                self.leader = node_id

    def _learn(self, case: Case, response: bytes) -> None:
        """Checks that an OK answer parses, and keeps the names and ids it gives for later cases."""
        try:
            message = parse_response(case.rpc, response)
        except DecodeError as error:
            self.findings.malformed(case, str(error))
            return
        known = self.known
        if case.rpc == "CreateTopic":
            known.remember(known.topics, message.topic.name)
        elif case.rpc == "RegisterProducer":
            known.remember(known.producer_ids, message.producer_id)
        elif case.rpc == "JoinGroup":
            group = RPCS["JoinGroup"].request.FromString(case.payload).group  # type: ignore[attr-defined]
            known.remember(known.groups, group)
            known.remember(known.members, (group, message.member_id, message.generation))

    def _check_alive(self, case: Case, node: str) -> None:
        for node_id in self.cluster.nodes:
            if self.cluster.running(node_id):
                continue
            with self._lock:
                if node_id in self._dead:
                    continue
                self._dead.add(node_id)
                suspects = self._suspects(window_s=3.0)
            code = self.cluster.exit_code(node_id)
            self.findings.deaths.append(
                f"[death] node {node_id} exited with {code} at t={self._elapsed():.2f}s, noticed after "
                f"{case.rpc} to node {node}: {case.label}; write requests just before:"
                f"{describe_suspects(suspects)}\n    its log ends:{log_tail(self.cluster.log_path(node_id))}"
            )
            self.stop.set()

    def _suspects(self, window_s: float) -> list[Suspect]:
        """Writes unanswered or answered in the last `window_s`: unanswered ones and oldest first."""
        since = self._elapsed() - window_s
        candidates = [*self._in_flight.values(), *(s for s in self._recent_writes if s.started_s >= since)]
        candidates = [s for s in candidates if s.case.spec.writes and not _refused_at_edge(s.outcome)]
        unanswered = [s for s in candidates if s.outcome.startswith(UNANSWERED)]
        ordered = sorted(unanswered, key=lambda s: s.started_s) + sorted(
            (s for s in candidates if s not in unanswered), key=lambda s: -s.started_s
        )
        return ordered[:SUSPECTS_SHOWN]

    # Canary -------------------------------------------------------------------------------------

    def canary(self) -> bool:
        """Produces one known record; a failure or a slow commit is a stall finding. Whether it committed."""
        number = len(self.canaries)
        key = f"canary-{number}".encode()
        value = f"seed {self.seed} canary {number}".encode() + bytes([0, 255, number % 256])
        headers = (("n", str(number).encode()), ("ü", b"\x00\xff"))
        began = time.monotonic()
        began_s = self._elapsed()
        try:
            metadata = self._canary_client.send(CANARY_TOPIC, value, key, partition=0, headers=headers)
        except KqClientError as error:
            self._stall(f"failed after {time.monotonic() - began:.1f} s: {error}", began_s)
            return False
        took_s = time.monotonic() - began
        if took_s > CANARY_DEADLINE_S:
            self._stall(f"took {took_s:.1f} s (deadline {CANARY_DEADLINE_S} s)", began_s)
        self.canaries.append(CanaryRecord(metadata.offset, key, value, headers, metadata.index))
        self._last_commit_s = began_s
        return took_s <= CANARY_DEADLINE_S

    def _stall(self, what: str, began_s: float) -> None:
        with self._lock:
            suspects = self._suspects(window_s=began_s - self._last_commit_s + CANARY_DEADLINE_S)
        leader_log = log_tail(self.cluster.log_path(self.leader))
        self.findings.stalls.append(
            f"[stall] canary produce #{len(self.canaries)} at t={began_s:.2f}s {what}; the cluster stopped "
            f"committing. Writes since the last commit (unanswered first):{describe_suspects(suspects)}"
            f"\n    leader (node {self.leader}) log ends:{leader_log}"
        )
        self.stop.set()

    # The loop -----------------------------------------------------------------------------------

    def run(self, next_case: Callable[[], Case], until: float) -> None:
        """Draws cases with `next_case()` and sends them on WORKERS threads until `until` (monotonic)."""
        slots = threading.BoundedSemaphore(WORKERS * 2)
        next_canary = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="fuzz") as pool:
            while time.monotonic() < until and not self.stop.is_set():
                if time.monotonic() >= next_canary:
                    self.canary()
                    next_canary = time.monotonic() + CANARY_INTERVAL_S
                    continue
                case = next_case()
                slots.acquire()
                future = pool.submit(self.send, case)
                future.add_done_callback(lambda _: slots.release())
            self.stop.set()

    # End checks ---------------------------------------------------------------------------------

    def read_back(self, deadline: float) -> None:
        """Every node must serve every canary record at its offset with its key, value and headers."""
        if not self.canaries:
            self.findings.canary.append("[canary] no canary record was ever committed")
            return
        expected = [(c.offset, c.key, c.value, c.headers) for c in self.canaries]
        index = max(c.index for c in self.canaries)
        running = {n: spec.grpc_address for n, spec in self.cluster.nodes.items() if self.cluster.running(n)}
        with (
            KqClient(self.cluster.bootstrap, retry_timeout_s=2.0, rpc_timeout_s=2.0) as client,
            concurrent.futures.ThreadPoolExecutor(len(self.cluster.nodes)) as pool,
        ):
            reads = {
                node_id: pool.submit(
                    self._read_node, client, address, expected[0][0], index, len(expected), deadline
                )
                for node_id, address in running.items()  # A dead node is reported as a death already.
            }
            for node_id, read in sorted(reads.items()):
                got = read.result()
                if got != expected:
                    first = next(i for i in range(len(expected) + 1) if got[i : i + 1] != expected[i : i + 1])
                    self.findings.canary.append(
                        f"[canary] node {node_id} serves {len(got)} records where {len(expected)} were "
                        f"committed as canaries (index {index})"
                        f"; first difference at position {first}: expected {expected[first : first + 1]}, "
                        f"served {got[first : first + 1]}"
                    )

    @staticmethod
    def _read_node(
        client: KqClient, address: str, start: int, index: int, count: int, deadline: float
    ) -> list[tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]]:
        got: list[tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]] = []
        offset = start
        while len(got) < count and time.monotonic() < deadline:
            try:
                result = client.fetch(
                    CANARY_TOPIC, 0, offset, max_records=1_000, node=address, min_index=index, wait_ms=200
                )
            except KqClientError:
                time.sleep(0.1)
                continue
            got += [(r.offset, r.key, r.value, r.headers) for r in result.records]
            if result.records:
                offset = result.records[-1].offset + 1
        return got


def _refused_at_edge(outcome: str) -> bool:
    """Whether an answer shows the request was never proposed (so it cannot have hurt apply)."""
    return outcome.startswith(EDGE_REFUSALS) or "not the leader" in outcome or "deserializ" in outcome
