"""A run's timeline as Chrome-trace JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

One lane (thread track) per worker thread, one complete event per task on the lane that ran
it, a flow arrow per dependency from producer to consumer, and counter tracks for the ready
tasks and the task and heap rings' occupancy. Timestamps are microseconds since the run began.
"""

from __future__ import annotations

import json
from pathlib import Path

from .graph import Graph
from .params import ParamKind
from .profile import Profile

PID = 1


def chrome_trace(profile: Profile, graph: Graph) -> dict:
    events = [_event("M", name="process_name", args={"name": "pto-gpu run"})]
    where: dict[int, dict] = {}  # task id -> its event
    for tid, lane in enumerate(profile.lanes, start=1):
        events.append(_event("M", tid=tid, name="thread_name", args={"name": lane.name}))
        events.append(_event("M", tid=tid, name="thread_sort_index", args={"sort_index": tid}))
        for span in lane.spans:
            task = span.task
            start, duration = _us(span.start), _us(span.end - span.start)
            events.append(_event("X", tid=tid, name=task.kernel.name, cat=task.worker.name, ts=start,
                                 dur=duration, args={"task": task.public_id, "worker": task.worker.name,
                                                     "params": [_describe(p) for p in task.params]}))
            if task.public_id >= 0:  # a distributed run's transfers have no id of the graph's
                where[task.public_id] = events[-1]
    # A flow end binds to the slice that starts at its timestamp on its thread and, for Chrome,
    # has its category; the slices come first so that Perfetto has opened them at that moment.
    for flow, (producer, consumer) in enumerate(graph.edges):
        if producer in where and consumer in where:
            for phase, slice_ in (("s", where[producer]), ("f", where[consumer])):
                events.append(_event(phase, tid=slice_["tid"], ts=slice_["ts"], cat=slice_["cat"], id=flow,
                                     name="dependency", bp="e"))
    for sample in profile.samples:
        at = _us(sample.at)
        events.append(_event("C", ts=at, name="ready tasks", args={"ready": sample.ready}))
        events.append(_event("C", ts=at, name="task ring", args={"live tasks": sample.live_tasks}))
        events.append(_event("C", ts=at, name="heap ring", args={"bytes": sample.heap_bytes}))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, profile: Profile, graph: Graph) -> None:
    Path(path).write_text(json.dumps(chrome_trace(profile, graph)))


def rank_path(path: str | Path, rank: int) -> Path:
    """Where rank `rank` of a distributed run writes the trace asked for at `path`."""
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def merge(paths: list[Path]) -> dict:
    """One timeline of several ranks' traces (rank i's from paths[i]), a process per rank.
    Each rank's clock starts when its run began, which the ranks do together."""
    events = []
    for rank, path in enumerate(paths):
        for event in json.loads(Path(path).read_text())["traceEvents"]:
            if event.get("name") == "process_name":
                event["args"] = {"name": f"rank {rank}"}
            if "id" in event:  # flow ids are per file
                event["id"] = f"{rank}-{event['id']}"
            events.append({**event, "pid": PID + rank})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _event(phase: str, **fields) -> dict:
    return {"ph": phase, "pid": PID, **fields}


def _describe(param) -> str:
    if param.kind == ParamKind.SCALAR:
        return repr(param.value)
    return f"{param.kind.name.lower()} {param.value!r}"
