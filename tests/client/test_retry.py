"""The client's retry loop, against a tiny in-process server: it retries exactly the retriable codes,
follows `kq-leader` within the hop limit, and gives up at its deadline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from kq.broker.errors import abort_with_code
from kq.client import KqClient
from kq.client.errors import CLASS_BY_CODE, UnavailableError
from kq.deploy.cluster import free_ports
from kq.proto import kq_pb2, kq_pb2_grpc
from kq.proto.errors import ERROR_TABLE, ErrorCode
from kq.proto.limits import CLIENT_REDIRECTS_MAX

FAILING_CODES = [code for code in ErrorCode if code != ErrorCode.OK]


class ScriptedBroker(kq_pb2_grpc.BrokerServicer):
    """Fails the next calls with the scripted codes (a NOT_LEADER names `leader`), then succeeds."""

    def __init__(self) -> None:
        self.script: list[ErrorCode] = []
        self.forever: ErrorCode | None = None  # Fail every call with this code.
        self.leader = ""
        self.calls = 0
        self._lock = threading.Lock()

    def _next_failure(self) -> ErrorCode | None:
        with self._lock:
            self.calls += 1
            return self.script.pop(0) if self.script else self.forever

    def _answer(self, context: grpc.ServicerContext) -> None:
        code = self._next_failure()
        if code is not None:
            leader = self.leader if code == ErrorCode.NOT_LEADER else None
            abort_with_code(context, code, f"scripted {code.name}", leader)

    def CreateTopic(  # noqa: N802 - the proto's name.
        self, request: kq_pb2.CreateTopicRequest, context: grpc.ServicerContext
    ) -> kq_pb2.CreateTopicResponse:
        self._answer(context)
        return kq_pb2.CreateTopicResponse(topic=kq_pb2.TopicInfo(name=request.name, partitions=1))

    def ListTopics(  # noqa: N802 - the proto's name.
        self, request: kq_pb2.ListTopicsRequest, context: grpc.ServicerContext
    ) -> kq_pb2.ListTopicsResponse:
        self._answer(context)
        return kq_pb2.ListTopicsResponse()


@pytest.fixture
def broker() -> Iterator[tuple[ScriptedBroker, str]]:
    servicer = ScriptedBroker()  # type: ignore[abstract]  # The other RPCs answer UNIMPLEMENTED.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    kq_pb2_grpc.add_BrokerServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    servicer.leader = address  # A redirect leads back here: the next attempt is the hop.
    server.start()
    try:
        yield servicer, address
    finally:
        server.stop(None)


# One write and one read: each is retried when its failure's code is retriable, raised at once otherwise.
OPERATIONS: dict[str, tuple[Callable[[KqClient], object], object]] = {
    "write": (lambda client: client.create_topic("t", 1).name, "t"),
    "read": (lambda client: client.list_topics(), []),
}


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("code", FAILING_CODES, ids=lambda code: code.name)
def test_calls_retry_exactly_the_retriable_codes(
    broker: tuple[ScriptedBroker, str], code: ErrorCode, operation: str
) -> None:
    """One failure with `code`: a retriable code is retried and the call succeeds; any other is raised."""
    servicer, address = broker
    servicer.script = [code]
    call, expected = OPERATIONS[operation]
    with KqClient([address], retry_timeout_s=5.0, rpc_timeout_s=2.0) as client:
        if ERROR_TABLE[code].retriable:
            assert call(client) == expected
            assert servicer.calls == 2
        else:
            with pytest.raises(CLASS_BY_CODE[code]) as caught:
                call(client)
            assert caught.value.error_code == code
            assert servicer.calls == 1


def test_redirects_are_bounded_and_the_loop_gives_up_at_its_deadline(
    broker: tuple[ScriptedBroker, str],
) -> None:
    """A node that always redirects: hops then backoff, until the deadline; the last code is kept."""
    servicer, address = broker
    servicer.forever = ErrorCode.NOT_LEADER
    with (
        KqClient([address], retry_timeout_s=0.5, rpc_timeout_s=1.0) as client,
        pytest.raises(UnavailableError) as caught,
    ):
        client.create_topic("t", 1)
    assert caught.value.error_code == ErrorCode.NOT_LEADER
    assert (
        servicer.calls > CLIENT_REDIRECTS_MAX + 1
    )  # At least one full run of hops, then more after a backoff.


def test_an_unreachable_node_is_retried_then_named(broker: tuple[ScriptedBroker, str]) -> None:
    """With a dead node first in the bootstrap list, the write moves on to the live one."""
    servicer, address = broker
    dead = f"127.0.0.1:{free_ports(1)[0]}"  # Nothing listens there.
    with KqClient([dead, address], retry_timeout_s=5.0, rpc_timeout_s=1.0) as client:
        assert client.create_topic("t", 1).name == "t"
    with (
        KqClient([dead], retry_timeout_s=0.3, rpc_timeout_s=0.2) as client,
        pytest.raises(UnavailableError, match=f"cannot reach {dead}"),
    ):
        client.list_topics()
    assert servicer.calls == 1
