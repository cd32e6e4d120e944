"""Test-only, imported through ``custom_imports``: models and datasets that provoke DDP's own
errors in the demo, as they happen in the field.

* ``UnusedParamHead``: MMPose's heatmap head with a layer the loss never uses (DDP's "Expected
  to have finished reduction in the prior iteration" at the second iteration).
* ``RankExtraHead``: on rank ``extra_on_rank`` only, the head has extra layers, as a stale
  config on one node would give (DDP's "DDP expects same model across all ranks" at wrap time).
* ``ReusedCheckpointHead``: the last layer runs twice under reentrant activation
  checkpointing (DDP's "Expected to mark a variable ready only once" with
  ``find_unused_parameters=True``).
* ``RankHalfDataset``: rank ``half_on_rank`` sees half of the annotations, as a rank that
  reads another copy of the data on its node (the ranks then run different collectives).
"""
import os

import torch
from mmpose.datasets import CocoDataset
from mmpose.models.heads import HeatmapHead
from mmpose.registry import DATASETS, MODELS
from torch import nn


def _rank() -> int:
    return int(os.environ.get('RANK', '0'))


@MODELS.register_module()
class UnusedParamHead(HeatmapHead):
    """A heatmap head whose ``unused_branch`` never reaches the loss."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.unused_branch = nn.Linear(4, 4)


@MODELS.register_module()
class RankExtraHead(HeatmapHead):
    """A heatmap head with an extra refinement block on one rank only."""

    def __init__(self, extra_on_rank: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        if _rank() == extra_on_rank:
            self.refine = nn.Sequential(nn.Conv2d(17, 17, 3, padding=1), nn.BatchNorm2d(17))


@MODELS.register_module()
class ReusedCheckpointHead(HeatmapHead):
    """The final layer applied twice, each under reentrant activation checkpointing."""

    def forward(self, feats):
        from torch.utils.checkpoint import checkpoint
        x = self.conv_layers(self.deconv_layers(feats[-1]))
        y = checkpoint(self.final_layer, x, use_reentrant=True)
        z = checkpoint(self.final_layer, x, use_reentrant=True)
        return (y + z) / 2


@DATASETS.register_module()
class RankHalfDataset(CocoDataset):
    """The demo's COCO dataset; rank ``half_on_rank`` keeps every second sample."""

    def __init__(self, half_on_rank: int = 1, **kwargs) -> None:
        self.half_on_rank = half_on_rank
        super().__init__(**kwargs)

    def load_data_list(self):
        data = super().load_data_list()
        return data[::2] if _rank() == self.half_on_rank else data


__all__ = ['RankExtraHead', 'RankHalfDataset', 'ReusedCheckpointHead', 'UnusedParamHead', 'torch']
