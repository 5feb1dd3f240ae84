"""`python -m runtime run|inspect|verify ...`: the runtime's commands without the exporter."""

import sys

from runtime.cli import main

sys.exit(main())
