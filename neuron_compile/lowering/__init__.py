"""The lowering stage: a static, decomposed FX graph -> one StableHLO module.

* ``fx_to_stablehlo``: ``lower_to_stablehlo``, Torch-MLIR's three stages
  (import, torch-backend, stablehlo), the graph fixes around them
  (``drop_error_checks``, ``fix_unsigned_compares``) and the reproducer a
  failure leaves;
* ``direct``: a graph whose every op has a rule (``direct_rules``) written as
  StableHLO text (``direct_ir``) with no Torch-MLIR (the device's eager ops;
  ``lower_to_stablehlo(direct=True)``);
* ``splice``: for graphs holding ops Torch-MLIR cannot lower, the partition
  into Torch-MLIR and JAX groups, the JAX lowering of a group, and the splice
  of the parts under one ``@main``;
* ``jax_rules`` (and ``jax_ldl``, LAPACK's LDL in JAX): the JAX rule of each
  such ATen op;
* ``diagnostics``: what both share, the MLIR context and pass runner, and
  ``LoweringError``.

Imports go one way: ``fx_to_stablehlo`` -> ``direct`` -> ``direct_rules`` ->
``direct_ir``; ``fx_to_stablehlo`` -> ``splice`` -> ``jax_rules`` -> ``jax_ldl``,
and each of them -> ``diagnostics``. Nothing here imports the
rest of ``neuron_compile``. The names below are the stage's API
(``neuron_compile.LoweringError`` is this one).
"""

from .diagnostics import LoweringError, exception_chain, innermost_exception, new_context, repro
from .fx_to_stablehlo import drop_error_checks, lower_to_stablehlo

__all__ = ["LoweringError", "drop_error_checks", "exception_chain", "innermost_exception", "lower_to_stablehlo",
           "new_context", "repro"]
