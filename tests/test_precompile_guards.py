"""Which of a traced frame's guards keep it out of precompile's package (precompile._unloadable_guard,
precompile._unsaveable_guard), decided at backend time, before Dynamo builds the guards.

Guards here are made by hand on a tiny object graph, so each rule is checked on its own: a guard
PyTorch 2.13 would save through a ``functools.wraps`` wrapper (whose name belongs to another
object) must be caught; one that caching precompile drops before saving must not be, since it
never reaches the next process.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
from torch._dynamo.guards import GuardBuilder
from torch._dynamo.source import AttrSource, LocalSource, TypeSource
from torch._guards import Guard

from neuron_compile.capture.precompile import _dropped_when_saved, _unloadable_guard, _unsaveable_guard


def _target(x):
    return x


_target.flag = 3  # an instance attribute the wrapper reaches through __wrapped__


@functools.wraps(_target)
def _wrapper(x):  # its __qualname__ is _target's, so the pickler cannot name it
    return _target(x)


WRAPPED = AttrSource(LocalSource("f"), "__wrapped__")


def _frame(*guards):
    return SimpleNamespace(local_scope={"f": _wrapper}, global_scope={}, guards=list(guards))


@pytest.mark.parametrize("kind", [
    GuardBuilder.FUNCTION_MATCH,  # builds an ID_MATCH, which is dropped
    GuardBuilder.ID_MATCH,
    GuardBuilder.CLOSURE_MATCH,
], ids=lambda kind: kind.__name__)
def test_a_guard_precompile_drops_does_not_refuse_the_package(kind):
    guard = Guard(WRAPPED, kind)
    assert _dropped_when_saved(guard)
    assert _unloadable_guard(_frame(guard)) is None


def test_a_saved_guard_through_the_wrapper_refuses_the_package():
    guard = Guard(AttrSource(WRAPPED, "flag"), GuardBuilder.CONSTANT_MATCH)
    assert not _dropped_when_saved(guard)
    reason = _unloadable_guard(_frame(Guard(WRAPPED, GuardBuilder.FUNCTION_MATCH), guard))
    assert reason is not None and "CONSTANT_MATCH guard on L['f'].__wrapped__.flag" in reason, reason
    assert f"{__name__}._target, a wrapper whose name belongs to another object" in reason, reason


def test_an_identity_check_on_a_type_is_neither_dropped_nor_saveable():
    # on type(x) Dynamo checks TYPE_MATCH and records no ID_MATCH, so the guard stays: the frame
    # cannot be saved at all (_skip_unsaveable_frame runs it eagerly)
    on_type = Guard(TypeSource(WRAPPED), GuardBuilder.CLASS_MATCH)
    assert not _dropped_when_saved(on_type)
    assert _unsaveable_guard(_frame(Guard(WRAPPED, GuardBuilder.FUNCTION_MATCH), on_type)) is on_type
    assert _unsaveable_guard(_frame(Guard(WRAPPED, GuardBuilder.FUNCTION_MATCH))) is None
