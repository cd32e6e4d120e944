"""Test-only: the batch finder's :class:`Trials` on the demo pose model (64×64) in one process,
set up as the helpers that make its steps fail under an address-space limit need it."""
import torch
from mmengine import Config
from mmengine.registry import init_default_scope

from mmddp_ext.batch_finder.trials import Trials
from mmddp_ext.memory.budget import apply_budget

ROOT = __file__.rsplit('/tests/', 1)[0]
CONFIG = f'{ROOT}/configs/demo/td-hm_res18_1xb32-30e_demo-64x64.py'


def demo_trials(data_root: str, batch: int, guard: bool) -> Trials:
    """One thread, a loose budget (large blocks mapped on their own, as a budget does), and the
    trials' model wrapped in ``MicrobatchDDP`` where ``guard``; no reserve held."""
    torch.set_num_threads(1)
    cfg = Config.fromfile(CONFIG)
    cfg.train_dataloader.dataset.data_root = data_root.rstrip('/') + '/'
    if guard:
        cfg.model_wrapper_cfg = dict(type='MicrobatchDDP')
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    apply_budget(100000, torch.device('cpu'))
    return Trials(cfg, torch.device('cpu'), batch, 0)
