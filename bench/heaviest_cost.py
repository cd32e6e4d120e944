"""What finding the heaviest batch of a rank's share costs on a COCO-sized dataset.

A real MMEngine ``BaseDataset`` (its data list serialized, as MMDetection's datasets are by
default) holding a generated data list of COCO train2017's size (118,287 images, 7.3 objects
each on average, sizes from 240 to 640 pixels a side), and MMDetection's RetinaNet pipeline
(``Resize(scale=(1333, 800), keep_ratio=True)``, padding to 32): the time of
``choose_samples`` for one rank's share at 1, 2 and 8 ranks, three runs each.

    tools/py bench/heaviest_cost.py

Raw numbers: ``bench/results/heaviest_cost.json``; the figure is in docs/benchmarks.md.
"""
import json
import os.path as osp
import random
import statistics
import subprocess
import sys
import time

from mmengine.config import Config
from mmengine.dataset import BaseDataset

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from mmddp_ext.batch_finder.trials import choose_samples  # noqa: E402

IMAGES = 118287


class GeneratedDataset(BaseDataset):

    def load_data_list(self):
        rng = random.Random(0)
        return [
            dict(img_id=i, height=rng.randint(240, 640), width=rng.randint(240, 640),
                 instances=[dict(bbox=[0, 0, 1, 1], bbox_label=0)] * rng.choice(range(1, 15)))
            for i in range(IMAGES)
        ]


def main() -> None:
    start = time.monotonic()
    dataset = GeneratedDataset(lazy_init=False, serialize_data=True)
    built = time.monotonic() - start
    cfg = Config(
        dict(
            model=dict(data_preprocessor=dict(pad_size_divisor=32)), train_dataloader=dict(
                dataset=dict(pipeline=[
                    dict(type='LoadImageFromFile'),
                    dict(type='Resize', scale=(1333, 800), keep_ratio=True)
                ]))))
    runs = {}
    for world in (1, 2, 8):
        share = list(range(0, IMAGES, world))
        seconds = []
        for _ in range(3):
            t = time.monotonic()
            _, note = choose_samples(cfg, dataset, share, 32, 0)
            seconds.append(time.monotonic() - t)
        runs[world] = dict(share=len(share), seconds=seconds, median=statistics.median(seconds))
        print(f'{world} rank(s): share {len(share)}: median {runs[world]["median"]:.2f} s '
              f'({", ".join(f"{s:.2f}" for s in seconds)}); {note}')
    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True,
                            text=True).stdout.strip()
    out = osp.join(osp.dirname(osp.abspath(__file__)), 'results', 'heaviest_cost.json')
    with open(out, 'w') as f:
        json.dump(dict(commit=commit, images=IMAGES, dataset_built_s=built, runs=runs), f, indent=1)
    print(f'written {out}')


if __name__ == '__main__':
    main()
