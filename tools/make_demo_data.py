"""Write the demo dataset: COCO-format 17-keypoint stick figures (train + val splits).

Usage::

    python tools/make_demo_data.py [--out data/demo_coco] [--num-train 320] [--num-val 80] \
        [--size 128] [--seed 0]

With no arguments it writes to ``data/demo_coco``, the path the demo config reads.
The same seed gives the same files.
"""
import argparse
import time

from mmddp_ext.demo_data import make_demo_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', default='data/demo_coco', help='output directory')
    p.add_argument('--num-train', type=int, default=320, help='training images')
    p.add_argument('--num-val', type=int, default=80, help='validation images')
    p.add_argument('--size', type=int, default=128, help='image side in pixels')
    p.add_argument('--seed', type=int, default=0, help='random seed (val uses seed + 1)')
    args = p.parse_args()
    t0 = time.time()
    files = make_demo_dataset(args.out, args.num_train, args.num_val, args.size, args.seed)
    print(f'wrote {args.num_train} train + {args.num_val} val images of {args.size}x{args.size} '
          f'to {args.out} in {time.time() - t0:.1f} s; annotations: {files["train"]}, '
          f'{files["val"]}')


if __name__ == '__main__':
    main()
