"""Small generated datasets for the demo configs and the tests (not imported by the package).

:mod:`.pose` writes COCO keypoints (17 joints of a drawn figure), :mod:`.det` COCO boxes of
three coloured shapes. They draw with OpenCV (``cv2``, from ``opencv-python``, which the
OpenMMLab stack installs; declared in ``requirements/demo.txt``)::

    python tools/make_demo_data.py [--task pose|det]
"""
from .det import CLASSES, make_demo_det_dataset
from .pose import KEYPOINT_NAMES, make_demo_dataset

__all__ = ['CLASSES', 'KEYPOINT_NAMES', 'make_demo_dataset', 'make_demo_det_dataset']
