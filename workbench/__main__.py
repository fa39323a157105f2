from workbench.cli import main
import sys
sys.exit(main())
