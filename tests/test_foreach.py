"""torch._foreach_* ops (gradient clipping, foreach optimizers) compiled against eager: every
functional overload PyTorch registers, with arguments built from its schema."""

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.decompositions import _foreach_decompositions

aten = torch.ops.aten
OVERLOADS = sorted(_foreach_decompositions(), key=str)
SHAPES = [(4,), (2, 3), (3, 1, 2)]


def _arguments(overload):
    """Arguments for an overload from its schema: lists of three tensors of different shapes."""
    torch.manual_seed(0)
    name = overload.__name__
    args, kwargs = [], {}
    for arg in overload._schema.arguments:
        kind = str(arg.type)
        if kind == "List[Tensor]":
            square = name.startswith("_foreach_mm")
            value = [torch.rand(3, 3) + 0.5 if square else torch.rand(s) + 0.5 for s in SHAPES]
        elif kind in ("List[Scalar]", "List[number]"):
            value = [0.5, 2.0, 1.5]
        elif kind == "Tensor":  # the scalars of addcmul/addcdiv.Tensor, or a 0-d other
            value = torch.tensor([0.5, 2.0, 1.5]) if arg.name == "scalars" else torch.tensor(1.5)
        elif kind in ("Scalar", "number"):
            value = 0.5 if arg.name != "ord" else 2
        elif arg.has_default_value():
            continue
        else:
            raise AssertionError(f"{overload}: no argument of type {kind}")
        (kwargs.__setitem__(arg.name, value) if arg.kwarg_only else args.append(value))
    return args, kwargs


# Dynamo cannot trace these two: their fake-tensor kernel wants the scalars tensor on the CPU and
# gets it on the meta device (PyTorch 2.13, any backend). Their decomposition is checked alone.
UNTRACEABLE = {aten._foreach_addcmul.Tensor, aten._foreach_addcdiv.Tensor}


@pytest.mark.parametrize("overload", [o for o in OVERLOADS if o not in UNTRACEABLE], ids=str)
def test_foreach_overload_matches_eager(overload):
    args, kwargs = _arguments(overload)
    want = overload(*args, **kwargs)
    got = torch.compile(lambda *a: overload(*a, **kwargs), backend="neuron")(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("overload", sorted(UNTRACEABLE, key=str), ids=str)
def test_decomposition_of_an_untraceable_overload_matches_eager(overload):
    args, kwargs = _arguments(overload)
    got, want = _foreach_decompositions()[overload](*args, **kwargs), overload(*args, **kwargs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_gradient_clipping_in_a_compiled_training_step():
    # clip_grad_norm_ is _foreach_norm, a norm of the norms, and _foreach_mul_ by the clip factor
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    twin.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def step(net):
        net.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        total = torch.nn.utils.clip_grad_norm_(net.parameters(), 0.1)
        return loss, total

    (loss, total), (loss_ref, total_ref) = torch.compile(step, backend="neuron")(model), step(twin)
    torch.testing.assert_close(loss, loss_ref)
    torch.testing.assert_close(total, total_ref, rtol=1e-5, atol=1e-6)
    assert total_ref > 0.1  # the clip factor is below one: the gradients were scaled
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
