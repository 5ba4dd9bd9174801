"""The private ``torch.optim`` API the device routes: Adam's and AdamW's foreach step function.

``torch.optim.adam._multi_tensor_adam`` is a private function of torch; this module alone replaces it
(``tests/test_device_hooks.py`` checks the lookup it relies on and the source ``optim.foreach_adam_``
mirrors, so a torch upgrade that changes either fails there, by name).
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
