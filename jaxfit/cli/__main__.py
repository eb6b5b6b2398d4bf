"""``python -m jaxfit.cli``: the ``jaxfit`` command."""

import sys

from jaxfit.cli import main

sys.exit(main())
