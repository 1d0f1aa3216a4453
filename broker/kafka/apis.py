"""The Kafka APIs a node serves, the versions of each, and the dispatch of one request frame.

`KafkaApis.answer` is the listener's whole view of the protocol: it reads the request header,
refuses an API or version it does not serve (UNSUPPORTED_VERSION where the response can say so;
ApiVersions always can, in its v0 form, so a client learns what to use), decodes the body with kio,
runs the handler and encodes its response. ApiVersions advertises exactly the table below.

It is also where a connection's principal is bound (`connected`, and SASL: sasl.py) and where an
unauthenticated connection is stopped: until it has a principal, only ApiVersions and the SASL APIs
are answered and anything else closes it (Kafka does the same on a SASL listener). The requests
that name a single resource are authorized here (authorize.py `WHOLE`); the others in their handlers.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from kq.broker.auth import Principal
from kq.broker.deadlines import call_deadline
from kq.broker.edge import RateLimitedLog
from kq.broker.kafka.acls import AclApis
from kq.broker.kafka.admin import AdminApis
from kq.broker.kafka.authorize import DENIED_CODE, DENIED_MESSAGE, OPEN_APIS, WHOLE, ApiKey, access
from kq.broker.kafka.build import build, has_field, response_module
from kq.broker.kafka.cluster_admin import ClusterAdminApis
from kq.broker.kafka.codes import ILLEGAL_SASL_STATE, NONE, UNSUPPORTED_VERSION
from kq.broker.kafka.configs import ConfigApis
from kq.broker.kafka.consumer_groups import ConsumerGroupApis
from kq.broker.kafka.epochs import EpochApis
from kq.broker.kafka.fetch import FetchApis
from kq.broker.kafka.framing import (
    FrameError,
    Request,
    decode_request,
    encode_response,
    read_prefix,
    request_schema,
    response_schema,
)
from kq.broker.kafka.group_admin import GroupAdminApis
from kq.broker.kafka.listener import CloseConnectionError, Connection
from kq.broker.kafka.produce import ProduceApis
from kq.broker.kafka.sasl import Answer, SaslSession, SaslState
from kq.broker.kafka.scram import ScramApis
from kq.broker.kafka.transactions import TransactionAdminApis, TransactionApis
from kq.broker.metrics import KAFKA_REQUEST_LATENCY, observe_latency
from kq.proto.limits import LOG_INTERVAL_S
from kq.raft.auth import ANONYMOUS

logger = logging.getLogger(__name__)

API_VERSIONS = 18
_SIZE = struct.Struct(">i")
Handler = Callable[[Request, Connection], Awaitable[Any]]


def request_timeout_s(body: Any) -> float | None:
    """A Kafka request's own timeout in seconds, the deadline of its waits: the `timeout` field of
    Produce, CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords, ElectLeaders and the like
    (Kafka's `timeout_ms`). None without one, or for 0 and below: Kafka then waits for nothing
    (kq still answers once the change committed, as a proposal takes milliseconds)."""
    timeout = getattr(body, "timeout", None)
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        return None
    return timeout.total_seconds()


class KafkaApis(
    ClusterAdminApis,
    ConfigApis,
    ProduceApis,
    FetchApis,
    ConsumerGroupApis,
    GroupAdminApis,
    AdminApis,
    TransactionApis,
    TransactionAdminApis,
    AclApis,
    ScramApis,
    EpochApis,
):
    """Every Kafka API kq serves, over the node's one broker layer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._log = RateLimitedLog(LOG_INTERVAL_S)
        # API key -> (lowest version, highest version, handler). ApiVersions advertises exactly these.
        self.apis: dict[int, tuple[int, int, Handler]] = {
            0: (3, 9, self.produce),
            1: (4, 12, self.fetch),
            2: (1, 7, self.list_offsets),
            API_VERSIONS: (0, 3, self.api_versions),
            3: (4, 12, self.metadata),
            8: (2, 9, self.offset_commit),
            9: (1, 9, self.offset_fetch),
            10: (0, 3, self.find_coordinator),
            11: (0, 5, self.join_group),
            12: (0, 3, self.heartbeat),
            13: (0, 3, self.leave_group),
            14: (0, 3, self.sync_group),
            15: (0, 5, self.describe_groups),
            16: (0, 5, self.list_groups),
            ApiKey.SASL_HANDSHAKE: (0, 1, self.sasl_handshake),
            19: (2, 5, self.create_topics),
            20: (1, 4, self.delete_topics),
            ApiKey.DELETE_RECORDS: (0, 2, self.delete_records),
            22: (0, 4, self._init_producer_id),
            ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3, self.add_partitions_to_txn),
            ApiKey.ADD_OFFSETS_TO_TXN: (0, 3, self.add_offsets_to_txn),
            ApiKey.END_TXN: (0, 3, self.end_txn),
            ApiKey.TXN_OFFSET_COMMIT: (0, 3, self.txn_offset_commit),
            ApiKey.DESCRIBE_PRODUCERS: (0, 0, self.describe_producers),
            ApiKey.DESCRIBE_TRANSACTIONS: (0, 0, self.describe_transactions),
            ApiKey.LIST_TRANSACTIONS: (0, 1, self.list_transactions),
            ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4, self.offset_for_leader_epoch),
            ApiKey.DESCRIBE_ACLS: (1, 3, self.describe_acls),
            ApiKey.CREATE_ACLS: (1, 3, self.create_acls),
            ApiKey.DELETE_ACLS: (1, 3, self.delete_acls),
            32: (0, 4, self.describe_configs),
            33: (0, 2, self.alter_configs),
            # Not v5: kafka-python takes DescribeLogDirs v5 for a Kafka 4.3 broker and then expects
            # the rest of 4.3 (its version inference: ListOffsets 7 makes kq a 3.0 to it).
            ApiKey.DESCRIBE_LOG_DIRS: (1, 4, self.describe_log_dirs),
            ApiKey.SASL_AUTHENTICATE: (0, 2, self.sasl_authenticate),
            ApiKey.CREATE_PARTITIONS: (0, 3, self.create_partitions),
            ApiKey.DELETE_GROUPS: (0, 2, self.delete_groups),
            ApiKey.ELECT_LEADERS: (0, 2, self.elect_leaders),
            44: (0, 1, self.incremental_alter_configs),
            ApiKey.OFFSET_DELETE: (0, 0, self.offset_delete),
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0, self.describe_user_scram_credentials),
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0, self.alter_user_scram_credentials),
            60: (0, 1, self.describe_cluster),
            ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1, self.consumer_group_heartbeat),
            ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 1, self.consumer_group_describe),
            ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0, self.describe_topic_partitions),
        }

    async def _init_producer_id(self, request: Request, connection: Connection) -> Any:
        """InitProducerId: a transactional producer's (transactions.py), else an idempotent one's."""
        if request.body.transactional_id is not None:
            return await self.init_transactional_producer(request, connection)
        return await self.init_producer_id(request, connection)

    def connected(self, connection: Connection) -> None:
        """Binds a new connection's principal (the listener's on_connect): on a SASL listener none
        until SASL succeeds; else its client certificate's, else User:ANONYMOUS while --auth is off."""
        if self._settings.sasl_mechanisms:
            connection.sasl = SaslSession(self._security, self._settings.sasl_mechanisms)
        elif connection.common_name:
            connection.principal = self._security.principal_of(connection.common_name)
        elif not self._security.enabled:
            connection.principal = Principal(ANONYMOUS, True)

    async def answer(self, frame: bytes | memoryview, connection: Connection) -> bytes | None:
        """The response frame to one request frame; None when the request wants none (acks=0).

        Raises CloseConnectionError for a frame no response can answer."""
        sasl = connection.sasl
        if sasl is not None and sasl.raw_tokens and sasl.state is SaslState.AUTHENTICATING:
            return await self._raw_token(frame, connection, sasl)
        try:
            prefix = read_prefix(frame)
        except FrameError as error:
            raise CloseConnectionError(str(error)) from error
        served = self.apis.get(prefix.api_key)
        if served is None:
            raise CloseConnectionError(f"API key {prefix.api_key} is not served")
        if connection.principal is None and prefix.api_key not in OPEN_APIS:
            how = "SASL first" if sasl is not None else "--auth: SASL (--kafka-sasl) or a client certificate"
            raise CloseConnectionError(f"API key {prefix.api_key} before authentication: {how}")
        low, high, handler = served
        if not low <= prefix.api_version <= high:
            return self._unsupported_version(prefix.api_key, prefix.api_version, prefix.correlation_id)
        schema = request_schema(prefix.api_key, prefix.api_version)
        assert schema is not None, "every served version has a kio schema"
        try:
            request = decode_request(frame, schema)
        except FrameError as error:
            raise CloseConnectionError(str(error)) from error
        denied = self._denied_whole(request, connection)
        if denied is not None:
            return encode_response(request.correlation_id, denied)
        started_s = time.monotonic()
        try:
            with call_deadline(request_timeout_s(request.body)):  # Caps its waits (broker/deadlines.py).
                response = await handler(request, connection)
        except CloseConnectionError:
            raise
        except Exception as error:  # A bug: logged (rate-limited), and only this connection ends.
            self._log.report(
                f"bug:{prefix.api_key}",
                "Kafka API %d v%d failed: %s",
                prefix.api_key,
                prefix.api_version,
                error,
                exc_info=True,
            )
            raise CloseConnectionError(f"internal error in API {prefix.api_key}") from error
        name = getattr(handler, "__name__", str(prefix.api_key))  # produce, fetch, ...: a fixed set.
        observe_latency(KAFKA_REQUEST_LATENCY, name, started_s)
        return None if response is None else encode_response(request.correlation_id, response)

    def _denied_whole(self, request: Request, connection: Connection) -> Any | None:
        """The whole answer to a request naming one resource its principal may not use (authorize.py
        `WHOLE`: its response's one error code says so), or None."""
        subject = WHOLE.get(ApiKey(request.api_key)) if request.api_key in WHOLE else None
        resource = None if subject is None else subject(request.body)
        if resource is None or connection.principal is None:
            return None
        resource_type, name = resource
        needed = access(ApiKey(request.api_key), resource_type, name)
        if self._security.denied(connection.principal, [needed]) is None:
            return None
        cls = response_schema(request.api_key, request.api_version)
        return build(cls, error_code=DENIED_CODE[resource_type], error_message=DENIED_MESSAGE[resource_type])

    # SASL (sasl.py) ------------------------------------------------------------------------------

    async def sasl_handshake(self, request: Request, connection: Connection) -> Any:
        """Chooses the connection's SASL mechanism; ILLEGAL_SASL_STATE on a listener without SASL."""
        module = response_module(ApiKey.SASL_HANDSHAKE, request.api_version)
        sasl = connection.sasl
        if sasl is None:
            return build(module.SaslHandshakeResponse, error_code=ILLEGAL_SASL_STATE, mechanisms=())
        answer = sasl.handshake(request.body.mechanism, request.api_version)
        if answer.close:
            connection.close_reason = f"SASL: {answer.message}"
        return build(module.SaslHandshakeResponse, error_code=answer.error_code, mechanisms=sasl.mechanisms)

    async def sasl_authenticate(self, request: Request, connection: Connection) -> Any:
        """One SASL token of the client's, answered with the server's (KIP-152)."""
        module = response_module(ApiKey.SASL_AUTHENTICATE, request.api_version)
        sasl = connection.sasl
        if sasl is None:
            answer = Answer(ILLEGAL_SASL_STATE, "this Kafka listener has no SASL (--kafka-sasl)")
        else:
            answer = await self._sasl_step(connection, sasl, request.body.auth_bytes)
        return build(
            module.SaslAuthenticateResponse,
            error_code=answer.error_code,
            error_message=answer.message,
            auth_bytes=answer.token,
            session_lifetime=0,  # No re-authentication (KIP-368): the session lasts the connection.
        )

    async def _raw_token(
        self, frame: bytes | memoryview, connection: Connection, sasl: SaslSession
    ) -> bytes | None:
        """A bare SASL token after a SaslHandshake v0, answered with a bare frame; a failure closes the
        connection without an answer (that framing has no way to say why)."""
        answer = await self._sasl_step(connection, sasl, bytes(frame))
        return None if answer.close else _SIZE.pack(len(answer.token)) + answer.token

    async def _sasl_step(self, connection: Connection, sasl: SaslSession, token: bytes) -> Answer:
        # On a worker: PLAIN derives the user's key (its iteration count of HMACs).
        answer = await self._in_workers(sasl.authenticate, bytes(token))
        if answer.close:
            connection.close_reason = f"SASL: {answer.message}"
        elif sasl.principal is not None:
            connection.principal = sasl.principal
        return answer

    def _unsupported_version(self, api_key: int, api_version: int, correlation_id: int) -> bytes:
        """UNSUPPORTED_VERSION in a form the client can read; CloseConnectionError when none exists."""
        if api_key == API_VERSIONS:
            module = response_module(API_VERSIONS, 0)
            return encode_response(correlation_id, self._versions_response(module, UNSUPPORTED_VERSION))
        try:
            cls: type = response_schema(api_key, api_version)
        except Exception as error:  # kio has no such version: nothing can encode an answer.
            raise CloseConnectionError(f"API {api_key} v{api_version} is not served") from error
        if not has_field(cls, "error_code"):
            raise CloseConnectionError(f"API {api_key} v{api_version} is not served")
        return encode_response(correlation_id, build(cls, error_code=UNSUPPORTED_VERSION))

    async def api_versions(self, request: Request, connection: Connection) -> Any:
        """The APIs and versions this node serves."""
        return self._versions_response(response_module(API_VERSIONS, request.api_version), NONE)

    def _versions_response(self, module: Any, code: int) -> Any:
        keys = tuple(
            build(module.ApiVersion, api_key=key, min_version=low, max_version=high)
            for key, (low, high, _) in sorted(self.apis.items())
        )
        return build(module.ApiVersionsResponse, error_code=code, api_keys=keys, throttle_time=0)
