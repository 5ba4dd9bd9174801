"""torch.distributed on neuron tensors, in one place.

* ``process_group``: the ``neuron`` process-group backend (``init_process_group("neuron")``), its
  ``Work`` objects, and which collective runs where;
* ``xla``: eager collectives run by XLA on the distributed PJRT client, no host copy
  (``neuron_compile.runtime.distributed`` holds that client);
* ``staged``: a C++ process group's collectives (gloo) on neuron tensors, through host copies;
* ``reduce_ops``: which ``ReduceOp`` each dtype allows, PREMUL_SUM as a scaled SUM.

Collectives inside compiled graphs are lowered by ``neuron_compile.lowering.functional_collectives``.
This ``__init__`` imports nothing.
"""
