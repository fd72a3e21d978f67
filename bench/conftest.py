"""Benchmarks run with `make bench`; they report figures, they assert only correctness."""

from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    """A run interrupted inside a benchmark (`make gpu-check` at its budget) keeps the figures of
    those that finished: pytest-benchmark, which saves before the other hooks run, would fail on
    the one with no rounds and save nothing."""
    benchmarks = getattr(session.config, "_benchmarksession", None)
    if benchmarks is not None:
        benchmarks.benchmarks[:] = [bench for bench in benchmarks.benchmarks
                                    if bench.stats and bench.stats.data]
    return (yield)
