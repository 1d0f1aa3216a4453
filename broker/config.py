"""A node's configuration: the dataclass the node runs on, and parsing of the peer list."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kq.broker.auth import node_metadata
from kq.broker.consensus import Peer
from kq.client.tls import TlsConfig
from kq.proto.limits import (
    COMPACTION_CHECK_S_DEFAULT,
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    CONSUMER_SESSION_TIMEOUT_MS,
    GRPC_WORKERS_DEFAULT,
    KAFKA_DEFAULT_PARTITIONS,
    KAFKA_FRAME_BYTES_DEFAULT,
    MAX_DISK_BYTES_MAX,
    MAX_DISK_BYTES_MIN,
    PEERS_MAX,
    PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT,
    PRODUCER_ID_EXPIRATION_MS_DEFAULT,
    READERS_MAX,
    READERS_PER_CONNECTION_MAX,
    RETENTION_CHECK_S_DEFAULT,
    SCRUB_BYTES_PER_S_DEFAULT,
    TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT,
)
from kq.raft.node import RaftConfig
from kq.raft.validation import address_problem, node_id_problem, rack_problem


class ConfigError(ValueError):
    """A configuration value is malformed; the node refuses to start."""


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything one node needs: identity, addresses, peers, data and tuning."""

    node_id: str
    grpc_address: str
    raft_address: str
    peers: tuple[Peer, ...]  # The other members.
    data_dir: Path
    secret: str
    grpc_workers: int = GRPC_WORKERS_DEFAULT
    raft: RaftConfig | None = None
    max_readers: int = READERS_MAX  # Waiting calls the node admits (broker/admission.py).
    max_readers_per_connection: int = READERS_PER_CONNECTION_MAX
    kafka: KafkaConfig | None = None  # None: no Kafka listener.
    # Defaults of the leader-run topic configs, by Kafka's names (`--topic-default`, raft/topic_config.py).
    topic_defaults: Mapping[str, str] = field(default_factory=dict)
    retention_check_s: float = RETENTION_CHECK_S_DEFAULT  # How often the leader looks for expired records.
    rack: str = ""  # Kafka's broker.rack ("": none): where follower fetching (KIP-392) sends consumers.
    compaction_check_s: float = COMPACTION_CHECK_S_DEFAULT  # How often the leader compacts (compact topics).
    # `--scrub-bytes-per-s`: stored bytes per second the scrubber checks (broker/repair.py; 0: off).
    scrub_bytes_per_s: int = SCRUB_BYTES_PER_S_DEFAULT
    # `--producer-id-expiration-ms` (Kafka's producer.id.expiration.ms): an idempotent producer idle this
    # long on a partition, with no open transaction there, is forgotten there (broker/producer_expiry.py);
    # checked every `producer_id_expiration_check_s` (producer.id.expiration.check.interval.ms).
    producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT
    producer_id_expiration_check_s: float = PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT / 1000
    # `--transactional-id-expiration-ms` (Kafka's transactional.id.expiration.ms): group 0 forgets a
    # transactional id with no transaction in progress once its state is unchanged this long.
    transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT
    # `--max-disk-bytes`: the LMDB map, so the store never grows past it; the leader refuses writes near
    # it (broker/storage_guard.py). None: 64 GiB of address space, bounded by the disk alone.
    max_disk_bytes: int | None = None
    http_address: str = ""  # `--http-address`: /metrics, /healthz, /readyz ("": not served).
    tls: ServerTls | None = None  # None: gRPC in plain text.
    auth: bool = False  # `--auth`: authentication required, ACLs enforced (broker/auth.py).
    super_users: tuple[str, ...] = ()  # `--super-user`: principals every ACL check allows.
    # `--processes`: the node's worker processes, one Raft group each (broker/workers.py); `group`: the
    # group this process is the replica of (0 in a single-process node).
    processes: int = 1
    group: int = 0

    @property
    def peer_credentials(self) -> grpc.ChannelCredentials | None:
        """The node's TLS as a client of other nodes (None: plain text)."""
        return self.tls.client().channel_credentials() if self.tls is not None else None

    @property
    def node_metadata(self) -> tuple[tuple[str, str], ...]:
        """What this node's calls to other nodes carry to be known as Node:<id> (broker/auth.py)."""
        return node_metadata(self.secret, self.node_id)

    @property
    def self_peer(self) -> Peer:
        """This node as a Peer."""
        return Peer(
            self.node_id,
            self.raft_address,
            self.grpc_address,
            self.kafka.address if self.kafka else "",
            self.rack,
        )


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The node's gRPC TLS (`--tls-cert`, `--tls-key`, `--tls-ca`, `--tls-require-client-cert`): its
    certificate and key (PEM), the cluster's CA, and whether clients must present a certificate it
    signed (mutual TLS). The node's own calls to other nodes use the same CA, certificate and key."""

    cert: bytes
    key: bytes
    ca: bytes
    require_client_cert: bool = False
    files: tuple[Path, Path, Path] | None = None  # cert, key, CA: what Python's ssl loads (Kafka TLS).

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for the node's gRPC port."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=self.require_client_cert
        )

    def ssl_context(self, sasl: bool = False) -> ssl.SSLContext:
        """The Kafka listener's TLS (`--kafka-tls`): the same certificate, and client certificates
        required from the same CA under `--tls-require-client-cert`, unless the listener has SASL
        (`--kafka-sasl`: SASL_SSL), where SASL authenticates the client and none is asked for, as on
        Kafka's own SASL_SSL listeners."""
        assert self.files is not None, "made from files (broker/main.py)"
        cert, key, ca = self.files
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        context.load_cert_chain(cert, key)
        required = self.require_client_cert and not sasl
        context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_NONE
        return context

    def client(self) -> TlsConfig:
        """The node as a client of other nodes (membership probes, Kafka calls forwarded to the leader)."""
        return TlsConfig(self.ca, self.cert, self.key)


KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")  # broker/kafka/sasl.py serves each.


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """The node's Kafka listener (broker/kafka/)."""

    address: str
    frame_bytes_max: int = KAFKA_FRAME_BYTES_DEFAULT
    default_partitions: int = KAFKA_DEFAULT_PARTITIONS
    auto_create_topics: bool = True
    tls: bool = False  # `--kafka-tls`: the listener speaks TLS with the node's certificate (SSL clients).
    # `--kafka-sasl`: the SASL mechanisms clients must authenticate with (SASL_SSL with --kafka-tls,
    # else SASL_PLAINTEXT); () for none.
    sasl_mechanisms: tuple[str, ...] = ()
    # `--group-consumer-heartbeat-interval-ms` and `--group-consumer-session-timeout-ms` (Kafka's
    # group.consumer.heartbeat.interval.ms and group.consumer.session.timeout.ms): the interval every
    # ConsumerGroupHeartbeat answer names, and the silence after which a consumer-group member expires.
    consumer_heartbeat_interval_ms: int = CONSUMER_HEARTBEAT_INTERVAL_MS
    consumer_session_timeout_ms: int = CONSUMER_SESSION_TIMEOUT_MS


def _checked(text: str, problem: str | None) -> str:
    if problem is not None:
        raise ConfigError(problem)
    return text


def parse_address(text: str, what: str) -> str:
    """Checks `host:port` as a member's address in the Raft log is checked, and returns it unchanged."""
    return _checked(text, address_problem(text, what))


def parse_rack(text: str, what: str) -> str:
    """Checks a rack name ("" for none) and returns it unchanged."""
    return _checked(text, rack_problem(text, what))


def parse_node_id(text: str) -> str:
    """Checks a node id and returns it unchanged."""
    return _checked(text, node_id_problem(text))


_SIZE_UNITS = {"": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"(\d+)\s*([KkMmGgTt]i[Bb])?")


def parse_sasl_mechanisms(text: str) -> tuple[str, ...]:
    """`--kafka-sasl-mechanisms`: a comma-separated, non-empty subset of KAFKA_SASL_MECHANISMS."""
    names = tuple(dict.fromkeys(name.strip().upper() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in KAFKA_SASL_MECHANISMS]
    if not names or unknown:
        raise ConfigError(
            f"--kafka-sasl-mechanisms: one or more of {', '.join(KAFKA_SASL_MECHANISMS)}, got {text[:80]!r}"
        )
    return names


def parse_byte_size(text: str, what: str) -> int:
    """Bytes from `123`, `64MiB`, `10 GiB` (binary units only, so a size means one thing), checked
    against MAX_DISK_BYTES_MIN and MAX_DISK_BYTES_MAX."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"{what} must be a number of bytes, optionally with KiB, MiB, GiB or TiB: {text!r}")
    size = int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]
    if not MAX_DISK_BYTES_MIN <= size <= MAX_DISK_BYTES_MAX:
        raise ConfigError(
            f"{what} must be between {MAX_DISK_BYTES_MIN // 1024**2} MiB and "
            f"{MAX_DISK_BYTES_MAX // 1024**4} TiB; got {text!r}"
        )
    return size


def parse_peer(item: str) -> Peer:
    """Parses one `id=raft_host:port=grpc_host:port[=kafka_host:port][@rack]`."""
    spec, at, rack = item.partition("@")
    fields = spec.split("=")
    if len(fields) not in (3, 4) or not fields[0] or (at and not rack):
        raise ConfigError(f"peer {item!r} must be id=raft_host:port=grpc_host:port[=kafka_host:port][@rack]")
    node_id, raft_address, grpc_address = fields[:3]
    return Peer(
        parse_node_id(node_id),
        parse_address(raft_address, "peer raft address"),
        parse_address(grpc_address, "peer gRPC address"),
        parse_address(fields[3], "peer Kafka address") if len(fields) == 4 else "",
        parse_rack(rack, "a peer's rack"),
    )


def parse_peers(text: str, self_id: str, self_rack: str = "") -> tuple[Peer, ...]:
    """Parses `id=raft_host:port=grpc_host:port[=kafka_host:port][@rack],...`; the entry for `self_id`
    (if listed) is dropped, after checking that any rack it names is `self_rack` (the node's --rack).

    The rack is a suffix rather than a fifth field so that a peer without a Kafka listener can have
    one, and every spec written before racks existed still parses the same."""
    peers: list[Peer] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        peer = parse_peer(item)
        node_id, rack = peer.node_id, peer.rack
        if node_id != self_id:
            peers.append(peer)
        elif rack and rack != self_rack:
            raise ConfigError(f"--peers puts node {node_id} in rack {rack!r} but its --rack is {self_rack!r}")
    ids = [peer.node_id for peer in peers]
    if len(set(ids)) != len(ids):
        raise ConfigError("peer ids must be unique")
    if len(peers) + 1 > PEERS_MAX:
        raise ConfigError(f"at most {PEERS_MAX} nodes in a cluster")
    return tuple(peers)
