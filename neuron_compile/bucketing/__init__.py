"""Shape bucketing: symbolic sizes rounded up to buckets, one executable per bucket, exact results.

Used by the Dynamo backend (``capture``) and by the device's growing lengths (``device/lengths.py``).

* ``analysis``: proves a symbolic graph exact when its sizes are padded to a bucket (``analyze``);
* ``layouts``: padded layouts, the arithmetic the analysis reasons in;
* ``values``: what the analysis knows of integer and bool tensors' values;
* ``indexing``, ``conv_cat``, ``padded_reductions``: the padding rules of ops that move data by index, read
  neighbours, or reduce over a padded dim;
* ``sizes``: which bucket each size symbol takes at a call, and the size arithmetic;
* ``padding``: per call, sizes rounded up, the graph re-traced at the bucket, inputs padded, outputs sliced;
* ``shape_env``: what bucketing reads of Dynamo's ShapeEnv (a private torch API), in one place.

This ``__init__`` imports nothing.
"""
