"""``python -m workbench.cli``: the command line, as the ``ssm-workbench`` console script."""

import sys

from workbench.cli import main

sys.exit(main())
