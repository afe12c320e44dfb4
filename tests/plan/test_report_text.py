"""The plan report as a user reads it (issue 20, item 7): the strategy in words, lines within
120 columns, binary byte units, and a reason when every op stays whole."""

import re

import einsummable as es
from einsummable.hardware.cluster import Cluster
from einsummable.plan import report
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


def test_strategy_in_words_and_binary_units():
    plan = make_plan(mlp(65536, 256, 256), Cluster(machines=2, cores=4), "eindecomp", compare=True)
    text = report.brief(plan)
    m = re.search(r"(\d[\d,]*) einsums: (.*)", text)
    assert m, text
    counts = [int(n.replace(",", "")) for n in re.findall(r"(\d[\d,]*) (?:data|split|whole)", m.group(2))]
    assert sum(counts) == int(m.group(1).replace(",", "")) and "data parallel (batch)" in m.group(2)
    assert not re.search(r"\d (?:KB|MB|GB)\b", text)  # bytes in KiB, MiB, GiB
    assert max(map(len, text.splitlines())) <= report.WIDTH


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
