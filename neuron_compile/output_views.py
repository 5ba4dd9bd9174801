"""Graph outputs that are views: returned as real views of their base, never as copies.

AOTAutograd hands a backend a functional graph, but remembers which user
outputs alias a graph input (``x[1]``, ``split``, ``as_strided``, ``view_as``)
or another output (a KV cache ``k.view(...).transpose(1, 2)`` of a projection
that is also returned). After the compiled graph returns, its runtime wrapper
regenerates each such output from its base (``gen_alias_from_base``): by
replaying the recorded view functions when none of them takes a symbolic
argument, and otherwise with ``base.as_strided(out.size(), out.stride(),
out.storage_offset())`` read from the tensor *the backend returned*. XLA
returns a fresh contiguous tensor at storage offset 0, so for a symbolic graph
that regeneration read the wrong elements: ``select(x, -1, i)`` with ``i``
symbolic came back as the first ``x[..., 0]`` slice, with no error.

Inductor returns a ``reinterpret_tensor`` of the base for these outputs; so do
we. ``find_output_views`` says, per graph output, whether it is a view of an
input or of another output, with its size, stride and storage offset relative
to the base (ints for a static graph, sympy expressions of the size symbols for
a symbolic one). ``make_view`` builds the view from the base at run time. XLA
then computes nothing for these outputs, and AOTAutograd's regeneration,
whichever way it goes, lands on the same elements eager reads.

A view can also flip its base's conjugate or negative bit (``x.conj()`` of a
complex ``x``, ``_neg_view``): the elements are the base's, read conjugated
or negated. The fake output records the bit, ``make_view`` flips it on the
real view. Without it a saved ``_conj`` (the backward of a complex multiply,
as in RoPE's ``view_as_complex(x) * freqs_cis``) came back unconjugated and the
gradient was wrong, with no error (issue 54).

Not taken as views (left to XLA, as before): outputs of another dtype than
their base with a different element size, and views of an output whose value is
not contiguous (XLA's result is row-major, so the fake strides would not hold)
or not its whole storage (two slices of an intermediate that is not returned:
neither holds the other's elements).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import torch.fx


@dataclass(frozen=True)
class OutputView:
    """One graph output as a view of its base.

    ``base_is_input``: the base is the graph input at position ``base`` (else the
    graph output at index ``base``). ``size``, ``stride`` and ``offset`` (the
    storage offset minus the base's) are ints, or sympy expressions of the
    graph's size symbols. ``dtype`` is set when the view reinterprets the base's
    elements (``view(dtype)`` of the same element size).
    """

    base_is_input: bool
    base: int
    size: tuple
    stride: tuple
    offset: object
    dtype: torch.dtype | None = None
    conj: bool = False  # the view flips the base's conjugate bit
    neg: bool = False  # the view flips the base's negative bit

    def symbols(self) -> set:
        return set().union(*(sympy.sympify(e).free_symbols for e in (*self.size, *self.stride, self.offset)))

    def concrete(self, evaluate) -> "OutputView":
        """This view with every expression evaluated to an int by ``evaluate(expr)``."""
        return OutputView(self.base_is_input, self.base, tuple(int(evaluate(e)) for e in self.size),
                          tuple(int(evaluate(e)) for e in self.stride), int(evaluate(self.offset)), self.dtype,
                          self.conj, self.neg)


def _expr(value):
    """An int, or the sympy expression of a SymInt (no guard is added: nothing is evaluated)."""
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return int(expr) if expr.is_Integer else expr
    return int(value)


def _storage(val):
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(val.untyped_storage())
    except Exception:  # a tensor without storage (sparse, nested): never a view here
        return None


def _is_contiguous(size, stride) -> bool:
    expected = 1
    for n, s in reversed(list(zip(size, stride))):
        if n != 1 and sympy.simplify(sympy.sympify(s) - expected) != 0:
            return False
        expected = expected * n
    return True


def _spans_storage(val) -> bool:
    """Whether ``val`` is its whole storage (a base, not a view of part of one): the elements XLA
    returns for it are then every element its storage's other views can reach."""
    try:
        nbytes = val.untyped_storage().nbytes()
        numel = val.numel()
    except Exception:
        return False
    return sympy.simplify(sympy.sympify(_expr(numel) * val.dtype.itemsize) - sympy.sympify(_expr(nbytes))) == 0


def find_output_views(gm: torch.fx.GraphModule) -> list[OutputView | None]:
    """Per output of ``gm``: an ``OutputView`` when its value shares storage with a graph input
    or with another (contiguous) output, else None."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = output_node.args[0] if isinstance(output_node.args[0], (tuple, list)) else (output_node.args[0],)

    def tensor_val(node):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        return val if isinstance(val, torch.Tensor) and not val.is_sparse and val.layout == torch.strided else None

    inputs = {}
    for pos, node in enumerate(placeholders):
        val = tensor_val(node)
        if val is not None:
            inputs.setdefault(_storage(val), (pos, val))
    # outputs XLA computes whose fake layout is row-major, as XLA's result is: possible bases
    out_bases = {}
    for index, node in enumerate(outs):
        val = tensor_val(node)
        if val is None or node.op == "placeholder":
            continue
        key = _storage(val)
        if key in inputs or key in out_bases:
            continue
        size, stride = [_expr(s) for s in val.shape], [_expr(s) for s in val.stride()]
        if _expr(val.storage_offset()) == 0 and _is_contiguous(size, stride) and _spans_storage(val):
            out_bases[key] = (index, val)

    views: list[OutputView | None] = []
    for index, node in enumerate(outs):
        val = tensor_val(node)
        key = _storage(val) if val is not None else None
        if key is None or (isinstance(node, torch.fx.Node) and node.op == "placeholder"):
            views.append(None)
            continue
        if key in inputs:
            base_is_input, (base, base_val) = True, inputs[key]
        elif key in out_bases and out_bases[key][0] != index:
            base_is_input, (base, base_val) = False, out_bases[key]
        else:
            views.append(None)
            continue
        dtype = None
        if val.dtype != base_val.dtype:
            if val.dtype.itemsize != base_val.dtype.itemsize:
                views.append(None)
                continue
            dtype = val.dtype
        views.append(OutputView(base_is_input, base, tuple(_expr(s) for s in val.shape),
                                tuple(_expr(s) for s in val.stride()),
                                _expr(val.storage_offset()) - _expr(base_val.storage_offset()), dtype,
                                val.is_conj() != base_val.is_conj(), val.is_neg() != base_val.is_neg()))
    return views


def make_view(base: torch.Tensor, view: OutputView) -> torch.Tensor:
    """``view`` (concrete) of the real tensor ``base``."""
    if view.dtype is not None:
        base = base.view(view.dtype)
    out = base.as_strided(view.size, view.stride, base.storage_offset() + view.offset)
    if view.conj:
        out = torch._conj(out)
    if view.neg:
        out = torch._neg_view(out)
    return out
