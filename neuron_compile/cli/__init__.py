"""The ``neuron-compile`` command line (``neuron_compile.cli:main``, the console script)."""

from .commands import main

__all__ = ["main"]
