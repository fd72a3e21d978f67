"""docs/ISA.md holds true: its instruction table is generated from the opcode table (`python
tests/test_isa_doc.py` prints it, and a test fails when the doc's copy differs), and its guide
to writing a kernel runs as written."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from pto_gpu.isa import OPCODES
from pto_gpu.isa.operands import signature

DOC = pathlib.Path(__file__).parent.parent / "docs" / "ISA.md"
BEGIN, END = "<!-- instruction table: generated -->", "<!-- end of instruction table -->"


def render() -> str:
    rows = ["| instruction | builder | form | operands (destination first) | CPU element | CUDA element |",
            "|---|---|---|---|---|---|"]
    for spec in OPCODES.values():
        operands = ", ".join(o.name if o.default is None else f"{o.name}={o.default}"
                             for o in signature(spec))
        cpu = f"`{spec.cpu}`" if spec.cpu else "(generator)"
        cuda = f"`{spec.cuda}`" if spec.cuda else "(generator)"
        rows.append(f"| `{spec.spelling}` | `{spec.builder}` | {spec.form.value} | {operands} | {cpu} "
                    f"| {cuda} |")
    return "\n".join(rows) + "\n"


def test_the_docs_instruction_table_is_the_opcode_table():
    text = DOC.read_text()
    table = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n") + "\n"
    assert table == render(), "regenerate with: python tests/test_isa_doc.py and paste between the markers"


def test_the_guide_runs_as_written(tmp_path):
    """The guide's python blocks, in order, as one script in a fresh interpreter: each step's
    asserts (results against numpy, the compiled run bitwise the Python one) hold."""
    text = DOC.read_text()
    guide = text[text.index("<!-- guide"):text.index("<!-- end of guide -->")]
    blocks = re.findall(r"```python\n(.*?)```", guide, re.S)
    assert len(blocks) >= 6
    (tmp_path / "guide.py").write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, "guide.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    refused, ran = done.stdout.splitlines()
    assert refused == "layernorm: tensor param 0 (x) must be FLOAT32, got FLOAT64"
    assert ran.startswith("32 tasks, ")


if __name__ == "__main__":
    print(render(), end="")
