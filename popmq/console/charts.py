"""Line charts as inline SVG, drawn on the server (no JavaScript, no chart library)."""

from __future__ import annotations

from markupsafe import Markup, escape

WIDTH, HEIGHT, PAD = 420, 120, 28


def line_chart(points: list[list[float]], title: str, unit: str = "/s") -> Markup:
    """`points` are [unix seconds, value] pairs, oldest first."""
    label = escape(title)
    if len(points) < 2:
        return Markup(
            f'<svg class="chart" role="img" aria-label="{label}" width="{WIDTH}" '
            f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"><title>{label}</title>'
            f'<text x="{PAD}" y="{HEIGHT // 2}">{label}: collecting samples…</text></svg>'
        )
    t0, t1 = points[0][0], points[-1][0]
    top = max(max(v for _, v in points), 1.0)
    span = max(t1 - t0, 1.0)

    def x(t: float) -> float:
        return PAD + (t - t0) / span * (WIDTH - 2 * PAD)

    def y(v: float) -> float:
        return HEIGHT - PAD + 8 - v / top * (HEIGHT - PAD - 8)

    path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
    last = points[-1][1]
    return Markup(
        f'<svg class="chart" role="img" aria-label="{label}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}"><title>{label}</title>'
        f'<line class="axis" x1="{PAD}" y1="{y(0):.1f}" x2="{WIDTH - PAD}" y2="{y(0):.1f}"/>'
        f'<text class="tick" x="2" y="{y(top) + 4:.1f}">{top:g}</text>'
        f'<text class="tick" x="2" y="{y(0):.1f}">0</text>'
        f'<polyline class="series" points="{path}"/>'
        f'<text class="legend" x="{PAD}" y="14">{label}: {last:.1f}{escape(unit)} now, '
        f"{span:.0f}s shown</text></svg>"
    )
