"""Post-import hooks: patch a third-party module right after it first runs, without importing it early.

The device's hooks on accelerate, transformers and TRL (``_accelerate_hooks``) and on DTensor's random
tracker (``_dtensor_rng_hooks``) install at ``import torch``, where importing those modules would cost
seconds; ``patch_on_import`` patches one already imported at once, and puts a finder first on
``sys.meta_path`` for the others, which wraps their loader's ``exec_module`` to run the patch after it.
"""

from __future__ import annotations

import importlib.abc
import sys


def patch_on_import(patches: dict) -> None:
    """Run ``patches[name](module)`` on each named module: now if it is imported, else right after it is."""
    later = {}
    for name, fix in patches.items():
        if name in sys.modules:
            fix(sys.modules[name])
        else:
            later[name] = fix
    if later:
        sys.meta_path.insert(0, _Finder(later))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module it patches, it takes the spec the other finders give and wraps
    its loader so that the patch runs right after the module's code."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        fix = self.patches.get(name)
        if fix is None:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                execute = spec.loader.exec_module

                def exec_module(module, execute=execute, fix=fix):
                    execute(module)
                    fix(module)

                spec.loader.exec_module = exec_module
                return spec
        return None
