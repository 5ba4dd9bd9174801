"""The package version, in a module of its own.

``cache_key`` and the precompile tag put it in every key, and the CLI prints
it. Importing it from here rather than from ``neuron_compile/__init__`` keeps
modules below the package's front from importing the package that imports
them (``neuron_compile.reset`` reaches ``compiler``, which reaches
``cache_key``).
"""

__version__ = "0.1.0"
