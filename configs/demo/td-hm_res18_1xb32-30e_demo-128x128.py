# The demo at 128x128 input (heatmaps 32x32): activations, not the model, dominate the memory of a
# step, so the per-device batch matters. Used to show the batch finder and micro-batching on a
# CPU, e.g. (2 processes, each may use 1500 MiB, measure the largest per-device batch):
#
#   bash tools/dist_train.sh configs/demo/td-hm_res18_1xb32-30e_demo-128x128.py 2 \
#       --cfg-options scaling.global_batch_size=64 scaling.max_batch_per_device=auto \
#       scaling.memory_budget_mib=1500
_base_ = ['./td-hm_res18_1xb32-30e_demo-64x64.py']

codec = dict(type='MSRAHeatmap', input_size=(128, 128), heatmap_size=(32, 32), sigma=2)
model = dict(head=dict(decoder=codec))

train_pipeline = [
    dict(type='LoadImage'),
    dict(type='GetBBoxCenterScale'),
    dict(type='RandomFlip', direction='horizontal'),
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
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=val_pipeline))
test_dataloader = val_dataloader
