"""The private ``torch.optim`` API the device routes: Adam's and AdamW's foreach step function, SGD's
for-loop and foreach step functions.

``torch.optim.adam._multi_tensor_adam``, ``torch.optim.sgd._single_tensor_sgd`` and ``_multi_tensor_sgd``
are private functions of torch; this module alone replaces them (``tests/test_device_hooks.py`` checks the
lookups it relies on and the sources ``optim.foreach_adam_`` and ``optim.foreach_sgd_`` mirror, so a torch
upgrade that changes any fails there, by name).
"""

from __future__ import annotations


def multi_tensor_adam_through(handler) -> None:
    """Adam's and AdamW's foreach step (``torch.optim.adam._multi_tensor_adam``, the default on a device in
    torch's foreach list, which PrivateUse1 is) calls ``handler(original, *args, **kwargs)``.

    ``torch.optim.adam.adam`` looks the function up in its module at every step (``func =
    _multi_tensor_adam``), and ``AdamW`` is ``Adam`` with decoupled weight decay, so one module attribute
    serves both. torch imports ``torch.optim`` before the device's autoload runs: a plain ``setattr``. Under
    Dynamo (a compiled optimizer step) the router calls torch's own (``dynamo_skips.traced_through``)."""
    import torch.optim.adam as adam

    _route(adam, ("_multi_tensor_adam",), handler)


def sgd_through(handler) -> None:
    """SGD's step functions (``torch.optim.sgd._single_tensor_sgd``, ``foreach=False``, and
    ``_multi_tensor_sgd``, the default on a foreach device) call ``handler(original, *args, **kwargs)``:
    ``torch.optim.sgd.sgd`` looks them up in its module at every step (``func = _multi_tensor_sgd`` /
    ``func = _single_tensor_sgd``)."""
    import torch.optim.sgd as sgd

    _route(sgd, ("_single_tensor_sgd", "_multi_tensor_sgd"), handler)


def _route(module, names, handler) -> None:
    """Replace each function ``module.<name>`` by a router to ``handler`` (once: a router is marked
    ``_neuron``); under Dynamo the router calls torch's own (``dynamo_skips.traced_through``)."""
    from ..dynamo_skips import traced_through

    for name in names:
        if not getattr(getattr(module, name), "_neuron", False):
            setattr(module, name, traced_through(getattr(module, name), handler))
