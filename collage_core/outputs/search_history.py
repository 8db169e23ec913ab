"""The two-level search, generation by generation, as a picture (SVG, no dependencies).

One bar per generation: the fastest placement found so far, split by how many operators each
backend runs in it, with its latency beside it. Backends keep the colours ``collage show`` gives
them, so a bar reads like the placement's picture.
"""

from __future__ import annotations

import html
import math
import textwrap
from typing import Sequence

from collage_core.outputs.picture import HIGHLIGHT, PALETTE

LABEL_WIDTH = 110  # "generation 12"
BAR_WIDTH = 420
LATENCY_WIDTH = 110
ROW_HEIGHT = 22
BAR_HEIGHT = 14
TOP = 28
CAPTION_HEIGHT = 16
CAPTION_CHARACTERS = 100  # a line of the caption at this font fills about the picture's width
LEGEND_HEIGHT = 24
FONT = 'font-family="Helvetica, Arial, sans-serif" font-size="11"'


def history_svg(history: Sequence, colours: dict[str, str], caption: str = "") -> str:
    """SVG text of ``history`` (:class:`~collage_core.search.two_level.GenerationRecord` s); ``colours``
    maps backend names to fills (a backend missing from it gets the next of the palette). A
    ``caption`` goes under the title (optimize says there when the search's best was not returned)."""
    colours = dict(colours)
    for name in sorted({b for record in history for b in record.operators_by_backend}):
        colours.setdefault(name, PALETTE[len(colours) % len(PALETTE)])
    width = LABEL_WIDTH + BAR_WIDTH + LATENCY_WIDTH
    caption_lines = textwrap.wrap(caption, CAPTION_CHARACTERS)
    top = TOP + CAPTION_HEIGHT * len(caption_lines)
    height = top + ROW_HEIGHT * len(history) + LEGEND_HEIGHT
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<text x="0" y="16" {FONT} font-weight="bold">Two-level search: operators by backend in the fastest placement so far</text>',
    ]
    lines += [
        f'<text class="caption" x="0" y="{16 + CAPTION_HEIGHT * (number + 1)}" {FONT} fill="{HIGHLIGHT}">{html.escape(line)}</text>'
        for number, line in enumerate(caption_lines)
    ]
    for row, record in enumerate(history):
        y = top + row * ROW_HEIGHT
        total = sum(record.operators_by_backend.values()) or 1
        latency = f"{record.best_s * 1e3:.3f} ms" if math.isfinite(record.best_s) else "nothing measured"
        lines.append(f'<g class="generation" data-generation="{record.generation}">')
        lines.append(f'<text x="0" y="{y + BAR_HEIGHT - 3}" {FONT}>generation {record.generation}</text>')
        x = float(LABEL_WIDTH)
        for backend, count in record.operators_by_backend.items():
            span = BAR_WIDTH * count / total
            title = html.escape(f"{backend}: {count} operators")
            lines.append(
                f'<rect x="{x:.2f}" y="{y}" width="{span:.2f}" height="{BAR_HEIGHT}" fill="{colours[backend]}" '
                f'stroke="#707070" stroke-width="0.5" data-backend="{html.escape(backend)}" '
                f'data-operators="{count}"><title>{title}</title></rect>'
            )
            x += span
        lines.append(f'<text x="{LABEL_WIDTH + BAR_WIDTH + 8}" y="{y + BAR_HEIGHT - 3}" {FONT}>{latency}</text>')
        lines.append("</g>")
    legend_y = top + ROW_HEIGHT * len(history) + 8
    x = float(LABEL_WIDTH)
    used = sorted({b for record in history for b in record.operators_by_backend})
    for backend in used:
        lines.append(
            f'<rect x="{x:.2f}" y="{legend_y}" width="10" height="10" fill="{colours[backend]}" stroke="#707070" stroke-width="0.5"/>'
        )
        lines.append(f'<text x="{x + 14:.2f}" y="{legend_y + 9}" {FONT}>{html.escape(backend)}</text>')
        x += 24 + 7 * len(backend)
    lines.append("</svg>")
    return "\n".join(lines) + "\n"
