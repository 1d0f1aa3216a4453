"""`kq.deploy.tls_probe` catches a cluster that is meant to be secure but serves plain text, and passes
one that serves TLS only: the guard the secure chaos run and the secure benchmark columns rely on."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kq.deploy.cluster import LocalCluster
from kq.deploy.tls_probe import (
    PROBE_CORRELATION_ID,
    api_versions_request,
    is_api_versions_answer,
    plain_text_problems,
)


class _TlsFlagsLost(LocalCluster):
    """Certificates made, but the nodes started without any TLS flag (the harness's own status calls
    in plain text, so that it sees them start)."""

    def __init__(self, base_dir: Path, tls_dir: Path) -> None:
        super().__init__(base_dir, 1, tls_dir=tls_dir)
        self.tls = None

    def _tls_args(self, node_id: str) -> tuple[str, ...]:
        return ()


def test_api_versions_probe_frames_a_request_and_knows_its_answer() -> None:
    """The request is size-prefixed ApiVersions v0; an answer is recognised by its correlation id, a TLS
    alert or a close is not."""
    request = api_versions_request()
    assert struct.unpack(">i", request[:4])[0] == len(request) - 4
    assert struct.unpack(">hhi", request[4:12]) == (18, 0, PROBE_CORRELATION_ID)
    assert is_api_versions_answer(struct.pack(">ii", 200, PROBE_CORRELATION_ID) + b"\0" * 8)
    assert not is_api_versions_answer(struct.pack(">ii", 200, 7))
    assert not is_api_versions_answer(b"\x15\x03\x03\x00\x02\x02\x28")  # A TLS alert record.
    assert not is_api_versions_answer(b"")


@pytest.mark.system
def test_probe_reports_a_node_serving_plain_text_and_passes_one_serving_tls(tmp_path: Path) -> None:
    """One node without its TLS flags: gRPC and Kafka answer plain text and Kafka refuses TLS, each
    reported; the same node with its flags: nothing reported."""
    with _TlsFlagsLost(tmp_path / "plain", tmp_path / "plain-certs") as plain:
        problems = plain_text_problems(plain)
    assert len(problems) == 3, problems
    assert (
        "plain-text gRPC" in problems[0] and "plain-text Kafka" in problems[1] and "TLS Kafka" in problems[2]
    )
    with LocalCluster(tmp_path / "secure", 1, tls_dir=tmp_path / "secure-certs") as secure:
        assert plain_text_problems(secure) == []
