"""neuron_compile's local kernel repository, in the layout Hugging Face's ``kernels`` library loads
(``metadata.json`` beside this package): ``layers`` holds the layers it swaps in."""

from . import layers  # noqa: F401
