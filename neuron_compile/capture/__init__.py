"""The capture stage: what Dynamo and AOTAutograd hand us, up to a static FX graph per call.

* ``backend``: the ``neuron`` Dynamo backend (``neuron_backend``, the
  ``torch_dynamo_backends`` entry point), AOTAutograd with our decomposition
  table and partitioner, and ``CompiledGraph``, the callable AOTAutograd gets
  for each graph (static, bucketed through ``neuron_compile.bucketing``, or
  specialized per exact shape);
* ``partition``: the joint graph split into forward and backward (Inductor's min-cut after our CSE);
* ``precompile``: what makes Dynamo's precompile package safe to save and to
  load (the tag, the guards PyTorch cannot save or load, the vouched rewrites);
* ``fallback``: ``fallback=eager``, ops that don't lower run eagerly between
  compiled parts.

Each static graph goes to ``neuron_compile.compiler``, below this stage; the
options, the FX rewrites and ``associative_scan`` that both read live below it
too (``neuron_compile.options``, ``neuron_compile.decompositions``).
"""
