"""Externals from any array library on the CPU backend (backends/interop.py): DLPack and
`__array_interface__` objects are taken in place, views of one allocation share one owner,
read-only memory stays read-only, arrays on the wrong device are refused with what to do;
and the dtypes at the edge: bool masks work, complex is refused by name. The CUDA side
(CuPy, PyTorch CUDA tensors) is in tests/test_cuda.py."""

import numpy as np
import pytest

import pto_gpu as pto
from pto_gpu.backends.cpu import CpuBackend
from pto_gpu.backends.interop import dlpack_read_only


class DLPackOnly:
    """An array library's array as numpy sees it through DLPack alone."""

    def __init__(self, array: np.ndarray, device: tuple[int, int] = (1, 0)):
        self._array, self._device = array, device

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


class InterfaceOnly:
    """An array exposing only __array_interface__."""

    def __init__(self, array: np.ndarray):
        self.__array_interface__ = array.__array_interface__
        self._array = array  # the memory the interface points at


WRAPPERS = [DLPackOnly, InterfaceOnly]


@pto.kernel(worker=pto.VECTOR)
def scale(a, out, factor):
    out[...] = a * factor


@pto.kernel(worker=pto.VECTOR)
def copy(a, out):
    out[...] = a


@pytest.mark.parametrize("wrap", WRAPPERS, ids=lambda w: w.__name__)
def test_a_foreign_array_is_taken_in_place(wrap):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.zeros((3, 4), np.float32)

    def orch(o, x, out):
        o.submit(scale, pto.input(o.external(x)), pto.output(o.external(out)), 2.0)

    pto.Runtime(backend="cpu", executor="serial").run(orch, wrap(x), wrap(out))
    np.testing.assert_array_equal(out, 2 * np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize("wrap", WRAPPERS, ids=lambda w: w.__name__)
def test_the_external_keeps_the_foreign_object(wrap):
    foreign = wrap(np.zeros(4))
    memory = CpuBackend(4096).resolve(foreign).memory
    assert any(kept is foreign for kept in memory.keep)


@pytest.mark.parametrize("wrap", WRAPPERS, ids=lambda w: w.__name__)
def test_views_of_one_foreign_allocation_share_an_owner_and_their_dependency_is_found(wrap, executor):
    base = np.zeros(16, np.float32)
    out = np.zeros(4, np.float32)

    def orch(o, whole, part, out):
        W, P = o.external(whole), o.external(part)
        assert W.buffer is P.buffer
        o.submit(copy, pto.input(o.external(np.full(4, 7, np.float32))), pto.output(W[6:10]))  # task 0
        o.submit(copy, pto.input(P), pto.output(o.external(out)))  # task 1 reads 4..8, which 0 wrote in part

    result = pto.Runtime(backend="cpu", executor=executor).run(
        orch, wrap(base), wrap(base[4:8]), out, record=True)
    assert (0, 1) in result.graph.edges
    np.testing.assert_array_equal(out, [0, 0, 7, 7])


@pytest.mark.parametrize("wrap", WRAPPERS, ids=lambda w: w.__name__)
def test_foreign_views_that_overlap_partly_are_refused(wrap):
    base = np.zeros(16, np.float32)
    with pytest.raises(pto.LayoutError, match="partly overlaps"):
        pto.Runtime(backend="cpu").run(lambda o: (o.external(wrap(base[:8])), o.external(wrap(base[4:]))))


@pytest.mark.parametrize("wrap", WRAPPERS, ids=lambda w: w.__name__)
def test_read_only_foreign_memory_cannot_be_written(wrap):
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    ext = CpuBackend(4096).resolve(wrap(frozen))
    assert not ext.writeable
    with pytest.raises(pto.ParamError, match="read-only memory"):
        pto.Runtime(backend="cpu").run(lambda o: o.submit(
            scale, pto.input(o.external(np.ones(4, np.float32))), pto.output(o.external(wrap(frozen))), 2.0))


def test_dlpack_read_only_flag_is_read_from_a_versioned_capsule():
    frozen = np.ones(4)
    frozen.flags.writeable = False
    assert dlpack_read_only(frozen.__dlpack__(max_version=(1, 0)))
    assert not dlpack_read_only(np.ones(4).__dlpack__(max_version=(1, 0)))
    assert not dlpack_read_only(np.ones(4).__dlpack__())  # unversioned: no flags to read


def test_a_gpu_dlpack_array_on_the_cpu_backend_is_refused_with_what_to_do():
    gpu = DLPackOnly(np.zeros(4), device=(2, 0))  # kDLCUDA
    with pytest.raises(pto.PTOError, match=r"GPU array \(DLPackOnly\) on the CPU backend; copy it to the"):
        pto.Runtime(backend="cpu").run(lambda o: o.external(gpu))


def test_an_object_that_is_no_array_is_refused_by_name():
    with pytest.raises(pto.PTOError, match=r"__array_interface__ or a host __dlpack__.*not dict"):
        pto.Runtime(backend="cpu").run(lambda o: o.external({}))


class TorchLike:
    """A view as PyTorch shows one, without PyTorch: its type's module is torch's, and it tells
    the storage it views (`untyped_storage`), here a numpy array's."""

    __module__ = "torch"

    class Storage:
        def __init__(self, base: np.ndarray):
            self._base = base

        def data_ptr(self) -> int:
            return self._base.ctypes.data

        def nbytes(self) -> int:
            return self._base.nbytes

    def __init__(self, base: np.ndarray, view: np.ndarray):
        self._base = base
        self.__array_interface__ = view.__array_interface__
        self._view = view

    def untyped_storage(self) -> "TorchLike.Storage":
        return TorchLike.Storage(self._base)


def test_a_torch_view_owns_its_whole_storage():
    base = np.zeros(16, np.float32)
    owners = []
    views = (TorchLike(base, base[2:8]), TorchLike(base, base[4:12]))
    pto.Runtime(backend="cpu").run(lambda o: owners.extend(o.external(v).buffer for v in views))
    assert owners[0] is owners[1]  # neither view holds the other: only the storage makes them one
    assert (owners[0].base, owners[0].nbytes) == (base.ctypes.data, base.nbytes)


def test_torch_views_share_their_storage_as_owner():
    torch = pytest.importorskip("torch")
    base = torch.zeros(16)
    out = np.zeros(4, np.float32)

    def orch(o, first, second, out):
        A, B = o.external(first), o.external(second)
        assert A.buffer is B.buffer  # neither view contains the other: one storage
        o.submit(copy, pto.input(o.external(np.full(4, 7, np.float32))), pto.output(A[2:6]))
        o.submit(copy, pto.input(B), pto.output(o.external(out)))

    result = pto.Runtime(backend="cpu").run(orch, base[:8], base[4:8 + 4], out, record=True)
    assert (0, 1) in result.graph.edges
    np.testing.assert_array_equal(out, [7, 7, 0, 0])


# --- dtypes at the edge ------------------------------------------------------------------
@pto.kernel(worker=pto.VECTOR, mixed_dtypes=True)
def masked(mask, a, out):
    out[...] = np.where(mask, a, 0)


@pto.kernel(worker=pto.VECTOR, mixed_dtypes=True)
def positive(a, mask):
    mask[...] = a > 0


def test_a_mask_kernel_over_bool_externals_and_heap_tensors_matches_numpy(executor):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 8)).astype(np.float32)
    given = rng.random((8, 8)) < 0.5
    out, derived = np.zeros_like(a), np.zeros_like(a)

    def orch(o, a, given, out, derived):
        A = o.external(a)
        assert o.external(given).dtype == pto.BOOL
        o.submit(masked, pto.input(o.external(given)), pto.input(A), pto.output(o.external(out)))
        mask = o.alloc((8, 8), pto.BOOL)
        o.submit(positive, pto.input(A), pto.output(mask))
        o.submit(masked, pto.input(mask), pto.input(A), pto.output(o.external(derived)))

    pto.Runtime(backend="cpu", executor=executor).run(orch, a, given, out, derived)
    np.testing.assert_array_equal(out, np.where(given, a, 0))
    np.testing.assert_array_equal(derived, np.maximum(a, 0))


def test_bool_is_the_last_dtype_code():
    assert pto.BOOL == len(pto.DataType) - 1
    assert pto.BOOL.numpy == np.dtype(np.bool_) and pto.BOOL.itemsize == 1


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_is_refused_as_unsupported(dtype):
    with pytest.raises(pto.PTOError, match=r"complex dtypes \(complex\d+\) are not supported"):
        pto.Runtime(backend="cpu").run(lambda o: o.external(np.zeros(4, dtype)))
    with pytest.raises(pto.PTOError, match="complex dtypes"):
        pto.Runtime(backend="cpu").run(lambda o: o.alloc((4,), dtype))


def test_an_empty_array_at_the_address_of_another_is_its_own_external(executor):
    """Zero bytes overlap nothing: three externals, three keys, no edge between unrelated writes."""
    memory = bytearray(64)
    empty, full, other = (np.frombuffer(memory, np.float32, count=0), np.frombuffer(memory, np.float32),
                          np.zeros(16, np.float32))

    def orch(o):
        tensors = [o.external(x) for x in (empty, full, other)]
        assert sorted(t.buffer.key for t in tensors) == [-3, -2, -1]
        o.submit(fill_value, pto.output(tensors[1]), 1.0)
        o.submit(fill_value, pto.output(tensors[2]), 2.0)

    result = pto.Runtime(backend="cpu", executor=executor).run(orch, record=True)
    assert result.graph.edges == []
    assert (full == 1.0).all() and (other == 2.0).all()


@pto.kernel(worker=pto.VECTOR)
def fill_value(out, value):
    out[...] = value
