"""``python -m neuron_compile.cli ...`` runs the ``neuron-compile`` CLI."""

import sys

from .entry import main

sys.exit(main())
