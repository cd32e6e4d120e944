"""A test-only script: what an MMPose user does with a trained checkpoint, in a process that never
imports mmddp_ext (a colleague's environment, a model zoo's): MMEngine's ``load_checkpoint``,
MMPose's ``init_model`` + ``inference_topdown`` + its visualizer, and ``MMPoseInferencer``
writing a visualized image. Prints one JSON line (``report …``) of what it saw, for the test to
compare with the dataset's own metainfo.

    python tests/helpers/stock_pose_reader.py CONFIG CHECKPOINT IMAGE OUT_DIR
"""
import json
import os
import os.path as osp
import sys


def _kind(value) -> str:
    """A value's type, and for an array its dtype and shape."""
    import numpy as np
    if isinstance(value, np.ndarray):
        return f'ndarray {value.dtype} {list(value.shape)}'
    return type(value).__name__


def _plain(value):
    """A JSON form of a metainfo value (arrays as lists)."""
    import numpy as np
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def main(config: str, checkpoint: str, image: str, out_dir: str) -> None:
    import mmcv
    import torch
    from mmengine.runner import load_checkpoint
    from mmpose.apis import MMPoseInferencer, inference_topdown, init_model
    from mmpose.registry import VISUALIZERS
    from mmpose.structures import merge_data_samples

    report = {}
    model = init_model(config, checkpoint, device='cpu')
    meta = model.dataset_meta
    report['dataset_meta_kinds'] = {key: _kind(value) for key, value in meta.items()}
    report['dataset_meta'] = _plain(meta)
    stored = torch.load(checkpoint, map_location='cpu')  # torch's default: weights_only=True
    report['state_dict_equal'] = sorted(stored['state_dict']) == sorted(model.state_dict()) and all(
        torch.equal(stored['state_dict'][key], value) for key, value in model.state_dict().items())
    report['load_checkpoint_meta_keys'] = sorted(
        load_checkpoint(model, checkpoint, map_location='cpu').get('meta', {}))

    results = inference_topdown(model, image)  # the whole image as the box
    visualizer = VISUALIZERS.build(model.cfg.visualizer)
    visualizer.set_dataset_meta(model.dataset_meta)
    drawn = osp.join(out_dir, 'init_model_vis.jpg')
    visualizer.add_datasample('result', mmcv.imread(image, channel_order='rgb'),
                              data_sample=merge_data_samples(results), draw_gt=False, show=False,
                              out_file=drawn)
    report['keypoints_shape'] = list(results[0].pred_instances.keypoints.shape)

    inferencer = MMPoseInferencer(pose2d=config, pose2d_weights=checkpoint, device='cpu',
                                  det_model='whole_image')
    inferred = next(inferencer(image, vis_out_dir=osp.join(out_dir, 'inferencer'), show=False))
    report['inferencer_people'] = len(inferred['predictions'][0])
    report['written'] = {
        osp.relpath(osp.join(root, name), out_dir): osp.getsize(osp.join(root, name))
        for root, _, files in os.walk(out_dir)
        for name in files
    }
    report['mmddp_ext_imported'] = any(name.split('.')[0] == 'mmddp_ext' for name in sys.modules)
    print('report', json.dumps(report), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:5])
