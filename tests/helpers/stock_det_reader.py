"""A test-only script: what an MMDetection user does with a trained checkpoint, in a process that
never imports mmddp_ext: ``init_detector`` + ``inference_detector`` and ``DetInferencer``
writing a visualized image. Prints one JSON line (``report …``).

    python tests/helpers/stock_det_reader.py CONFIG CHECKPOINT IMAGE OUT_DIR
"""
import json
import os
import os.path as osp
import sys


def main(config: str, checkpoint: str, image: str, out_dir: str) -> None:
    import torch
    from mmdet.apis import DetInferencer, inference_detector, init_detector

    report = {}
    model = init_detector(config, checkpoint, device='cpu')
    report['dataset_meta'] = {
        key: [list(v) if isinstance(v, tuple) else v for v in value]
        for key, value in model.dataset_meta.items()
    }
    report['dataset_meta_kinds'] = {k: type(v).__name__ for k, v in model.dataset_meta.items()}
    stored = torch.load(checkpoint, map_location='cpu')  # torch's default: weights_only=True
    report['state_dict_equal'] = sorted(stored['state_dict']) == sorted(model.state_dict()) and all(
        torch.equal(stored['state_dict'][key], value) for key, value in model.state_dict().items())
    report['predicted_boxes'] = len(inference_detector(model, image).pred_instances)
    inferencer = DetInferencer(model=config, weights=checkpoint, device='cpu', show_progress=False)
    inferencer(image, out_dir=out_dir, no_save_pred=False)
    report['written'] = {
        osp.relpath(osp.join(root, name), out_dir): osp.getsize(osp.join(root, name))
        for root, _, files in os.walk(out_dir)
        for name in files
    }
    report['mmddp_ext_imported'] = any(name.split('.')[0] == 'mmddp_ext' for name in sys.modules)
    print('report', json.dumps(report), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:5])
