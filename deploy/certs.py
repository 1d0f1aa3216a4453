"""A cluster's certificates, made with `cryptography`: one CA, one certificate per node, one per client.

`kq certs init DIR` (cli/certs.py) writes them; nothing in kq reads them yet but the TLS options that
come with the security issue. Every key is ECDSA P-256, every file PEM, every private key readable by
its owner only (0600). A node's certificate names its hosts as subject alternative names (IP
addresses as IP entries, names as DNS entries) and serves as server and client (nodes dial each
other); a client's names its principal as the common name.

Files in DIR: `ca.pem`, `ca-key.pem`, `node-<id>.pem`, `node-<id>-key.pem`, `<client>.pem`,
`<client>-key.pem`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kq.proto.limits import CERT_DAYS_MAX, CERT_HOSTS_MAX, CERT_NODES_MAX

CA_NAME = "kq cluster CA"
KEY_FILE_MODE = 0o600


class CertificateError(ValueError):
    """The certificates cannot be made as asked (a bad host, a taken directory); nothing was written."""


@dataclass(frozen=True, slots=True)
class Issued:
    """What `init` wrote."""

    ca: Path
    nodes: dict[str, Path]
    clients: dict[str, Path]


def init(directory: Path, nodes: Mapping[str, Sequence[str]], clients: Sequence[str], days: int) -> Issued:
    """Writes a CA, a certificate per node (`nodes`: id -> its hosts) and per client principal into
    `directory`, which must not hold certificates already. Raises CertificateError."""
    _check(nodes, clients, days)
    if (directory / "ca.pem").exists():
        raise CertificateError(f"{directory} holds certificates already; choose another directory")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory, "ca", ca, ca_key)
    issued_nodes = {}
    for node_id, hosts in nodes.items():
        issued_nodes[node_id] = _leaf(
            directory, f"node-{node_id}", f"kq node {node_id}", hosts, ca, ca_key, now, days
        )
    issued_clients = {
        client: _leaf(directory, client, client, (), ca, ca_key, now, days) for client in clients
    }
    return Issued(directory / "ca.pem", issued_nodes, issued_clients)


def issue_node(directory: Path, node_id: str, hosts: Sequence[str], days: int) -> Path:
    """Issues node `node_id`'s certificate (a node added later) from the CA `init` wrote in `directory`;
    raises CertificateError if the node has one already, or the input is bad."""
    _check({node_id: hosts}, (), days)
    if (directory / f"node-{node_id}.pem").exists():
        raise CertificateError(f"node {node_id} has a certificate in {directory} already")
    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca-key.pem").read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{directory / 'ca-key.pem'} is not the EC key `kq certs init` makes")
    now = datetime.datetime.now(datetime.UTC)
    return _leaf(directory, f"node-{node_id}", f"kq node {node_id}", hosts, ca, ca_key, now, days)


def _check(nodes: Mapping[str, Sequence[str]], clients: Sequence[str], days: int) -> None:
    if not 1 <= days <= CERT_DAYS_MAX:
        raise CertificateError(f"days must be 1 to {CERT_DAYS_MAX}, got {days}")
    if not 1 <= len(nodes) <= CERT_NODES_MAX:
        raise CertificateError(f"1 to {CERT_NODES_MAX} nodes, got {len(nodes)}")
    for node_id, hosts in nodes.items():
        if not node_id or not node_id.replace("-", "").replace("_", "").isalnum():
            raise CertificateError(f"a node id is letters, digits, '-' and '_': {node_id!r}")
        if not 1 <= len(hosts) <= CERT_HOSTS_MAX:
            raise CertificateError(f"node {node_id}: 1 to {CERT_HOSTS_MAX} hosts, got {len(hosts)}")
        for host in hosts:
            _san(host)  # Raises for a bad host.
    for client in clients:
        if not client or not client.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise CertificateError(f"a client principal is letters, digits, '.', '-' and '_': {client!r}")
        if client == "ca" or client.startswith("node-"):
            raise CertificateError(f"client principal {client!r} would overwrite another file")


def _san(host: str) -> x509.GeneralName:
    """A host as a subject alternative name: an IP address, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        labels = host.split(".")
        if (
            not host
            or len(host) > 253
            or not all(
                label and len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
                for label in labels
            )
        ):
            raise CertificateError(f"{host!r} is neither an IP address nor a host name") from None
        return x509.DNSName(host)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, now: datetime.datetime, days: int
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # Clocks of a cluster differ a little.
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _leaf(
    directory: Path,
    stem: str,
    common_name: str,
    hosts: Sequence[str],
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    days: int,
) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = _builder(name, ca.subject, key.public_key(), now, days).add_extension(
        x509.BasicConstraints(ca=False, path_length=None), critical=True
    )
    if hosts:  # A node: it serves, and dials its peers.
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
    certificate = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
        ca_key, hashes.SHA256()
    )
    return _write(directory, stem, certificate, key)


def _write(
    directory: Path, stem: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Path:
    """`<stem>.pem` and `<stem>-key.pem` (0600, created so: never readable by others, even briefly)."""
    path = directory / f"{stem}.pem"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(directory / f"{stem}-key.pem", os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key_bytes)
    return path
