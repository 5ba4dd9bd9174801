"""``neuron-compile``: the offline command line for the neuron backend (``main``, the console script).

Every command is a small function ``cmd_<name>(args) -> exit code`` over the
same path the backend takes (``torch.compile(..., backend="neuron")``), so what
the CLI shows is what a user's run does. Conventions, shared by all commands:

* exit 0 on success, 1 when a compile fails (or numbers disagree), 2 on bad
  usage (bad flags, a spec that cannot be loaded, an unknown pass name);
* errors go to stderr as one readable paragraph, never a traceback
  (``NEURON_COMPILE_TRACEBACK=1`` shows one for debugging the CLI itself);
* ``--json`` prints what a machine reads.

Modules: ``entry`` (parser, ``main``, ``run``), ``common`` (what every command
shares), ``commands`` (demo, dump, compile, explain), ``cache_commands``
(cache, inspect, repro), ``bench`` (``neuron-compile bench`` and its
fresh-process worker, ``python -m neuron_compile.cli.bench``), ``specs``
(model specs) and ``models`` (the built-in models). Imports go one way:
entry -> commands, cache_commands, bench -> common -> specs -> models.
"""

from .entry import main

__all__ = ["main"]
