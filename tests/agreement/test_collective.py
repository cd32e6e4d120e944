"""agreement/collective: this rank's view (installed versions, the parameters inside any
wrapper, the resolved config) and the gather in one process. Two real ranks that agree and
disagree: tests/e2e/test_agreement.py."""
import torch
from mmengine.config import Config
from mmengine.model import MMDistributedDataParallel

from mmddp_ext.agreement.collective import agree_or_stop, parameter_shapes, versions, view_of


def test_versions_of_installed_and_missing_packages():
    found = versions(('torch', 'surely-not-installed-pkg'))
    assert list(found) == ['torch', 'surely-not-installed-pkg']
    assert found['surely-not-installed-pkg'] is None
    assert torch.__version__.startswith(found['torch'])  # the wheel's, without a local tag


def test_parameters_are_read_inside_a_wrapper():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    expected = [('0.weight', (4, 3)), ('0.bias', (4, )), ('1.weight', (4, )), ('1.bias', (4, ))]
    assert parameter_shapes(model) == expected
    wrapper = MMDistributedDataParallel.__new__(MMDistributedDataParallel)
    torch.nn.Module.__init__(wrapper)
    wrapper.module = model
    assert parameter_shapes(wrapper) == expected


def test_a_view_changes_with_what_is_trained_and_a_single_rank_agrees():
    model = torch.nn.Linear(3, 4)
    cfg = Config(dict(train_cfg=dict(max_epochs=2), optim_wrapper=dict(lr=0.1)))
    summary, params = view_of(model, cfg, dataset_length=10, iters_per_epoch=5)
    assert params == [('weight', (4, 3)), ('bias', (4, ))]
    other, _ = view_of(model, Config(dict(cfg.to_dict(), optim_wrapper=dict(lr=0.2))), 10, 5)
    assert other != summary
    assert view_of(torch.nn.Linear(3, 5), cfg, 10, 5)[0] != summary
    assert agree_or_stop(summary, params, rank=0) == [summary]  # not distributed: itself
