"""XLA's C++ log level: start-up INFO lines stay off the user's terminal unless they ask for them."""

from __future__ import annotations

import os
import sys

from jaxlib import utils


def quiet_runtime_logs() -> None:
    """Keep XLA's C++ INFO lines (a client's device count, the distributed coordinator's greetings) off the
    user's terminal: absl's minimum level becomes ``TF_CPP_MIN_LOG_LEVEL`` (WARNING, 1, unless set: jax's
    ``import`` sets that same default), for the rest of the process. absl itself does not read the
    variable, so without this the level stayed INFO and every client printed. A user who set jax's
    logging level (``JAX_LOGGING_LEVEL``, ``jax_logging_level``) keeps what jax made of it."""
    if os.environ.get("JAX_LOGGING_LEVEL", "NOTSET") != "NOTSET":
        return
    jax = sys.modules.get("jax")
    config = getattr(jax, "config", None)
    if getattr(config, "jax_logging_level", None) not in (None, "NOTSET"):
        return
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"))
    except ValueError:
        level = 1
    utils.absl_set_min_log_level(max(0, min(level, 3)))
