"""Pure tests of the group CLI's option checks and formatting: no cluster, no sockets."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
import pytest

from kq.cli.group_consume import CLIENT_ID_DEFAULT, GroupSettings, group_settings
from kq.cli.group_output import (
    assignment_text,
    datetime_to_ms,
    group_heading,
    group_to_dict,
    lag_table,
    ms_to_text,
)
from kq.client.types import GroupDescription, GroupMemberInfo, PartitionLag

NO_STANDALONE = {"--partition": False, "--offset": False, "--node": False}


def _settings(**given: Any) -> GroupSettings | None:
    arguments: dict[str, Any] = {
        "group": "g",
        "topic": "t",
        "pattern": None,
        "from_beginning": False,
        "commit": None,
        "reset": None,
        "assignor": None,
        "client_id": None,
        "standalone_options": NO_STANDALONE,
    }
    return group_settings(**{**arguments, **given})


def test_group_settings_defaults_are_auto_commit_latest_and_the_brokers_assignor() -> None:
    """Without choices a member commits automatically, starts new partitions at the end, and lets the
    broker pick the assignor; --from-beginning means --reset earliest."""
    assert _settings() == GroupSettings("g", ("t",), "", "auto", "latest", "", CLIENT_ID_DEFAULT)
    settings = _settings(from_beginning=True)
    assert settings is not None and settings.reset == "earliest"
    settings = _settings(topic=None, pattern="t.*", commit="manual", assignor="sticky", client_id="me")
    assert settings == GroupSettings("g", (), "t.*", "manual", "latest", "sticky", "me")
    assert _settings(group=None, topic="t") is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"group": None, "reset": "earliest"}, "--reset needs --group"),
        ({"group": None, "client_id": "me"}, "--client-id needs --group"),
        ({"standalone_options": {**NO_STANDALONE, "--node": True}}, "--group and --node cannot"),
        ({"topic": None}, "name either a TOPIC or a --pattern"),
        ({"pattern": "t.*"}, "name either a TOPIC or a --pattern"),
        ({"from_beginning": True, "reset": "earliest"}, "--from-beginning and --reset cannot"),
    ],
)
def test_group_settings_reject_options_that_do_not_fit_together(
    given: dict[str, object], message: str
) -> None:
    """Group options without --group, standalone options with it, or two starting points: usage errors."""
    with pytest.raises(click.UsageError, match=message):
        _settings(**given)


def test_datetimes_convert_exactly_in_their_zone_and_local_time_without_one() -> None:
    """ISO 8601 with Z or an offset converts to exact milliseconds; a bare time is local time (as Kafka)."""
    assert datetime_to_ms("1970-01-01T00:00:01Z") == 1_000
    assert datetime_to_ms("2023-11-14T23:13:22.5+01:00") == 1_700_000_002_500
    assert datetime_to_ms("2023-11-14T22:13:20.001Z") == 1_700_000_000_001  # No float rounding.
    local = datetime(2024, 5, 1, 12, 0, 0).astimezone()
    assert datetime_to_ms("2024-05-01T12:00:00") == int(local.timestamp()) * 1000
    with pytest.raises(ValueError):
        datetime_to_ms("May 1st")
    assert ms_to_text(1_700_000_002_500) == "2023-11-14T22:13:22.500Z"


def test_assignment_text_groups_partitions_by_topic() -> None:
    """An assignment prints as `topic p,p; topic p`, sorted, or `no partitions`."""
    assert assignment_text([("b", 2), ("a", 1), ("a", 0)]) == "a 0,1; b 2"
    assert assignment_text([]) == "no partitions"


def test_group_document_has_null_for_no_committed_offset_and_no_owner() -> None:
    """In JSON a partition never committed has `committed_offset: null`; one nobody owns `member_id: null`;
    a commit retention trimmed past is marked below the log start."""
    description = GroupDescription(
        "g",
        "stable",
        3,
        "sticky",
        (GroupMemberInfo("m-1", "me", ("t",), (("t", 0),)),),
        (PartitionLag("t", 0, "m-1", None, 5, 5), PartitionLag("t", 1, "", 2, 4, 1, 3)),
        "2",
    )
    document = group_to_dict(description)
    assert [document[key] for key in ("name", "phase", "generation", "assignor", "served_by")] == [
        "g",
        "stable",
        3,
        "sticky",
        "2",
    ]
    assert document["members"] == [
        {
            "member_id": "m-1",
            "client_id": "me",
            "subscription": ["t"],
            "partitions": [{"topic": "t", "partition": 0}],
        }
    ]
    assert document["partitions"] == [
        {
            "topic": "t",
            "partition": 0,
            "member_id": "m-1",
            "committed_offset": None,
            "below_log_start": False,
            "log_start_offset": 0,
            "log_end_offset": 5,
            "lag": 5,
        },
        {  # Retention moved the log start to 3, past the commit at 2: one record is left to read.
            "topic": "t",
            "partition": 1,
            "member_id": None,
            "committed_offset": 2,
            "below_log_start": True,
            "log_start_offset": 3,
            "log_end_offset": 4,
            "lag": 1,
        },
    ]
    assert list(lag_table(description).columns[3].cells) == ["-", "2 (below start)"]
    assert document["total_lag"] == 6
    assert (
        group_heading(description)
        == "group g: stable, generation 3, assignor sticky, 1 member; served by node 2"
    )
