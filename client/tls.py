"""TLS for kq's gRPC: the CA that signed the nodes' certificates and, for mutual TLS, this side's own
certificate and key (`kq certs init` makes them: deploy/certs.py). Used by `KqClient` (`tls=`), the CLI
(`--tls-ca`, `--tls-cert`, `--tls-key`) and a node's own calls to other nodes."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc


class TlsConfigError(ValueError):
    """A TLS file is missing or unreadable, or a certificate came without its key (or the reverse)."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM bytes: the CA to verify nodes with, and this side's certificate and key (both or neither)."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(
        cls, ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None
    ) -> TlsConfig:
        """Reads the files; raises TlsConfigError naming the one that cannot be used."""
        if (cert is None) != (key is None):
            raise TlsConfigError("a TLS certificate needs its key, and a key its certificate")
        ca_bytes = _read(ca, "CA")
        assert ca_bytes is not None
        return cls(ca_bytes, _read(cert, "certificate"), _read(key, "key"))

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC credentials for a channel to a node."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TlsConfigError(f"cannot read the TLS {what} {path}: {error.strerror}") from error
    if b"-----BEGIN" not in data:
        raise TlsConfigError(f"the TLS {what} {path} is not PEM")
    return data


def is_loopback(address: str) -> bool:
    """Whether `host:port` names this machine only (localhost, 127.0.0.0/8, ::1)."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # A name other than localhost: reachable from elsewhere, as far as kq knows.
