"""Errors raised by storage: each one is a bug or on-disk corruption, never a user mistake."""


class StorageError(Exception):
    """Base of storage failures."""


class CorruptRecordError(StorageError):
    """A stored record failed its checksum or its layout check; it must never be served."""


class SnapshotError(StorageError):
    """A snapshot file is incomplete or does not match its checksum."""
