# Demo: MMPose's top-down heatmap recipe (inherited from the installed mmpose package), shrunk to
# ResNet-18 at 64x64 so it trains on a CPU in minutes, on the stick-figure data written by
# `python tools/make_demo_data.py` (COCO format, 17 keypoints, CocoMetric validation).
# `1xb32`: written for 1 device x batch 32, which is also the LR's reference batch below.
_base_ = ['mmpose::body_2d_keypoint/topdown_heatmap/coco/td-hm_res50_8xb64-210e_coco-256x192.py']

custom_imports = dict(imports=['mmddp_ext'], allow_failed_imports=False)
# DDPRunner plans batch, LR and schedule for the number of processes: with the reference batch
# below (auto_scale_lr.base_batch_size=32) the global batch stays 32 on 1, 2 or 4 processes.
runner_type = 'DDPRunner'

data_root = 'data/demo_coco/'

train_cfg = dict(max_epochs=30, val_interval=10)
optim_wrapper = dict(optimizer=dict(type='Adam', lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', begin=0, end=50, start_factor=0.01, by_epoch=False),  # warm-up
    dict(type='MultiStepLR', begin=0, end=30, milestones=[22, 27], gamma=0.1, by_epoch=True),
]
auto_scale_lr = dict(base_batch_size=32)

default_hooks = dict(
    logger=dict(interval=5), checkpoint=dict(interval=10, max_keep_ckpts=2, save_best='coco/AP',
                                             rule='greater'))

codec = dict(type='MSRAHeatmap', input_size=(64, 64), heatmap_size=(16, 16), sigma=1)

model = dict(
    backbone=dict(depth=18, init_cfg=None),  # no pretrained download: trains from scratch
    head=dict(in_channels=512, decoder=codec))

train_pipeline = [
    dict(type='LoadImage'),
    dict(type='GetBBoxCenterScale'),
    dict(type='RandomFlip', direction='horizontal'),
    dict(type='RandomHalfBody'),
    dict(type='RandomBBoxTransform'),
    dict(type='TopdownAffine', input_size=codec['input_size']),
    dict(type='GenerateTarget', encoder=codec),
    dict(type='PackPoseInputs'),
]
val_pipeline = [
    dict(type='LoadImage'),
    dict(type='GetBBoxCenterScale'),
    dict(type='TopdownAffine', input_size=codec['input_size']),
    dict(type='PackPoseInputs'),
]

train_dataloader = dict(
    batch_size=32, num_workers=2,
    dataset=dict(data_root=data_root, ann_file='annotations/train.json',
                 data_prefix=dict(img='train/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=32,
    num_workers=2,
    dataset=dict(
        data_root=data_root,
        ann_file='annotations/val.json',
        bbox_file=None,  # ground-truth boxes
        data_prefix=dict(img='val/'),
        pipeline=val_pipeline))
test_dataloader = val_dataloader

val_evaluator = dict(type='CocoMetric', ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator
