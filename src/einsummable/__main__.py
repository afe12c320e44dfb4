"""``python -m einsummable``: the same command as ``einsummable``."""

import sys

from einsummable.cli import main

sys.exit(main())
