"""Run in a fresh process: ``python -m tests.helpers.import_probe changes`` prints, as JSON, what
``import mmddp_ext`` changes in MMEngine, the environment, the warning filters and the collector
(after importing what the package itself imports from MMEngine and torch, whose own import-time
changes are not ours); ``train with|without`` trains MMEngine's toy runner (a stock ``Runner``,
no ``runner_type``) one epoch, with or without the package imported, and prints its hooks and
the sums of its final weights."""
import gc
import json
import os
import sys
import tempfile
import warnings


def _state() -> dict:
    from mmengine.config.utils import MODULE2PACKAGE
    from mmengine.runner import CheckpointLoader, Runner
    return dict(
        runner={
            k: id(v)
            for k, v in vars(Runner).items()
        }, loaders={
            k: getattr(v, '__qualname__', repr(v))
            for k, v in vars(CheckpointLoader).get('_schemes', {}).items()
        }, packages=dict(MODULE2PACKAGE), environ=dict(os.environ),
        filters=[repr(f) for f in warnings.filters], gc=[gc.isenabled(),
                                                         gc.get_freeze_count()])


def changes() -> dict:
    import mmengine.config  # noqa: F401
    import mmengine.runner  # noqa: F401  what the package imports, first
    import torch  # noqa: F401
    before = _state()
    import mmddp_ext  # noqa: F401
    after = _state()
    out = {}
    for key in before:
        if isinstance(before[key], dict):
            out[key] = sorted(
                k for k in set(before[key]) | set(after[key])
                if before[key].get(k) != after[key].get(k))
        else:
            out[key] = [] if before[key] == after[key] else [before[key], after[key]]
    return out


def train(with_package: bool) -> dict:
    import torch
    torch.manual_seed(0)  # MMEngine's ToyDataset draws its data when its module is imported
    if with_package:
        import mmddp_ext  # noqa: F401
    import copy

    from mmengine.runner import Runner
    from mmengine.testing import RunnerTestCase
    case = RunnerTestCase()
    case.setUp()
    cfg = copy.deepcopy(case.epoch_based_cfg)
    cfg.work_dir = tempfile.mkdtemp()
    cfg.train_cfg.max_epochs = 1
    cfg.randomness = dict(seed=0)
    runner = Runner.from_cfg(cfg)
    runner.train()
    out = dict(
        type=type(runner).__name__, hooks=[type(h).__name__ for h in runner.hooks],
        loop=type(runner.train_loop).__name__, weights={
            k: round(float(v.sum()), 6)
            for k, v in runner.model.state_dict().items()
        })
    case.tearDown()
    return out


if __name__ == '__main__':
    what = sys.argv[1]
    print(json.dumps(changes() if what == 'changes' else train(sys.argv[2] == 'with')))
