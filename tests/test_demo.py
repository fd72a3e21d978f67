"""`make run`'s demo, small: its four orchestrations (the plain and the panel matmul, flash
attention in task pairs and fused) agree with numpy (it exits 1 when not), and each line says
what its ratio is."""

import sys

from pto_gpu.orchestration import demo


def test_the_demo_reports_results_that_match_numpy(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["demo", "--size", "256", "--tile", "64", "--seq", "200"])
    demo.main()
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line for line in lines if "max relative error" in line]
    assert len(verdicts) == 4 and all(line.endswith(": OK") for line in verdicts), lines
    assert sum("ratio" in line and "(pto-gpu / numpy)" in line for line in lines) == 4
