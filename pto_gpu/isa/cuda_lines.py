"""The text the CUDA generator writes (cuda_codegen.py) and what its instructions' rules share
(cuda_mma.py's among them): the block's shape the text assumes, lines with an indent and
barriers that do not repeat, an instruction's text written once the layout is known, and an
instruction's block of lines over its valid region."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..backends.cuda_abi import THREADS_PER_BLOCK

WARP = 32  # lanes a warp
WARPS = THREADS_PER_BLOCK // WARP  # warps a block, every launch's


class Lines:
    """A source being written: lines at the current indent (in levels of four spaces), and
    whether a barrier is owed: shared memory read whole since the last one, by instructions
    that wrote none of it, whose barrier after them waits for the next instruction that may
    write it (Generator._emit)."""

    def __init__(self):
        self.lines: list[str] = []
        self.indent = 0
        self.owed = False

    def add(self, line: str) -> None:
        self.lines.extend("    " * self.indent + part for part in line.split("\n"))

    def extend(self, lines) -> None:
        for line in lines:
            self.add(line)

    def barrier(self) -> None:
        """A __syncthreads(), unless the line before is one."""
        if not self.lines or self.lines[-1].strip() != "__syncthreads();":
            self.add("__syncthreads();")
        self.owed = False

    def settle(self) -> None:
        """The barrier owed, if one is."""
        if self.owed:
            self.barrier()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclasses.dataclass
class Code:
    """One tile instruction: `lines(generator)` writes it once the layout is known. In the block
    layout a __syncthreads() comes before and after it when it reads or writes a tile whole
    (`whole`, or `whole(generator)` where that depends on the layout) or accesses a memref that
    needs it (Generator.hazards), except where `touches(generator)`, the tiles it reads and
    those it writes (C names), says that no other thread's access could meet its own there
    (Generator._emit). None: it may touch any. The generator is cuda_codegen's Generator, whose
    rules read more of it than any one Protocol would say."""

    lines: Callable[[Any], list[str]]
    whole: bool | Callable[[Any], bool] = False
    memref: str | None = None
    touches: Callable[[Any], tuple[tuple[str, ...], tuple[str, ...]]] | None = None


def indent(lines: list[str], levels: int = 1) -> list[str]:
    """`lines` indented by `levels` more."""
    return ["    " * levels + line for line in lines]


def for_wgmma(lines: list[str], otherwise: list[str] | None = None) -> list[str]:
    """`lines` where the build takes wgmma (PTO_WGMMA, pto_isa.cuh), else `otherwise`."""
    return ["#if PTO_WGMMA", *lines, *(["#else", *otherwise] if otherwise else []), "#endif"]


def op_block(where: str, rows: str, cols: str, body: list[str], dst: str | None) -> list[str]:
    """An instruction's lines: the valid region it works on (rows x cols) computed first (dst
    may be a source), the work, then the region recorded as dst's."""
    record = [] if dst is None else [f"    vr_{dst} = vr;", f"    vc_{dst} = vc;"]
    return [f"{{  // {where}", f"    const long long vr = {rows}, vc = {cols};", *indent(body), *record, "}"]
