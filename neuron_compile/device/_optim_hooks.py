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

    from ..dynamo_skips import traced_through

    if not getattr(adam._multi_tensor_adam, "_neuron", False):
        adam._multi_tensor_adam = traced_through(adam._multi_tensor_adam, handler)  # Dynamo sees torch's


def sgd_through(handler) -> None:
    """SGD's step functions (``torch.optim.sgd._single_tensor_sgd``, ``foreach=False``, and
    ``_multi_tensor_sgd``, the default on a foreach device) call ``handler(original, *args, **kwargs)``:
    ``torch.optim.sgd.sgd`` looks them up in its module at every step (``func = _multi_tensor_sgd`` /
    ``func = _single_tensor_sgd``)."""
    import torch.optim.sgd as sgd

    from ..dynamo_skips import traced_through

    for name in ("_single_tensor_sgd", "_multi_tensor_sgd"):
        if not getattr(getattr(sgd, name), "_neuron", False):
            setattr(sgd, name, traced_through(getattr(sgd, name), handler))
