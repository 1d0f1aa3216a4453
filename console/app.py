"""The console's pages: a Starlette app over one `KqClient` (console/__init__.py).

Pages: `/` cluster (every node's role, leader, term, indexes, readiness), `/topics`, `/topics/{name}`
(partitions, offsets, sizes, configs, a browse form), `/topics/{name}/records` (records of a
partition from an offset, key and value as text or hex, headers), `/groups`, `/groups/{name}`
(members, assignment, lag per partition, the lag chart, refreshed by htmx from
`/groups/{name}/live`), and `/produce` (a test record; only with `--allow-writes`, else 403).

Every client call runs on Starlette's thread pool (the client blocks). Bad input — a non-numeric or
negative number, an unknown topic, partition or group, an unreachable cluster — becomes a message on
the page with a 4xx/5xx status (`ConsoleError`), never a stack trace. Templates autoescape.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kq.client import KqClient, KqClientError, group_leaders
from kq.client.errors import (
    GroupNotFoundError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    TopicNotFoundError,
)
from kq.console.render import lag_chart, show_bytes
from kq.console.sampler import LagSampler
from kq.proto.limits import (
    CONSOLE_LAG_SAMPLE_S,
    CONSOLE_LAG_SAMPLES_MAX,
    CONSOLE_PRODUCE_BYTES_MAX,
    CONSOLE_RECORDS_MAX,
    PARTITIONS_MAX,
)

HERE = Path(__file__).parent
Page = Callable[[Request], Awaitable[Response]]


class ConsoleError(Exception):
    """What a page shows instead of its content, with the HTTP status it answers."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Console:
    """The console's state: the client, the lag sampler, the templates, whether writes are allowed."""

    def __init__(self, client: KqClient, sampler: LagSampler, allow_writes: bool) -> None:
        self.client = client
        self.sampler = sampler
        self.allow_writes = allow_writes
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"])
        )

    def render(self, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        page = self.templates.get_template(template)
        html = page.render(allow_writes=self.allow_writes, **values)
        return HTMLResponse(html, status_code=status)

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """A blocking client call on the thread pool; a client error becomes a ConsoleError."""
        try:
            return await run_in_threadpool(function, *args)
        except (TopicNotFoundError, GroupNotFoundError) as error:
            raise ConsoleError(str(error), 404) from error
        except (InvalidRequestError, OffsetOutOfRangeError) as error:
            raise ConsoleError(str(error), 400) from error
        except KqClientError as error:
            raise ConsoleError(f"the cluster did not answer as asked: {error}", 502) from error


def number(request: Request, name: str, default: int | None, maximum: int) -> int:
    """A query or form value that must be a whole number in [0, maximum]."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConsoleError(f"{name} is required")
        return default
    if not raw.isdigit() or int(raw) > maximum:
        raise ConsoleError(f"{name} must be a whole number from 0 to {maximum}, not {raw[:40]!r}")
    return int(raw)


async def cluster(console: Console, request: Request) -> Response:
    answers = await console.call(console.client.cluster_status_by_address)
    nodes = []
    for address, status in answers:  # The bootstrap nodes, and the members they name.
        nodes.append(
            {
                "address": address,
                "status": None if isinstance(status, Exception) else status,
                "error": str(status) if isinstance(status, Exception) else "",
            }
        )
    # With worker processes (a Raft group each): every group's leader; none with one group.
    groups = group_leaders([status for _, status in answers])
    return console.render("cluster.html", nodes=nodes, groups=groups, title="Cluster")


async def topics(console: Console, request: Request) -> Response:
    found = await console.call(console.client.list_topics)
    return console.render("topics.html", topics=sorted(found, key=lambda t: t.name), title="Topics")


async def topic(console: Console, request: Request) -> Response:
    name = request.path_params["name"]
    description = await console.call(console.client.describe_topic, name)
    return console.render("topic.html", description=description, title=f"Topic {name}")


async def records(console: Console, request: Request) -> Response:
    name = request.path_params["name"]
    partition = number(request, "partition", 0, PARTITIONS_MAX - 1)
    offset = number(request, "offset", 0, 2**63 - 1)
    as_hex = request.query_params.get("format") == "hex"
    description = await console.call(console.client.describe_topic, name)
    if partition >= description.topic.partitions:
        raise ConsoleError(f"topic {name} has partitions 0 to {description.topic.partitions - 1}", 404)
    state = description.partitions[partition]
    if not state.log_start_offset <= offset <= state.log_end_offset:
        raise ConsoleError(
            f"offset {offset} is outside partition {partition}'s log "
            f"[{state.log_start_offset}, {state.log_end_offset}]"
        )
    result = await console.call(
        lambda: console.client.fetch(name, partition, offset, max_records=CONSOLE_RECORDS_MAX)
    )
    rows = [
        {
            "record": record,
            "key": show_bytes(record.key, as_hex),
            "value": show_bytes(record.value, as_hex),
            "headers": [(header, show_bytes(value, as_hex)) for header, value in record.headers],
            "time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.timestamp_ms / 1000)),
        }
        for record in result.records
    ]
    next_offset = result.next_offset if result.records else None
    return console.render(
        "records.html",
        title=f"{name} / {partition}",
        name=name,
        partition=partition,
        offset=offset,
        as_hex=as_hex,
        rows=rows,
        state=state,
        next_offset=next_offset,
    )


async def groups(console: Console, request: Request) -> Response:
    found = await console.call(lambda: console.client.list_groups(console.client.leader_address()))
    return console.render("groups.html", groups=sorted(found, key=lambda g: g.name), title="Groups")


async def group_live(console: Console, name: str) -> dict[str, Any]:
    description = await console.call(
        lambda: console.client.describe_group(name, console.client.leader_address())
    )
    samples = console.sampler.samples(name)
    window_s = CONSOLE_LAG_SAMPLE_S * CONSOLE_LAG_SAMPLES_MAX
    chart = None if samples is None else lag_chart(samples, time.monotonic(), window_s)
    return {"description": description, "chart": chart, "window_s": window_s}


async def group(console: Console, request: Request) -> Response:
    name = request.path_params["name"]
    live = await group_live(console, name)
    return console.render("group.html", title=f"Group {name}", name=name, **live)


async def group_part(console: Console, request: Request) -> Response:
    name = request.path_params["name"]
    return console.render("group_live.html", name=name, **(await group_live(console, name)))


async def produce(console: Console, request: Request) -> Response:
    if not console.allow_writes:
        raise ConsoleError("this console is read-only: start it with --allow-writes to produce", 403)
    if request.method == "GET":
        return console.render("produce.html", title="Produce", topic=request.query_params.get("topic", ""))
    form = await url_encoded_form(request)
    topic_name = str(form.get("topic", "")).strip()
    key, value = str(form.get("key", "")), str(form.get("value", ""))
    if not topic_name:
        raise ConsoleError("topic is required")
    if max(len(key.encode()), len(value.encode())) > CONSOLE_PRODUCE_BYTES_MAX:
        raise ConsoleError(f"a key or value of the form is at most {CONSOLE_PRODUCE_BYTES_MAX} bytes")
    raw_partition = str(form.get("partition", "")).strip()
    if raw_partition and not raw_partition.isdigit():
        raise ConsoleError(f"partition must be a whole number, not {raw_partition[:40]!r}")
    partition = int(raw_partition) if raw_partition else None
    sent = await console.call(
        lambda: console.client.send(
            topic_name, value.encode(), key.encode() if key else None, partition=partition
        )
    )
    target = f"/topics/{topic_name}/records?partition={sent.partition}&offset={sent.offset}"
    return RedirectResponse(target, status_code=303)


async def url_encoded_form(request: Request) -> dict[str, str]:
    """The fields of a form POST (application/x-www-form-urlencoded, what the console's forms send),
    read within a bound: a body larger than two fields at their limit is refused unread."""
    bytes_max = 6 * CONSOLE_PRODUCE_BYTES_MAX + 4_096  # Percent-encoding triples a byte.
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > bytes_max:
            raise ConsoleError(f"a form of more than {bytes_max} bytes", 413)
    try:
        fields = urllib.parse.parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=False)
    except (UnicodeDecodeError, ValueError) as error:
        raise ConsoleError("the form is not url-encoded") from error
    return {name: values[-1] for name, values in fields.items()}


def build_app(console: Console) -> Starlette:
    """The ASGI app with every page; errors of any page render the error page."""

    def page(handler: Callable[[Console, Request], Awaitable[Response]]) -> Page:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(console, request)
            except ConsoleError as error:
                return console.render("error.html", error.status, message=str(error))

        return wrapped

    routes = [
        Route("/", page(cluster)),
        Route("/topics", page(topics)),
        Route("/topics/{name}", page(topic)),
        Route("/topics/{name}/records", page(records)),
        Route("/groups", page(groups)),
        Route("/groups/{name}", page(group)),
        Route("/groups/{name}/live", page(group_part)),
        Route("/produce", page(produce), methods=["GET", "POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]

    async def not_found(request: Request, error: Exception) -> Response:
        return console.render("error.html", 404, message=f"no page {request.url.path}")

    async def server_error(request: Request, error: Exception) -> Response:
        return console.render("error.html", 500, message="the console failed on this page; see its log")

    return Starlette(routes=routes, exception_handlers={404: not_found, 500: server_error})
