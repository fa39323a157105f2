"""``python -m workbench``: the same as the ``ssm-workbench`` command (workbench.cli.main)."""
from workbench.cli import main
import sys
sys.exit(main())
