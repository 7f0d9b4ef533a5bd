"""``python -m onceflow``: the same as the ``onceflow`` script."""

import sys

from onceflow.cli import main

sys.exit(main())
