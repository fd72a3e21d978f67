"""The recorded graph's text dump and DOT drawing (spec 003 §5) agree with the graph."""

import re
import shutil

import numpy as np
import pytest
from pto_gpu.orchestration.softmax import fused_softmax

import pto_gpu as pto


@pytest.fixture(scope="module")
def graph():
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    out = np.zeros_like(x)
    return pto.Runtime(backend="cpu", executor="serial").run(fused_softmax, x, out, tile_rows=16,
                                                              record=True).graph


def test_dump_sections_and_lines_match_the_graph(graph, tmp_path):
    graph.dump(tmp_path / "dump.txt")
    text = (tmp_path / "dump.txt").read_text()
    summary, table, deps = (text.index(s) for s in ("SUMMARY", "TASK TABLE", "DEPENDENCY GRAPH"))
    assert summary < table < deps
    assert f"Total tasks scheduled:  {len(graph.tasks)}" in text
    rows = re.findall(r"Task (\d+): (\w+)\s+\[COMPLETED\] fanin=(\d+) buf=[\d.]+KB fanout=\[([\d,]*)\]", text)
    assert [(int(i), name) for i, name, _, _ in rows] == [(t.id, t.kernel.name) for t in graph.tasks]
    fanout = {int(i): sorted(int(c) for c in out.split(",") if c) for i, _, _, out in rows}
    assert sorted((p, c) for p, cs in fanout.items() for c in cs) == sorted(graph.edges)
    assert sum(int(fanin) for _, _, fanin, _ in rows) == len(graph.edges)
    listed = [tuple(map(int, m)) for m in re.findall(r"Task (\d+) -> Task (\d+)", text[deps:])]
    assert listed == graph.edges


def test_dump_without_a_path_writes_stdout(graph, capsys):
    graph.dump()
    assert capsys.readouterr().out.count(" -> ") == len(graph.edges)


def test_dot_has_exactly_the_edges_and_one_rank_per_level(graph):
    dot = graph.to_dot()
    assert "rankdir=LR" in dot
    assert sorted(tuple(map(int, m)) for m in re.findall(r"t(\d+) -> t(\d+);", dot)) == sorted(graph.edges)
    ranks = [re.findall(r"t(\d+);", group) for group in re.findall(r"\{ rank=same; ([^}]*)\}", dot)]
    levels = graph.levels()
    for group in ranks:
        assert len({levels[int(t)] for t in group}) == 1
    assert sorted(int(t) for group in ranks for t in group) == [t.id for t in graph.tasks]
    assert all(levels[c] > levels[p] for p, c in graph.edges)


def test_render_refuses_other_formats_and_names_graphviz_when_missing(graph, tmp_path, monkeypatch):
    with pytest.raises(pto.PTOError, match="must end in .svg or .pdf"):
        graph.render(tmp_path / "g.png")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pto.PTOError, match="install it"):
        graph.render(tmp_path / "g.svg")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_render_writes_svg(graph, tmp_path):
    graph.render(tmp_path / "g.svg")
    assert (tmp_path / "g.svg").read_text().count("<g id=\"node") == len(graph.tasks)
