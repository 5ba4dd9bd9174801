"""``python -m neuron_compile ...`` runs the ``neuron-compile`` CLI."""

import sys

from .cli import main

sys.exit(main())
