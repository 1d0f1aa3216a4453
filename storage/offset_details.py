"""What Kafka keeps beside a committed offset: its metadata string and the leader epoch the consumer
saw there (OffsetCommit, TxnOffsetCommit; OffsetFetch answers both). Rows of `offset_metadata`, and the
tail of a pending transactional offset (`txn_offsets`): layout in storage/__init__.py."""

from __future__ import annotations

import struct
from dataclasses import dataclass

_EPOCH = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class OffsetDetails:
    """A committed offset's leader epoch (-1: none) and metadata string ("": none)."""

    leader_epoch: int = -1
    metadata: str = ""


NO_OFFSET_DETAILS = OffsetDetails()


def encode_offset_details(details: OffsetDetails) -> bytes:
    """leader_epoch i32, then the metadata's UTF-8 bytes."""
    return _EPOCH.pack(details.leader_epoch) + details.metadata.encode(errors="surrogatepass")


def decode_offset_details(raw: bytes) -> OffsetDetails:
    """The inverse of encode_offset_details."""
    return OffsetDetails(_EPOCH.unpack_from(raw)[0], raw[_EPOCH.size :].decode(errors="surrogatepass"))
