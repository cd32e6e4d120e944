# Example: MMDetection's RetinaNet (inherited from the installed mmdet package), shrunk to a
# from-scratch ResNet-18 at 128x128, 1 device x batch 4 (`1xb4`, also the LR's reference batch),
# trained on a CPU in minutes on mmddp_ext.demo.det's 3-class coloured shapes (COCO bbox mAP).
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']

custom_imports = dict(imports=['mmddp_ext'], allow_failed_imports=False)
# The global batch stays 4 (auto_scale_lr.base_batch_size) on any number of processes:
# `bash tools/dist_train.sh <this config> 2` trains 2 per process (MMDetection's own train.py
# honours runner_type too).
runner_type = 'DDPRunner'

# data: python tools/make_demo_data.py --task det
data_root = 'data/demo_det/'
classes = ('square', 'circle', 'triangle')  # == mmddp_ext.demo.det.CLASSES, ids 1..3
metainfo = dict(classes=classes)
img_scale = (128, 128)

model = dict(
    backbone=dict(
        depth=18,
        frozen_stages=-1,  # from scratch: nothing to freeze, and BN must learn its statistics
        norm_eval=False,
        init_cfg=None),  # no pretrained download
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=128),
    bbox_head=dict(
        num_classes=len(classes),
        in_channels=128,
        feat_channels=128,
        stacked_convs=2,  # the 4x256 head would cost more than the backbone at this size
        # anchors 16..400 px (stride 8..128) instead of 32..800: the shapes are 19..51 px
        anchor_generator=dict(octave_base_scale=2)),
    test_cfg=dict(nms_pre=200, score_thr=0.05, nms=dict(type='nms', iou_threshold=0.5),
                  max_per_img=20))  # at most 4 objects per image

train_cfg = dict(max_epochs=12, val_interval=3)
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-3, weight_decay=1e-4),
    clip_grad=dict(max_norm=10, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', begin=0, end=20, start_factor=0.01, by_epoch=False),  # warm-up
    dict(type='MultiStepLR', begin=0, end=12, milestones=[8, 11], gamma=0.1, by_epoch=True),
]
auto_scale_lr = dict(enable=False, base_batch_size=4)

default_hooks = dict(
    logger=dict(interval=10), checkpoint=dict(interval=3, max_keep_ckpts=2,
                                              save_best='coco/bbox_mAP', rule='greater'))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]

train_dataloader = dict(
    batch_size=4, num_workers=2,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/train.json',
                 data_prefix=dict(img='train/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=2,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader

val_evaluator = dict(type='CocoMetric', ann_file=data_root + 'annotations/val.json', metric='bbox')
test_evaluator = val_evaluator
