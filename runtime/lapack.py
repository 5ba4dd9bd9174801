"""jaxlib's LAPACK kernels made ready for the executables that call them (``lapack_sgetrf_ffi``,
``lapack_strsm_ffi``...: the JAX-lowered parts of a graph, ``neuron_compile/lowering/jax_rules.py``), and the BLAS
behind them kept on XLA's threads (``single_threaded_blas``)."""

from __future__ import annotations

import importlib
import os


def ready_lapack() -> None:
    """Make jaxlib's LAPACK kernels callable, once per process, before an executable that calls
    them (LU, QR, eigh... in the JAX-lowered parts of a graph) is compiled or loaded.

    Their FFI handlers are registered by importing ``jax._src.lax.linalg`` (a process that only
    reads the cache never did: "No FFI handler registered for lapack_sgetrf_ffi", and the entry
    looked broken), and the kernels find LAPACK's functions only after ``initialize_lapack``
    (which JAX calls while lowering): without it, a process that imported jax for another graph
    loaded the executable and segfaulted running it.
    """
    global _ready
    if not _ready:
        importlib.import_module("jax._src.lax.linalg").initialize_lapack()
        single_threaded_blas()
        _ready = True


_ready = False

# OpenBLAS's own names for its thread count: scipy's wheels prefix its symbols with ``scipy_``
_OPENBLAS_SET_THREADS = ("scipy_openblas_set_num_threads", "openblas_set_num_threads",
                         "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_")


def single_threaded_blas() -> str | None:
    """Run the BLAS behind jaxlib's LAPACK kernels (scipy's OpenBLAS: jaxlib takes its functions from
    ``scipy.linalg.cython_blas`` and ``cython_lapack``) on the calling thread. Returns the OpenBLAS
    function that set it, or None where nothing was changed.

    XLA runs those kernels (``lapack_strsm_ffi``, ``lapack_sgetrf_ffi``...) on its own threads, and
    OpenBLAS's threads then spin for work beside XLA's. Alone that costs
    nothing, but with another busy process on the cores it is ruinous: a graph with 12 triangular
    solves (a gated delta rule's, [2, 2, 4, 64, 16]) ran 1.5 ms a call alone and 58 ms with a second
    such process on 2 cores; single-threaded, 1.45 ms in both. It also takes OpenBLAS's thread server,
    called from several threads at once, out of the picture (a CI run hung inside such a graph twice).

    The count is OpenBLAS's, process-wide: scipy's own BLAS calls in this process become single-threaded
    too. Where the user has set ``OPENBLAS_NUM_THREADS``, their count stands and nothing is changed."""
    if os.environ.get("OPENBLAS_NUM_THREADS"):
        return None
    import ctypes

    try:
        blas = ctypes.CDLL(importlib.import_module("scipy.linalg.cython_blas").__file__)
    except (ImportError, OSError):
        return None
    for name in _OPENBLAS_SET_THREADS:
        set_threads = getattr(blas, name, None)
        if set_threads is not None:
            set_threads(1)
            return name
    return None  # another BLAS (MKL, Accelerate): left as it is
