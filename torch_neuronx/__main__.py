"""``python -m torch_neuronx``: the ``torch-neuronx`` command line (``ls``, ``demo``)."""

import sys

from .cli import main

sys.exit(main())
