"""`python -m opct ...`: the `opct` command (opct.cli), for an environment whose scripts are not on PATH."""

import sys

from opct.cli import main

sys.exit(main())
