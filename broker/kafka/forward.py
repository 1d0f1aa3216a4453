"""Writes that a Kafka client sends to a follower, passed on to the leader over its gRPC API.

Kafka clients send InitProducerId to any broker and keep asking the same one (librdkafka does), and
Metadata's auto-creation and CreateTopics may land anywhere; kq proposes only on the leader. So a
follower's Kafka handler calls the leader's own gRPC service (RegisterProducer, CreateTopic) and
answers with its result; the leader runs the same checks as for any gRPC client. Produce and group
calls are not forwarded: Kafka clients find the leader for those from Metadata and FindCoordinator.
Every forward is counted (`kq_kafka_forwarded_requests_total`, by method).
"""

from __future__ import annotations

from typing import Any

import grpc

from kq.broker.deadlines import capped
from kq.broker.errors import KqError, UnavailableError
from kq.broker.metrics import FORWARDED_REQUESTS, child
from kq.proto import kq_pb2_grpc
from kq.proto.errors import ErrorCode, code_from_metadata
from kq.proto.limits import GRPC_MESSAGE_BYTES_MAX, PEERS_MAX, PROPOSAL_TIMEOUT_S

FORWARD_TIMEOUT_S = PROPOSAL_TIMEOUT_S + 1.0  # The leader answers a stuck proposal within its timeout.


class LeaderForwarder:
    """One grpc.aio channel per leader address (at most the cluster's size), made and used on the loop."""

    def __init__(
        self, credentials: grpc.ChannelCredentials | None = None, metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._credentials = credentials  # The node's own TLS as a client (None: plain text).
        self._metadata = metadata  # The node's proof (broker/auth.py): the leader knows it as Node:<id>.

    async def call(self, leader_address: str, method: str, request: Any) -> Any:
        """`method` of the leader's Broker service; raises KqError with the leader's error code."""
        channel = self._channels.get(leader_address)
        if channel is None:
            if len(self._channels) >= PEERS_MAX:
                await self.close()
            options = [
                ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
                ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
            ]
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(leader_address, options=options)
            else:
                channel = grpc.aio.secure_channel(leader_address, self._credentials, options=options)
            self._channels[leader_address] = channel
        stub = kq_pb2_grpc.BrokerStub(channel)
        child(FORWARDED_REQUESTS, method).inc()
        try:
            # Never past the Kafka request's own timeout (broker/deadlines.py).
            timeout_s = capped(FORWARD_TIMEOUT_S)
            return await getattr(stub, method)(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            code = code_from_metadata(error.trailing_metadata()) or ErrorCode.LEADER_UNKNOWN
            if code == ErrorCode.NOT_LEADER:  # Leadership moved meanwhile: the client asks again.
                raise UnavailableError("the leader changed; retry", ErrorCode.LEADER_UNKNOWN) from error
            raise KqError(f"the leader answered: {error.details()}", code) from error

    async def close(self) -> None:
        """Closes every channel."""
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)
