"""DOT export of an EinGraph, rendered by Graphviz's ``dot`` when it is installed."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path

from einsummable.errors import GraphError
from einsummable.ir import scalar
from einsummable.ir.graph import EinGraph, EinsumNode, InputNode

RENDERED = (".svg", ".png", ".pdf")
_warned = False  # the missing-Graphviz warning is given once per process
_COLOURS = {"InputNode": "lightblue", "EinsumNode": "lightyellow", "Formation": "orange"}


def to_dot(graph: EinGraph) -> str:
    lines = ["digraph eingraph {", "  rankdir=TB;", "  node [shape=box, style=filled, fontname=monospace];"]
    for nid, node in enumerate(graph.nodes):
        parts = [f"%{nid} {node.name if isinstance(node, InputNode) else node.describe()}"]
        if isinstance(node, EinsumNode):
            agg = f" agg={node.op.agg}" if node.op.agg else ""
            parts = [f"%{nid} {node.op.spec}", f"{scalar.to_string(node.op.join)}{agg}"]
        label = "\\n".join(escape(p) for p in [*parts, f"{node.dtype}{list(node.shape)}"])
        colour = _COLOURS.get(type(node).__name__, "white")
        lines.append(f'  n{nid} [label="{label}", fillcolor={colour}];')
        lines.extend(f"  n{i} -> n{nid};" for i in node.inputs)
    for k, (name, nid) in enumerate(graph.outputs.items()):
        # Output names are the user's text: the node id is ours, the name only a quoted label.
        lines.append(f'  out{k} [label="{escape(name)}", shape=ellipse, fillcolor=palegreen];')
        lines.append(f"  n{nid} -> out{k};")
    lines.append("}")
    return "\n".join(lines)


def escape(text: str) -> str:
    """Text for the inside of a DOT double-quoted label, shown as written: backslashes and
    quotes escaped, line breaks as DOT's ``\\n``. Angle brackets and braces need nothing
    inside quotes (only ``<...>`` HTML labels and record shapes give them meaning)."""
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")


def render(dot_text: str, path: str | Path) -> Path:
    """Write ``path`` (.svg, .png or .pdf) with Graphviz; without Graphviz, warn (once) and
    write the DOT text to ``path`` + ".dot" (``graph.svg.dot``, so that an svg and a png never
    share a file). A ``.dot`` path gets the DOT text. Returns the path actually written.
    """
    global _warned
    path = Path(path)
    if path.suffix == ".dot":
        path.write_text(dot_text)
        return path
    if path.suffix not in RENDERED:
        raise GraphError(f"cannot render {path}: expected a file ending in {', '.join(RENDERED)} or .dot")
    exe = shutil.which("dot")
    if exe is None:
        out = path.with_name(path.name + ".dot")
        out.write_text(dot_text)
        if not _warned:
            _warned = True
            warnings.warn(f"Graphviz's `dot` is not installed, so {path.name} was not drawn: wrote the "
                          f"DOT text to {out} instead (install graphviz to get {path.suffix} files)",
                          stacklevel=3)
        return out
    subprocess.run([exe, f"-T{path.suffix[1:]}", "-o", str(path)], input=dot_text.encode(), check=True)
    return path
