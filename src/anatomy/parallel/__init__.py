"""Tensor and pipeline parallel inference on torch.distributed: one model across several ranks.

    layout.py, cuts.py         what each rank holds (heads, FFN columns, vocabulary rows, blocks); each tensor's slice
    shard.py, layers.py        one rank's shard: the model's own classes over its slices, the parallel modules put in
    stages.py                  pipeline stages: hidden states received and sent, the logits sent to rank 0
    launch.py, world.py        the ranks started on this machine; the process group and its groups
    collectives.py, channel.py the collectives the modules issue; rank 0's orders to the others, with a heartbeat
    driver.py, follower.py     ParallelEngine: rank 0's model calls mirrored on every other rank's shard
    ranks.py, lanes.py         a rank's engine (rank 0 drives, the others follow); pipeline-parallel serving
"""
