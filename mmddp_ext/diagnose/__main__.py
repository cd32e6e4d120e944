"""``python -m mmddp_ext.diagnose WORK_DIR``: the program; its flags are the entry layer's
(:mod:`mmddp_ext.entry.diagnose`)."""
import sys

from ..entry.diagnose import main

sys.exit(main())
