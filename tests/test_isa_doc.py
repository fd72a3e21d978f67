"""docs/ISA.md's instruction table is generated from the opcode table, so the doc cannot drift
from the compiler: `python tests/test_isa_doc.py` prints the table, and a test fails when the
doc's copy differs."""

from __future__ import annotations

import pathlib

from pto_gpu.isa import OPCODES
from pto_gpu.isa.verify import signature

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


if __name__ == "__main__":
    print(render(), end="")
