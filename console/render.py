"""Pure rendering helpers of the console: bytes shown as text or hex, within a bound, and the lag
chart as inline SVG. No I/O, unit-tested without a browser."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kq.proto.limits import CONSOLE_VALUE_BYTES_MAX

CHART_WIDTH = 600
CHART_HEIGHT = 160
CHART_MARGIN = 30


@dataclass(frozen=True, slots=True)
class Shown:
    """Bytes as a page shows them."""

    text: str  # "null" for None.
    cut: int  # Bytes left out (over CONSOLE_VALUE_BYTES_MAX).
    is_null: bool = False


def show_bytes(data: bytes | None, as_hex: bool, bytes_max: int = CONSOLE_VALUE_BYTES_MAX) -> Shown:
    """`data` as UTF-8 text (undecodable bytes as U+FFFD) or as hex pairs, its first `bytes_max` bytes."""
    if data is None:
        return Shown("null", 0, is_null=True)
    head = data[:bytes_max]
    text = head.hex(" ") if as_hex else head.decode("utf-8", errors="replace")
    return Shown(text, len(data) - len(head))


def lag_chart(samples: Sequence[tuple[float, int]], now_s: float, window_s: float) -> str:
    """An SVG polyline of (time, total lag) over the last `window_s` seconds, with its scale; every
    value is a number formatted here, so the markup holds no user data."""
    points = [(t, lag) for t, lag in samples if now_s - window_s <= t <= now_s]
    top = max((lag for _, lag in points), default=0) or 1
    inner_w, inner_h = CHART_WIDTH - 2 * CHART_MARGIN, CHART_HEIGHT - 2 * CHART_MARGIN

    def xy(t: float, lag: int) -> str:
        x = CHART_MARGIN + inner_w * (t - (now_s - window_s)) / window_s
        y = CHART_MARGIN + inner_h * (1 - lag / top)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(t, lag) for t, lag in points)
    bottom, right = CHART_HEIGHT - CHART_MARGIN, CHART_WIDTH - CHART_MARGIN
    return (
        f'<svg class="lag-chart" role="img" width="{CHART_WIDTH}" height="{CHART_HEIGHT}" '
        f'viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>total lag over the last {window_s:.0f} s</title>"
        f'<line x1="{CHART_MARGIN}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#888"/>'
        f'<line x1="{CHART_MARGIN}" y1="{CHART_MARGIN}" x2="{CHART_MARGIN}" y2="{bottom}" stroke="#888"/>'
        f'<text x="2" y="{CHART_MARGIN + 4}" font-size="10">{top}</text>'
        f'<text x="2" y="{bottom}" font-size="10">0</text>'
        f'<text x="{CHART_MARGIN}" y="{CHART_HEIGHT - 8}" font-size="10">-{window_s:.0f} s</text>'
        f'<text x="{CHART_WIDTH - CHART_MARGIN - 20}" y="{CHART_HEIGHT - 8}" font-size="10">now</text>'
        f'<polyline fill="none" stroke="#2a6df4" stroke-width="2" points="{line}"/>'
        f"</svg>"
    )
