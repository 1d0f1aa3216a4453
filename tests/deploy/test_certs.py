"""`kq certs init`: the certificates it makes verify against its CA and carry a TLS handshake (Python's
ssl, over loopback), mutual TLS included; keys are private; bad input changes nothing."""

from __future__ import annotations

import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from kq.cli.main import kq
from kq.deploy.certs import CertificateError, init


def test_certs_init_writes_a_ca_nodes_and_clients_with_private_keys(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        kq, ["certs", "init", str(tmp_path / "certs"), "--node", "1=127.0.0.1,kq-1.example", "--node", "2"]
    )
    assert result.exit_code == 0, result.output
    names = sorted(path.name for path in (tmp_path / "certs").iterdir())
    assert names == sorted(
        [
            "ca.pem",
            "ca-key.pem",
            "node-1.pem",
            "node-1-key.pem",
            "node-2.pem",
            "node-2-key.pem",
            "admin.pem",
            "admin-key.pem",
        ]
    )
    for key in (tmp_path / "certs").glob("*-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    ca = x509.load_pem_x509_certificate((tmp_path / "certs" / "ca.pem").read_bytes())
    node = x509.load_pem_x509_certificate((tmp_path / "certs" / "node-1.pem").read_bytes())
    node.verify_directly_issued_by(ca)
    names_of = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names_of.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names_of.get_values_for_type(x509.DNSName) == ["kq-1.example"]
    usages = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    client = x509.load_pem_x509_certificate((tmp_path / "certs" / "admin.pem").read_bytes())
    client.verify_directly_issued_by(ca)
    assert client.subject.rfc4514_string() == "CN=admin"


def test_a_node_certificate_serves_mutual_tls_to_a_client_certificate(tmp_path: Path) -> None:
    """A TLS server with node 1's certificate, requiring a client certificate from the CA; a client
    with the CA and the admin certificate connects to 127.0.0.1; one without a certificate cannot."""
    issued = init(tmp_path, {"1": ["127.0.0.1"]}, ["admin"], days=1)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(issued.ca))
    server_context.load_cert_chain(tmp_path / "node-1.pem", tmp_path / "node-1-key.pem")
    server_context.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve(count: int) -> None:
            for _ in range(count):
                connection, _ = listener.accept()
                try:
                    with server_context.wrap_socket(connection, server_side=True) as tls:
                        peer = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True) or b"")
                        seen.append(peer.subject.rfc4514_string())
                        tls.sendall(b"ok")
                except ssl.SSLError:
                    seen.append("refused")

        server = threading.Thread(target=serve, args=(2,), daemon=True)
        server.start()
        client_context = ssl.create_default_context(cafile=str(issued.ca))
        client_context.load_cert_chain(tmp_path / "admin.pem", tmp_path / "admin-key.pem")
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client_context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
        anonymous = ssl.create_default_context(cafile=str(issued.ca))
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            pytest.raises((ssl.SSLError, OSError)),
            anonymous.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.recv(2)
        server.join(timeout=10)
    assert seen == ["CN=admin", "refused"]


@pytest.mark.parametrize(
    ("nodes", "clients", "days", "message"),
    [
        ({"1": ["not a host"]}, ["admin"], 30, "neither an IP address nor a host name"),
        ({"1": ["127.0.0.1"]}, ["ca"], 30, "would overwrite another file"),
        ({"1": ["127.0.0.1"]}, ["admin"], 0, "days must be 1 to"),
        ({"../1": ["127.0.0.1"]}, ["admin"], 30, "a node id is"),
    ],
)
def test_bad_input_writes_nothing(
    tmp_path: Path, nodes: dict[str, list[str]], clients: list[str], days: int, message: str
) -> None:
    with pytest.raises(CertificateError, match=message):
        init(tmp_path / "certs", nodes, clients, days)
    assert not (tmp_path / "certs").exists()


def test_a_directory_with_certificates_is_not_overwritten(tmp_path: Path) -> None:
    init(tmp_path, {"1": ["127.0.0.1"]}, ["admin"], days=1)
    before = (tmp_path / "ca.pem").read_bytes()
    result = CliRunner().invoke(kq, ["certs", "init", str(tmp_path)])
    assert result.exit_code != 0 and "holds certificates already" in result.output
    assert (tmp_path / "ca.pem").read_bytes() == before
