"""The console's pure rendering: bytes as text or hex within a bound, and the lag chart's SVG."""

from __future__ import annotations

from kq.console.render import lag_chart, show_bytes


def test_bytes_show_as_text_or_hex_and_are_cut_at_the_bound() -> None:
    """None is null; undecodable bytes do not fail; a long value says how much was cut."""
    assert show_bytes(None, False).is_null
    assert show_bytes(b"caf\xc3\xa9", False).text == "café"
    assert show_bytes(b"\xff\x00", False).text == "\ufffd\x00"
    assert show_bytes(b"\x00\xffA", True).text == "00 ff 41"
    shown = show_bytes(b"x" * 10, False, bytes_max=4)
    assert (shown.text, shown.cut) == ("xxxx", 6)


def test_lag_chart_draws_the_window_only_scaled_to_its_largest_lag() -> None:
    """Points outside the window are left out; the top of the scale is the largest lag shown."""
    svg = lag_chart([(0.0, 500), (50.0, 10), (90.0, 40), (100.0, 20)], now_s=100.0, window_s=60.0)
    points = svg.split('points="')[1].split('"')[0].split()
    assert len(points) == 3
    assert ">40</text>" in svg and ">500<" not in svg
    assert points[-1].startswith("570.0,")  # "now" sits at the right margin.
    empty = lag_chart([], now_s=5.0, window_s=60.0)
    assert 'points=""' in empty
