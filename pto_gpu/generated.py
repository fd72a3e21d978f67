"""Generated Python sources: where they live and how they are imported.

Every generated module (the ISA's CPU kernels and native entries, compiled orchestrations,
the native entries of hand-written numba kernels) is written to the cache directory under a
hash of its text and imported from there, so numba's cache of its functions holds across
processes.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path

_LOADED: dict[Path, object] = {}  # cache path -> the imported generated module
_LOADING = threading.Lock()


def cache_dir() -> Path:
    """Where generated sources (and numba's caches of them) live."""
    configured = os.environ.get("PTO_GPU_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "pto_gpu" / "isa"


def load_source(path: Path, source: str, digest: str, given: dict[str, object] | None = None):
    """The module of generated `source`, written to `path` once (atomically) and imported
    under a name from its `digest`, so numba's cache finds its functions across processes;
    imported once per process (importing again makes new dispatchers, which load their
    machine code from numba's cache again: 40 ms a run for a compiled orchestration).
    `given`: globals the module finds defined (what it would otherwise import)."""
    with _LOADING:  # one import per module: a second thread waits, then takes the first's
        if path not in _LOADED:
            _LOADED[path] = _load(path, source, digest, given or {})
        return _LOADED[path]


def _load(path: Path, source: str, digest: str, given: dict[str, object]):
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        partial.write_text(source)
        os.replace(partial, path)  # atomic: concurrent processes never see half a file
    module_name = f"pto_gpu_isa_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    generated = importlib.util.module_from_spec(spec)
    vars(generated).update(given)
    sys.modules[module_name] = generated  # numba's cache resolves the function's module by name
    spec.loader.exec_module(generated)
    return generated
