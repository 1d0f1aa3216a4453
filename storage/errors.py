"""Errors raised by storage: each one is a bug or on-disk corruption, never a user mistake, except
`FormatError`: a file of the data directory that this kq does not read (a newer kq wrote it)."""


class StorageError(Exception):
    """Base of storage failures."""


class CorruptRecordError(StorageError):
    """A stored record failed its checksum or its layout check; it must never be served.

    `batch`: where, when a read of the store found it: (topic id, partition, the batch's key offset);
    None for a batch checked outside the store (a produce request's, a copy's)."""

    def __init__(self, message: str, batch: tuple[int, int, int] | None = None) -> None:
        super().__init__(message)
        self.batch = batch


class SnapshotError(StorageError):
    """A snapshot file is incomplete or does not match its checksum."""


class FormatError(StorageError):
    """A file of a node's data directory carries a format version this kq does not read (a newer kq
    wrote it), or is not kq's at all: the node refuses to start and writes nothing there. Its message
    is one line, what an operator reads: the path, the version found and the versions this kq reads
    (DESIGN.md, "On-disk formats and versions")."""


class StoreFormatError(FormatError):
    """The store's layout (its `meta` row b"layout") is newer than this kq's `LAYOUT_VERSION`."""
