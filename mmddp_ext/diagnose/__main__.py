"""``python -m mmddp_ext.diagnose WORK_DIR``: the program; its flags are
:mod:`mmddp_ext.diagnose.program`."""
import sys

from .program import main

sys.exit(main())
