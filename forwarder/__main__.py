"""`python -m forwarder ...` = `se-forwarder ...`."""

import sys

from .cli import main

sys.exit(main())
