"""Write a demo dataset in COCO format (train + val splits).

Usage::

    python tools/make_demo_data.py [--task pose|det] [--out DIR] [--num-train N] \
        [--num-val N] [--size PX] [--seed S]

``--task pose`` (default): 17-keypoint stick figures, written to ``data/demo_coco``, the path
``configs/demo/`` reads. ``--task det``: three classes of coloured shapes with boxes, written to
``data/demo_det``, the path ``configs/examples/mmdet/`` reads. The same seed gives the same files.
"""
import argparse
import time

DEFAULTS = {
    'pose': dict(out='data/demo_coco', num_train=320, num_val=80),
    'det': dict(out='data/demo_det', num_train=200, num_val=50)
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--task', choices=sorted(DEFAULTS), default='pose', help='which dataset')
    p.add_argument('--out', help='output directory (default: the demo config\'s data root)')
    p.add_argument('--num-train', type=int, help='training images (pose 320, det 200)')
    p.add_argument('--num-val', type=int, help='validation images (pose 80, det 50)')
    p.add_argument('--size', type=int, default=128, help='image side in pixels')
    p.add_argument('--seed', type=int, default=0, help='random seed')
    args = p.parse_args()
    d = DEFAULTS[args.task]
    out = args.out or d['out']
    n_train = d['num_train'] if args.num_train is None else args.num_train
    n_val = d['num_val'] if args.num_val is None else args.num_val
    if args.task == 'pose':
        from mmddp_ext.demo import make_demo_dataset as make
    else:
        from mmddp_ext.demo import make_demo_det_dataset as make
    t0 = time.time()
    try:
        files = make(out, num_train=n_train, num_val=n_val, size=args.size, seed=args.seed)
    except ValueError as e:  # a bad value, named by the library: one line, exit 2
        p.error(str(e))
    print(f'wrote {n_train} train + {n_val} val {args.task} images of {args.size}x{args.size} '
          f'to {out} in {time.time() - t0:.1f} s; annotations: {files["train"]}, '
          f'{files["val"]}')


if __name__ == '__main__':
    main()
