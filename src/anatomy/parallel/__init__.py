"""Tensor and pipeline parallel inference on torch.distributed: one model across several ranks.

    layout.py       which heads, kv heads, FFN columns, vocabulary rows and blocks each rank holds; the checks
    cuts.py         the slice of each tensor a tensor-parallel rank keeps (dense or int4/int8 groups)
    shard.py        one rank's shard: the model's own classes over its slices, the parallel modules put in
    layers.py       row-parallel linears, the reduced mixture, the vocabulary-parallel table and head
    stages.py       pipeline stages: hidden states received and sent, the logits sent to rank 0
    collectives.py  the collectives those modules issue (torch.distributed's), recorded on request
    world.py        joining the process group torchrun or the launcher set up; the groups
    channel.py      rank 0's orders to the other ranks (which engine call next), with a heartbeat
    driver.py       ParallelEngine: rank 0's DecoderEngine, its model calls mirrored on every rank
    follower.py     the other ranks: the same calls on their own shards' engines
    ranks.py        a rank's engine: rank 0 drives, the others follow
"""
