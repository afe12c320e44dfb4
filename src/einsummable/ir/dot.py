"""DOT export of an EinGraph, rendered by Graphviz's ``dot`` when it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from einsummable.ir import scalar
from einsummable.ir.graph import EinGraph, EinsumNode, InputNode

_COLOURS = {"InputNode": "lightblue", "EinsumNode": "lightyellow", "Formation": "orange"}


def to_dot(graph: EinGraph) -> str:
    lines = ["digraph eingraph {", "  rankdir=TB;", "  node [shape=box, style=filled, fontname=monospace];"]
    for nid, node in enumerate(graph.nodes):
        label = node.name if isinstance(node, InputNode) else node.describe()
        if isinstance(node, EinsumNode):
            agg = f" agg={node.op.agg}" if node.op.agg else ""
            label = f"{node.op.spec}\\n{scalar.to_string(node.op.join)}{agg}"
        label = f"%{nid} {label}\\n{node.dtype}{list(node.shape)}".replace('"', '\\"')
        colour = _COLOURS.get(type(node).__name__, "white")
        lines.append(f'  n{nid} [label="{label}", fillcolor={colour}];')
        lines.extend(f"  n{i} -> n{nid};" for i in node.inputs)
    for name, nid in graph.outputs.items():
        lines.append(f'  out_{name} [label="{name}", shape=ellipse, fillcolor=palegreen];')
        lines.append(f"  n{nid} -> out_{name};")
    lines.append("}")
    return "\n".join(lines)


def render(dot_text: str, path: str | Path) -> Path:
    """Write ``path`` (.svg or .png) with Graphviz, or the DOT text beside it without Graphviz.

    Returns the path actually written.
    """
    path = Path(path)
    exe = shutil.which("dot")
    if exe is None or path.suffix not in (".svg", ".png"):
        out = path.with_suffix(".dot")
        out.write_text(dot_text)
        return out
    subprocess.run([exe, f"-T{path.suffix[1:]}", "-o", str(path)], input=dot_text.encode(), check=True)
    return path
