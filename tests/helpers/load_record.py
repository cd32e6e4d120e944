"""A test-only dataset wrapper that records every sample it loads, in the rank's process or in
its DataLoader workers: ``<record_dir>/loads_rank{RANK}.txt`` gets the sample's
``metainfo['id']`` (as ``tests.helpers.stop_point_hook`` records what was trained), one line per
``__getitem__``. Anything else is the wrapped dataset's."""
import os
import os.path as osp

from mmengine.registry import DATASETS


@DATASETS.register_module()
class LoadRecordingDataset:
    """Args:
        dataset: the config of the dataset to wrap.
        record_dir: where the records go.
        data_root: given, the wrapped dataset's (what the tests' ``--cfg-options`` set).
    """

    def __init__(self, dataset: dict, record_dir: str, data_root=None) -> None:
        self.dataset = DATASETS.build(
            dict(dataset, **({} if data_root is None else dict(data_root=data_root))))
        self.record_dir = record_dir
        os.makedirs(record_dir, exist_ok=True)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        item = self.dataset[index]
        path = osp.join(self.record_dir, f'loads_rank{os.environ.get("RANK", "0")}.txt')
        with open(path, 'a') as f:
            f.write(f'{int(item["data_samples"].metainfo["id"])}\n')
        return item

    def __getattr__(self, name: str):
        if name == 'dataset':  # not built yet
            raise AttributeError(name)
        return getattr(self.dataset, name)


def loads(record_dir: str, rank: int) -> list:
    """The ids rank ``rank`` (and its workers) loaded, in the order written."""
    path = osp.join(record_dir, f'loads_rank{rank}.txt')
    if not osp.exists(path):
        return []
    with open(path) as f:
        return [int(line) for line in f]
