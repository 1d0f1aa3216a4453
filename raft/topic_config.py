"""Topic configs by Kafka's names: which exist, what values are legal, and what a topic has in effect.

Pure and bounded, and shared like raft/validation.py: the edge (gRPC, the Kafka listener, the node's
`--topic-default` flags) refuses what `configs_problem` refuses, and apply runs the same check on
every committed CreateTopic and AlterTopicConfig, so a stored override is always one of these names
with a legal value.

Where a value comes from: a topic's override (replicated, stored with the topic), else the cluster
default. Two kinds of config read the default differently, because apply must not read anything
that differs between nodes:
- **applied** configs (`max.message.bytes`, `message.timestamp.type`) change what apply stores, so
  their default is kq's built-in one, the same on every node; a node flag cannot change it.
- **leader-run** configs (retention, cleanup policy, compaction lags) only change what the leader
  proposes (a trim), so their default may come from the node's `--topic-default` flags; give every
  node the same flags (deploy/run-cluster.sh does), or a new leader applies its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kq.proto import kq_pb2
from kq.proto.limits import APPEND_BYTES_MAX, TOPIC_CONFIG_VALUE_LENGTH_MAX, TOPIC_CONFIGS_PARSED_KEPT

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
CLEANUP_POLICY = "cleanup.policy"
DELETE_RETENTION_MS = "delete.retention.ms"
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"
MAX_MESSAGE_BYTES = "max.message.bytes"
MESSAGE_TIMESTAMP_TYPE = "message.timestamp.type"

CREATE_TIME, LOG_APPEND_TIME = "CreateTime", "LogAppendTime"
DELETE, COMPACT = "delete", "compact"


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    """One config: its Kafka type name (DescribeConfigs' config_type), built-in default, checker, and
    whether apply reads it (then only the built-in default applies, see the module docstring)."""

    kind: str  # "long", "int", "double", "string" or "list", as Kafka's ConfigDef names them.
    default: str
    problem: Callable[[str], str | None]
    applied: bool
    documentation: str


def _integer(low: int, high: int) -> Callable[[str], str | None]:
    """A checker of a decimal integer in [low, high] (ASCII digits, an optional leading minus)."""

    def problem(value: str) -> str | None:
        digits = value[1:] if value.startswith("-") else value
        if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 19:
            return f"{value!r} is not an integer"
        number = int(value)
        if not low <= number <= high:
            return f"{number} is outside [{low}, {high}]"
        return None

    return problem


def _ratio_problem(value: str) -> str | None:
    """A decimal fraction in [0, 1] (digits, at most one point: no exponent, inf or nan)."""
    whole, _, fraction = value.partition(".")
    digits = whole + fraction
    if not digits or not digits.isascii() or not digits.isdigit() or len(value) > 20:
        return f"{value!r} is not a decimal number"
    if not 0.0 <= float(value) <= 1.0:
        return f"{value} is outside [0, 1]"
    return None


def _one_of(*choices: str) -> Callable[[str], str | None]:
    def problem(value: str) -> str | None:
        return None if value in choices else f"{value!r} is not one of {', '.join(choices)}"

    return problem


def _cleanup_policy_problem(value: str) -> str | None:
    """`delete`, `compact`, or both (comma-separated, either order), as Kafka accepts."""
    parts = [part.strip() for part in value.split(",")]
    if not parts or any(part not in (DELETE, COMPACT) for part in parts) or len(set(parts)) != len(parts):
        return f"{value!r} is not delete, compact or compact,delete"
    return None


CONFIGS: dict[str, ConfigSpec] = {
    RETENTION_MS: ConfigSpec(
        "long",
        "-1",
        _integer(-1, INT64_MAX),
        False,
        "How long a record is kept, from its batch's max timestamp; -1 keeps it forever (kq's default;"
        " Kafka's is 604800000, seven days).",
    ),
    RETENTION_BYTES: ConfigSpec(
        "long",
        "-1",
        _integer(-1, INT64_MAX),
        False,
        "The most bytes a partition keeps; the oldest batches go first. -1: no bound.",
    ),
    CLEANUP_POLICY: ConfigSpec(
        "list",
        DELETE,
        _cleanup_policy_problem,
        False,
        "delete: retention trims old records; compact: the newest record per key is kept; or both.",
    ),
    DELETE_RETENTION_MS: ConfigSpec(
        "long",
        "86400000",
        _integer(0, INT64_MAX),
        False,
        "How long a compacted topic keeps a tombstone (a null value) before compaction drops it.",
    ),
    MIN_COMPACTION_LAG_MS: ConfigSpec(
        "long",
        "0",
        _integer(0, INT64_MAX),
        False,
        "How old a record must be before compaction may drop it.",
    ),
    MIN_CLEANABLE_DIRTY_RATIO: ConfigSpec(
        "double",
        "0.5",
        _ratio_problem,
        False,
        "Compaction runs on a partition once the part not yet compacted is at least this share of its"
        " bytes (or a tombstone expires).",
    ),
    MAX_MESSAGE_BYTES: ConfigSpec(
        "int",
        str(APPEND_BYTES_MAX),
        _integer(1, APPEND_BYTES_MAX),
        True,
        f"The largest record batch the topic accepts, as sent (compressed); at most {APPEND_BYTES_MAX}.",
    ),
    MESSAGE_TIMESTAMP_TYPE: ConfigSpec(
        "string",
        CREATE_TIME,
        _one_of(CREATE_TIME, LOG_APPEND_TIME),
        True,
        "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the leader's"
        " clock when it is appended.",
    ),
}


def entry_problem(name: str, value: str) -> str | None:
    """Why `name = value` is not a legal topic config, or None."""
    spec = CONFIGS.get(name)
    if spec is None:
        return f"unknown topic config {name[:64]!r} (kq knows {', '.join(sorted(CONFIGS))})"
    if len(value) > TOPIC_CONFIG_VALUE_LENGTH_MAX:
        return f"{name}: a value of {len(value)} characters (at most {TOPIC_CONFIG_VALUE_LENGTH_MAX})"
    problem = spec.problem(value)
    return None if problem is None else f"{name}: {problem}"


def configs_problem(entries: Sequence[kq_pb2.ConfigEntry], removed: Sequence[str] = ()) -> str | None:
    """Why a set of overrides (and names to remove) is not legal: an unknown name, a bad value, or a
    name given twice. Bounded: at most one entry per known config is ever examined."""
    if len(entries) + len(removed) > 2 * len(CONFIGS):
        return f"{len(entries) + len(removed)} config changes; there are {len(CONFIGS)} topic configs"
    seen: set[str] = set()
    for entry in entries:
        problem = entry_problem(entry.name, entry.value)
        if problem is not None:
            return problem
        if entry.name in seen:
            return f"{entry.name} is given twice"
        seen.add(entry.name)
    for name in removed:
        if name not in CONFIGS:
            return f"unknown topic config {name[:64]!r}"
        if name in seen:
            return f"{name} is both set and removed"
        seen.add(name)
    return None


def defaults_problem(defaults: Mapping[str, str]) -> str | None:
    """Why node-level defaults are not legal: a bad entry, or one for a config apply reads."""
    for name, value in defaults.items():
        problem = entry_problem(name, value)
        if problem is not None:
            return problem
        if CONFIGS[name].applied:
            return f"{name} has kq's built-in default on every node; set it per topic instead"
    return None


def encode_overrides(overrides: Mapping[str, str]) -> bytes:
    """The stored form of a topic's overrides: deterministic (sorted by name), so replicas match."""
    entries = [kq_pb2.ConfigEntry(name=name, value=overrides[name]) for name in sorted(overrides)]
    return kq_pb2.TopicConfigs(entries=entries).SerializeToString()


def decode_overrides(data: bytes | None) -> dict[str, str]:
    """A topic's stored overrides (none when `data` is None)."""
    if not data:
        return {}
    return {entry.name: entry.value for entry in kq_pb2.TopicConfigs.FromString(data).entries}


def altered(
    overrides: Mapping[str, str], set_entries: Iterable[kq_pb2.ConfigEntry], removed: Iterable[str]
) -> dict[str, str]:
    """`overrides` after setting `set_entries` and removing `removed` (both checked already)."""
    result = dict(overrides)
    for name in removed:
        result.pop(name, None)
    for entry in set_entries:
        result[entry.name] = entry.value
    return result


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's configs in effect, parsed."""

    retention_ms: int
    retention_bytes: int
    cleanup_policy: frozenset[str]
    delete_retention_ms: int
    min_compaction_lag_ms: int
    min_cleanable_dirty_ratio: float
    max_message_bytes: int
    log_append_time: bool

    @property
    def deletes(self) -> bool:
        """Whether retention trims this topic."""
        return DELETE in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        """Whether compaction runs on this topic."""
        return COMPACT in self.cleanup_policy


def values(overrides: Mapping[str, str], defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every config's value: the override, else (for leader-run configs) the node default, else kq's."""
    node_defaults = defaults or {}
    result = {}
    for name, spec in CONFIGS.items():
        if name in overrides:
            result[name] = overrides[name]
        elif not spec.applied and name in node_defaults:
            result[name] = node_defaults[name]
        else:
            result[name] = spec.default
    return result


def effective(overrides: Mapping[str, str], defaults: Mapping[str, str] | None = None) -> TopicConfig:
    """The parsed configs in effect (`values`); every value was checked when it was stored or given."""
    current = values(overrides, defaults)
    return TopicConfig(
        retention_ms=int(current[RETENTION_MS]),
        retention_bytes=int(current[RETENTION_BYTES]),
        cleanup_policy=frozenset(part.strip() for part in current[CLEANUP_POLICY].split(",")),
        delete_retention_ms=int(current[DELETE_RETENTION_MS]),
        min_compaction_lag_ms=int(current[MIN_COMPACTION_LAG_MS]),
        min_cleanable_dirty_ratio=float(current[MIN_CLEANABLE_DIRTY_RATIO]),
        max_message_bytes=int(current[MAX_MESSAGE_BYTES]),
        log_append_time=current[MESSAGE_TIMESTAMP_TYPE] == LOG_APPEND_TIME,
    )


def applied_config(overrides: Mapping[str, str]) -> TopicConfig:
    """What apply may read: the overrides over kq's built-in defaults only (no node's flags)."""
    return effective(overrides, None)


@functools.lru_cache(maxsize=TOPIC_CONFIGS_PARSED_KEPT)
def applied_config_of(stored: bytes | None) -> TopicConfig:
    """`applied_config` of a topic's stored overrides (`StoreReader.topic_configs`; None: none), kept by
    those bytes: a pure function of them (a TopicConfig is immutable), so every replica's apply reads
    the same config, and a produce request no longer parses its topic's configs (~8 µs) each time."""
    return applied_config(decode_overrides(stored))


class ConfigParser:
    """A node's parsed topic configs by their stored overrides: what apply reads (`applied_config_of`)
    and what is in effect with the node's defaults (`effective`), for the edge's checks of each
    produce request. Keeps at most TOPIC_CONFIGS_PARSED_KEPT of the latter, then starts again (any
    thread: a race parses the same bytes twice)."""

    def __init__(self, defaults: Mapping[str, str]) -> None:
        self._defaults = dict(defaults)
        self._parsed: dict[bytes | None, TopicConfig] = {}

    def parsed(self, stored: bytes | None) -> tuple[TopicConfig, TopicConfig]:
        """(what apply reads, what is in effect on this node) for a topic's stored overrides."""
        in_effect = self._parsed.get(stored)
        if in_effect is None:
            if len(self._parsed) >= TOPIC_CONFIGS_PARSED_KEPT:
                self._parsed = {}
            in_effect = self._parsed[stored] = effective(decode_overrides(stored), self._defaults)
        return applied_config_of(stored), in_effect


def parse_assignments(texts: Iterable[str]) -> dict[str, str]:
    """`name=value` strings (CLI and node flags) as a dict; ValueError for one without `=`."""
    result: dict[str, str] = {}
    for text in texts:
        name, separator, value = text.partition("=")
        if not separator:
            raise ValueError(f"{text!r} is not name=value")
        result[name.strip()] = value.strip()
    return result
