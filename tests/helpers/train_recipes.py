"""Train configs one after another in this one process with ``tools/dist_train.py``'s entry
(``mmddp_ext.entry.train.main``): ``tests/e2e/test_recipes.py`` trains every MMPose family
this way, paying for the interpreter, torch and MMPose's imports once instead of per family.

    python tests/helpers/train_recipes.py OUT_DIR NAME=CONFIG [NAME=CONFIG ...]

For each NAME: the work dir is ``OUT_DIR/NAME/work``; ``OUT_DIR/NAME/result.json`` holds the
exit code the entry returned (1 with the traceback when it raised) and the text of the log
file MMEngine wrote (its ``Epoch(train)`` lines). A family that fails does not stop the
others."""
import glob
import json
import os
import os.path as osp
import sys
import traceback


def train_each(out_dir: str, pairs) -> None:
    from mmddp_ext.entry.train import main as train
    from mmddp_launch.start_up import collect_all
    for pair in pairs:
        name, config = pair.split('=', 1)
        work = osp.join(out_dir, name, 'work')
        os.makedirs(work, exist_ok=True)
        try:
            rc, error = train([config, '--work-dir', work]), ''
        except BaseException:  # noqa: B902  (the next family still trains)
            rc, error = 1, traceback.format_exc()
        logs = sorted(glob.glob(osp.join(work, '*', '*.log')))
        log = open(logs[-1]).read() if logs else ''
        with open(osp.join(out_dir, name, 'result.json'), 'w') as f:
            json.dump(dict(rc=rc, error=error, log=log), f)
        print(f'{name}: exit {rc}', flush=True)
        collect_all()  # a family that failed leaves its runner frozen: free it before the next


if __name__ == '__main__':
    train_each(sys.argv[1], sys.argv[2:])
