"""Print the diagnosis of a failed or stuck run: ``python tools/diagnose.py WORK_DIR`` is
``python -m mmddp_ext.diagnose WORK_DIR`` (the same flags), with Python's garbage collector off
for the whole short program: it imports the package (torch and MMEngine with it), reads a few
files and prints; collecting while those imports run, and again at exit, was a quarter of its
CPU time (2.6 CPU-s, 2.0 without). ``tools/dist_train.sh`` runs it after a failed run; why the
collector matters at start-up: ``mmddp_launch/start_up.py``.
"""
import gc
import sys

if __name__ == '__main__':
    gc.disable()
    from mmddp_ext.diagnose.program import main
    code = main()
    gc.freeze()  # nothing for the interpreter's collections at exit to walk
    sys.exit(code)
