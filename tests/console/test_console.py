"""`kq console` in a real browser (Playwright driving Debian's chromium) against a real 3-node cluster:
every page loads and links work, records show as text and hex with user data escaped, the lag shown
equals `kq groups describe`, bad input gets a message, produce works only with --allow-writes.

Screenshots of every page go to tests/artifacts/console/ (or $KQ_TEST_ARTIFACTS/console/).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster
from tests.console.process import BIN, start_console, stop

CHROMIUM = Path("/usr/bin/chromium")
playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
)

TOPIC = "web"
GROUP = "web-readers"
HOSTILE = "<script>alert(1)</script>"
ARTIFACTS = Path(os.environ.get("KQ_TEST_ARTIFACTS", Path(__file__).parents[1] / "artifacts")) / "console"
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("console") / "cluster") as local:
        with KqClient(local.bootstrap) as client:
            client.create_topic(TOPIC, partitions=2)
            for i in range(30):
                client.send(
                    TOPIC,
                    f"value {i}".encode(),
                    f"key-{i}".encode(),
                    partition=i % 2,
                    headers=[("n", b"%d" % i)],
                )
            client.send(TOPIC, HOSTILE.encode(), b"\x00\xffbinary", partition=0)
            client.commit_offsets(GROUP, {(TOPIC, 0): 4, (TOPIC, 1): 9})
        yield local


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def cli_total_lag(cluster: LocalCluster) -> int:
    result = subprocess.run(
        [
            str(BIN / "kq"),
            "--bootstrap",
            ",".join(cluster.bootstrap),
            "groups",
            "describe",
            GROUP,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(json.loads(result.stdout)["total_lag"])


def test_every_page_loads_and_shows_the_clusters_state(cluster: LocalCluster, browser: Any) -> None:
    """Cluster, topics, topic, records (text and hex), groups and group pages, reached by their links.
    The console knows one node: the cluster page lists the members it names too."""
    process, url = start_console(cluster, bootstrap=cluster.bootstrap[:1])
    errors: list[str] = []
    try:
        page = browser.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url + "/")
        assert page.locator("#nodes tr").count() == 4  # A header and three nodes.
        assert page.locator("#nodes td.ok").count() == 3
        assert page.locator("nav a", has_text="Produce").count() == 0  # Read-only.
        shot(page, "cluster")
        page.click("nav >> text=Topics")
        shot(page, "topics")
        page.click(f"#topics >> text={TOPIC}")
        assert page.locator("#partitions tr").count() == 3
        assert "retention.ms" in page.locator("#configs").inner_text()
        shot(page, "topic")
        page.fill("#browse input[name=offset]", "0")
        page.click("#browse button")
        records = page.locator("#records")
        assert "key-0" in records.inner_text() and "value 0" in records.inner_text()
        assert "n: 0" in records.inner_text()
        hostile_row = page.locator("#records tr", has_text="alert(1)")
        assert HOSTILE in hostile_row.inner_text()  # Shown as text, never run as markup.
        assert page.locator("#records script").count() == 0
        shot(page, "records")
        page.click("text=show as hex")
        assert "6b 65 79 2d 30" in page.locator("#records").inner_text()  # "key-0"
        assert "00 ff 62" in page.locator("#records").inner_text()
        shot(page, "records-hex")
        page.click("nav >> text=Groups")
        shot(page, "groups")
        page.click(f"#groups >> text={GROUP}")
        expected = cli_total_lag(cluster)
        assert int(page.locator("#total-lag").inner_text()) == expected
        lags = [int(cell) for cell in page.locator("#lag td.lag").all_inner_texts()]
        assert sum(lags) == expected and len(lags) == 2
        page.wait_for_selector("svg.lag-chart", timeout=20_000)  # htmx refreshes it once sampled.
        shot(page, "group")
        assert not errors, errors
    finally:
        stop(process)


def test_bad_input_gets_a_message_and_writes_need_allow_writes(cluster: LocalCluster, browser: Any) -> None:
    """Bad numbers, unknown names and a read-only POST: a message and a 4xx, never a stack trace;
    with --allow-writes the produce form writes a record that the records page then shows."""
    read_only, read_only_url = start_console(cluster)
    writable, writable_url = start_console(cluster, "--allow-writes")
    try:
        page = browser.new_page()
        cases = [
            (f"/topics/{TOPIC}/records?partition=x", 400, "partition must be a whole number"),
            (f"/topics/{TOPIC}/records?partition=7", 404, "partitions 0 to 1"),
            (f"/topics/{TOPIC}/records?offset=-3", 400, "offset must be a whole number"),
            (f"/topics/{TOPIC}/records?offset=99999", 400, "outside partition 0"),
            ("/topics/no-such-topic", 404, "no-such-topic"),
            ("/groups/no-such-group", 404, "no-such-group"),
            ("/nowhere", 404, "no page /nowhere"),
            ("/produce", 403, "read-only"),
        ]
        for path, status, message in cases:
            response = page.goto(read_only_url + path)
            assert response is not None and response.status == status, path
            assert message in page.locator("#error").inner_text(), path
            assert "Traceback" not in page.content()
        shot(page, "error")
        request = urllib.request.Request(read_only_url + "/produce", data=b"topic=web&value=x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
        page.goto(writable_url + f"/produce?topic={TOPIC}")
        page.fill("#produce input[name=partition]", "1")
        page.fill("#produce input[name=key]", "console-key")
        page.fill("#produce textarea[name=value]", "from the browser")
        shot(page, "produce")
        page.click("#produce button")
        assert "from the browser" in page.locator("#records").inner_text()
        page.goto(writable_url + "/produce")
        page.fill("#produce input[name=topic]", "no-such-topic")
        page.fill("#produce textarea[name=value]", "x")
        page.click("#produce button")
        assert "no-such-topic" in page.locator("#error").inner_text()
    finally:
        stop(read_only)
        stop(writable)
