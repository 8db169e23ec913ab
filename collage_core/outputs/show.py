"""Writing a placement's picture to a file, the format chosen by its suffix; Graphviz's ``dot`` draws it."""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from pathlib import Path

from collage_core.errors import CollageError
from collage_core.outputs.explain import explain
from collage_core.outputs.output_folder import refuse_special_file, replacing
from collage_core.outputs.picture import backend_colours, placement_dot
from collage_core.outputs.placement_file import Placement

SUFFIXES = (".svg", ".png", ".html", ".dot")
# dot lays out BERT-base (403 operators) in under two seconds; far longer means something is wrong.
DOT_TIMEOUT_S = 120


def find_dot() -> str:
    """The path of Graphviz's ``dot``, or an error that says how to install it."""
    found = shutil.which("dot")
    if found is None:
        raise CollageError("Graphviz's dot is not installed: apt-get install graphviz (or write a .dot file and render it elsewhere)")
    return found


def render(dot_text: str, output_format: str) -> bytes:
    """``dot_text`` drawn by ``dot`` as ``svg`` or ``png``."""
    try:
        done = subprocess.run([find_dot(), f"-T{output_format}"], input=dot_text.encode(), capture_output=True, timeout=DOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CollageError(f"Graphviz's dot did not finish within {DOT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        problem = done.stderr.decode(errors="replace").strip().splitlines()
        raise CollageError(f"Graphviz's dot failed: {problem[0] if problem else f'exit status {done.returncode}'}")
    return done.stdout


def write_picture(placement: Placement, path: os.PathLike, origin: str = "placement") -> Path:
    """Write ``placement`` to ``path`` as DOT text, SVG, PNG or an HTML page with the SVG and the explanation."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        told = repr(suffix) if suffix else "a name without a suffix"
        raise CollageError(f"{path}: cannot tell the picture format from {told} (use {', '.join(SUFFIXES)})")
    refuse_special_file(path)
    dot_text = placement_dot(placement, origin)
    if suffix == ".dot":
        content = dot_text.encode()
    elif suffix == ".html":
        content = html_page(placement, render(dot_text, "svg").decode()).encode()
    else:
        content = render(dot_text, suffix[1:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as temporary:  # whole: a page open in a browser never reads half a picture
            temporary.write_bytes(content)
    except OSError as error:
        raise CollageError(f"{path}: cannot write it ({error.strerror}: {error.filename})") from None
    return path


def html_page(placement: Placement, svg: str) -> str:
    """One self-contained page: a legend, the picture, and the explanation."""
    legend = "".join(
        f'<li><span class="swatch" style="background:{fill}"></span>{html.escape(backend)}</li>'
        for backend, fill in backend_colours(placement).items()
    )
    # dot's SVG starts with an XML declaration and a DOCTYPE, which do not belong inside HTML.
    inline_svg = svg[svg.index("<svg") :]
    title = html.escape(f"Placement of {placement.model_name}")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 1.5em; }}
.legend li {{ display: inline-block; margin-right: 1.5em; list-style: none; }}
.swatch {{ display: inline-block; width: 1em; height: 1em; margin-right: 0.4em; border: 1px solid #707070; vertical-align: middle; }}
.top {{ border: 3px solid #d62728; }}
.picture {{ overflow: auto; border: 1px solid #ddd; max-height: 85vh; }}
pre {{ font-size: 12px; }}
</style>
</head>
<body>
<h1>{title}</h1>
<ul class="legend">{legend}<li><span class="swatch top"></span>the costliest partitions (red outline)</li></ul>
<div class="picture">
{inline_svg}
</div>
<h2>Why each partition</h2>
<pre>{html.escape(explain(placement))}</pre>
</body>
</html>
"""
