"""The plan report as a user reads it (issue 20, item 7): the strategy in words, lines within
120 columns, binary byte units, and a reason when every op stays whole."""

import re
from collections import Counter

import einsummable as es
from einsummable.hardware.cluster import Cluster
from einsummable.ir.graph import EinsumNode
from einsummable.plan import report
from einsummable.plan.baselines import batch_dims
from einsummable.plan.planners import make_plan


def mlp(batch: int, d: int, hidden: int):
    g = es.Graph()
    x, w1, w2 = g.input("x", (batch, d)), g.input("w1", (d, hidden)), g.input("w2", (hidden, d))
    g.output("y", es.nn.relu(x @ w1) @ w2)
    return g.ir


def test_every_line_fits_120_columns_and_a_long_join_is_shortened(capsys):
    """A Llama training step sums many gradients in one join: its label is cut to fit."""
    from einsummable import cli

    assert cli.main(["plan", "--model", "tiny", "--batch", "2", "--seq", "8", "--machines", "2",
                     "--cores", "4", "--full"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= report.WIDTH
    assert any("…" in line and "einsum[" in line for line in lines)


def named_mlp(batch: int, d: int, hidden: int, grad: bool = False):
    """y = relu(x w1) w2 in the user's letters n (rows), i (inputs), h (hidden); with ``grad``,
    also the weights' gradients, whose nodes autodiff makes without letters of their own."""
    g = es.Graph()
    x, w1, w2 = g.input("x", (batch, d)), g.input("w1", (d, hidden)), g.input("w2", (hidden, d))
    h = es.einsum("ni,ih->nh", x, w1)
    y = es.einsum("nh,hi->ni", es.einsum("nh->nh", h, join="relu(x0)"), w2)
    if grad:
        loss = es.einsum("ni->", y, join="x0 * x0", agg="add")
        for name, d_w in zip(("dw1", "dw2"), es.grad(loss, [w1, w2]), strict=True):
            g.output(name, d_w)
    g.output("y", y)
    return g.ir


def _listed(text: str) -> dict[str, Counter]:
    """The summary's kinds -> (count, Counter of index combinations as sorted tuples), read back."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r" {4}\s*([\d,]+) (whole|data parallel \(batch\)|split in \dD)(?:: (.*))?", line)
        if m:
            combos = Counter()
            for item in (m.group(3) or "").split(", "):
                if item and not item.startswith("…"):
                    n, dims = item.split(" ", 1)
                    combos[tuple(sorted(dims.split(" × ")))] = int(n.replace(",", ""))
            out[m.group(2)] = (int(m.group(1).replace(",", "")), combos)
    return out


def test_strategy_in_words_names_each_split_index_by_the_users_letter():
    """Oracle: every einsum here is the user's, so its own letters (index_names) name its dims;
    the report finds the names through the graph's index classes instead."""
    plan = make_plan(named_mlp(256, 4096, 16384), Cluster(machines=2, cores=8), "eindecomp", compare=False)
    g = plan.graph
    batch = batch_dims(g, plan.spaces)
    want: dict[str, Counter] = {}
    for v, node in enumerate(g.nodes):
        if isinstance(node, EinsumNode) and g.live()[v]:
            split = [d for d, c in enumerate(plan.parts[v].counts) if c > 1]
            names = tuple(sorted("batch" if d == batch[v] else g.index_names[v][d] for d in split))
            kind = ("whole" if not split else "data parallel (batch)" if split == [batch[v]]
                    else f"split in {len(split)}D")
            want.setdefault(kind, Counter())[names] += 1
    text = report.brief(plan)
    got = _listed(text)
    assert {k: n for k, (n, _) in got.items()} == {k: sum(c.values()) for k, c in want.items()}, text
    for kind, (_, combos) in got.items():
        if kind.startswith("split"):
            assert combos == want[kind], text
    assert any(k.startswith("split in") for k in got), text  # something is split, so names were shown
    assert f"{sum(sum(c.values()) for c in want.values()):,} einsums" in text
    assert max(map(len, text.splitlines())) <= report.WIDTH


def test_gradient_ops_are_named_through_the_indices_they_share_and_roles_give_words():
    plan = make_plan(named_mlp(256, 4096, 16384, grad=True), Cluster(machines=2, cores=8), compare=False)
    # autodiff's nodes take the letters of the indices they share with the user's einsums
    names = {dim for _, combos in _listed(report.brief(plan)).values() for c in combos for dim in c}
    assert names and names <= {"batch", "i", "h"}, names
    worded = report.brief(plan, {"h": "hidden", "i": "features"})
    names = {dim for _, combos in _listed(worded).values() for c in combos for dim in c}
    assert names and names <= {"batch", "hidden", "features"}, worded


def test_llama_summary_names_every_index_by_its_role(capsys):
    from einsummable import cli
    from einsummable.models.llama import INDEX_ROLES

    assert cli.main(["plan", "--model", "demo", "--batch", "8", "--seq", "256", "--machines", "2",
                     "--cores", "8", "--compare", "no"]) == 0
    out = capsys.readouterr().out
    listed = _listed(out)
    names = {dim for _, combos in listed.values() for c in combos for dim in c}
    assert "hidden" in names and names <= set(INDEX_ROLES.values()), out
    assert re.search(r"split in 2D: [\d,]+ batch × ", out), out


def test_a_long_listing_is_cut_to_fit_and_counts_what_it_leaves_out():
    combos = Counter({f"index{i} × other{i}": 100 - i for i in range(40)})
    line = report._listing("    1,234 split in 2D: ", combos)
    assert len(line) <= report.WIDTH and line.startswith("    1,234 split in 2D: 100 index0 × other0, 99 ")
    shown = line.count(" × ")
    assert line.endswith(f", … {40 - shown} more")
    short = report._listing("x: ", Counter({"a": 2, "b": 1}))
    assert short == "x: 2 a, 1 b"


def test_binary_units_in_the_table_and_the_memory_line():
    plan = make_plan(mlp(65536, 256, 256), Cluster(machines=2, cores=4), "eindecomp", compare=True)
    text = report.brief(plan)
    assert not re.search(r"\d (?:KB|MB|GB)\b", text)  # bytes in KiB, MiB, GiB
    peak = next(line for line in text.splitlines() if " peak " in line and "= inputs" in line)
    parts = re.findall(r"([\d.]+) (B|KiB|MiB|GiB|TiB)\b", peak)
    assert len(parts) == 5, peak  # the peak and its four parts, each in a binary unit, none "0.0 GiB"
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    total, *rest = (float(n) * scale[u] for n, u in parts)
    assert abs(total - sum(rest)) <= 0.01 * total
    assert report.seconds(3712.4) == "3,712" and report.seconds(0.1234) == "0.123"


def test_human_units_are_binary_for_bytes_and_decimal_for_flops():
    assert report.human(3 * 2**20) == "3 MiB" and report.human(1536) == "1.5 KiB"
    assert report.human(2.5e12, "F") == "2.5 TF" and report.human(7e9, "F") == "7 GF"


def test_all_whole_plan_says_why():
    g = es.Graph()
    x = g.input("x", (4, 4))
    g.output("y", (x * 2.0).exp())
    plan = make_plan(g.ir, Cluster(machines=1, cores=64), "eindecomp", compare=False)
    text = report.brief(plan)
    assert "whole" in text and "too little work per block for 64 cores" in text
    big = make_plan(mlp(65536, 256, 256), Cluster(machines=1, cores=4), "eindecomp", compare=False)
    assert "too little work" not in report.brief(big)
