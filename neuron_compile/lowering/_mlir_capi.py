"""Run an MLIR pass manager without holding the GIL: torch-mlir's C API through ctypes.

torch-mlir's Python binding of ``PassManager.run`` keeps the GIL for the whole
pipeline, so nothing else in the process runs while a pass works, and a pass
that never finishes (Torch-MLIR's ``torch-decompose-complex-ops`` on a 0-d
``_softmax`` loops forever) hangs the process beyond any watchdog. The same
C function the binding calls, ``mlirPassManagerRunOnOp`` of
``libTorchMLIRAggregateCAPI.so``, called through ctypes, releases the GIL
(ctypes does for every foreign call), so ``diagnostics.run_pipeline`` can run it
on a thread and stop waiting at a deadline.

This is the one place that knows torch-mlir's private layout: the library's
file name, the symbol, and the ``_CAPIPtr`` capsules of ``PassManager`` and
``Operation`` (``tests/test_pipeline_bound.py`` fails loudly when any changes).
"""

from __future__ import annotations

import ctypes
import functools
import os


class _Handle(ctypes.Structure):
    # MlirPassManager, MlirOperation, MlirContext, MlirLocation: `struct { void *ptr; }` by value
    _fields_ = [("ptr", ctypes.c_void_p)]


class _LogicalResult(ctypes.Structure):
    _fields_ = [("value", ctypes.c_int8)]


class _StringRef(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("length", ctypes.c_size_t)]


# a one-pointer struct travels in a register as the pointer would, and MlirLogicalResult as its int8:
# ctypes callbacks take and return simple types only
_DIAGNOSTIC_HANDLER = ctypes.CFUNCTYPE(ctypes.c_int8, ctypes.c_void_p, ctypes.c_void_p)
_STRING_CALLBACK = ctypes.CFUNCTYPE(None, _StringRef, ctypes.c_void_p)


@functools.cache
def _library():
    import torch_mlir._mlir_libs as libs

    lib = ctypes.CDLL(os.path.join(os.path.dirname(libs.__file__), "libTorchMLIRAggregateCAPI.so"))
    signatures = {
        "mlirPassManagerRunOnOp": ([_Handle, _Handle], _LogicalResult),
        "mlirContextAttachDiagnosticHandler": (
            [_Handle, _DIAGNOSTIC_HANDLER, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_uint64),
        "mlirContextDetachDiagnosticHandler": ([_Handle, ctypes.c_uint64], None),
        "mlirDiagnosticPrint": ([_Handle, _STRING_CALLBACK, ctypes.c_void_p], None),
        "mlirDiagnosticGetLocation": ([_Handle], _Handle),
        "mlirLocationPrint": ([_Handle, _STRING_CALLBACK, ctypes.c_void_p], None),
        "mlirDiagnosticGetNumNotes": ([_Handle], ctypes.c_ssize_t),
        "mlirDiagnosticGetNote": ([_Handle, ctypes.c_ssize_t], _Handle),
    }
    for name, (args, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    capsule_name = ctypes.pythonapi.PyCapsule_GetName
    capsule_name.restype = ctypes.c_char_p
    capsule_name.argtypes = [ctypes.py_object]
    return lib, get, capsule_name


def _pointer(obj) -> int:
    _, get, capsule_name = _library()
    capsule = obj._CAPIPtr
    pointer = get(capsule, capsule_name(capsule))
    if not pointer:
        raise RuntimeError(f"torch-mlir's {type(obj).__name__}._CAPIPtr holds no pointer")
    return pointer


def _printed(print_function, handle) -> str:
    parts = []
    callback = _STRING_CALLBACK(lambda ref, _: parts.append(ctypes.string_at(ref.data, ref.length)))
    print_function(handle, callback, None)
    return b"".join(parts).decode("utf-8", "replace")


def _describe(lib, diagnostic: _Handle, indent: str = "") -> list[str]:
    location = _printed(lib.mlirLocationPrint, lib.mlirDiagnosticGetLocation(diagnostic))
    lines = [f"{indent}{location}: {_printed(lib.mlirDiagnosticPrint, diagnostic)}"]
    for index in range(lib.mlirDiagnosticGetNumNotes(diagnostic)):
        lines += _describe(lib, lib.mlirDiagnosticGetNote(diagnostic, index), "  note: ")
    return lines


def run_pass_manager(pass_manager, operation, on_diagnostic) -> bool:
    """``pass_manager.run(operation)`` with the GIL released; True on success. Every diagnostic
    MLIR emits meanwhile goes to ``on_diagnostic(lines)`` as ``location: message`` lines (its notes
    after it), called with the GIL held from whichever thread runs this. The caller keeps
    ``pass_manager`` and ``operation`` alive until this returns."""
    lib, _, _ = _library()
    context = _Handle(_pointer(operation.context))

    def handle(diagnostic, _user_data):
        try:
            on_diagnostic(_describe(lib, _Handle(diagnostic)))
        except Exception:  # noqa: BLE001 - an exception cannot cross into MLIR
            pass
        return 1  # handled: MLIR prints nothing itself

    handler = _DIAGNOSTIC_HANDLER(handle)
    handler_id = lib.mlirContextAttachDiagnosticHandler(context, handler, None, None)
    try:
        return bool(lib.mlirPassManagerRunOnOp(_Handle(_pointer(pass_manager)), _Handle(_pointer(operation))).value)
    finally:
        lib.mlirContextDetachDiagnosticHandler(context, handler_id)
