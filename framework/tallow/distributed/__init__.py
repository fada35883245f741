"""Tensor parallelism over torch.distributed: process groups, workers, multi-node rendezvous.

- :mod:`.topology`: which ranks, hosts and devices the settings and the environment describe;
- :mod:`.launch`: start (spawn) or join (torchrun) the group, end it;
- :mod:`.state`: the group of this process (rank, size, groups), read by the model loader;
- :mod:`.collectives`: the all-reduce and all-gather of the sharded layers;
- :mod:`.step_message`: the step description the driver broadcasts to its workers;
- :mod:`.driver` (the driver side of a step; the workers run :mod:`tallow.engine.worker`);
- :mod:`.watchdog`: heartbeats, dead ranks, orphan-free exits;
- :mod:`.env`: NVLink multicast off, CPU cores shared between ranks.

See docs/tensor-parallel.md.
"""
