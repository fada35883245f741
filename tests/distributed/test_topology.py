"""Resolving a group from the settings and the environment (torchrun's variables included),
and what every rank sets before its process group starts."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from tallow.config import ParallelConfig
from tallow.distributed import launch
from tallow.distributed.env import MULTICAST_OFF, disable_nvlink_multicast
from tallow.distributed.topology import Topology, TopologyError, resolve_topology


def resolve(
    env: dict[str, str] | None = None, device: str = "cpu", gpus: int = 0, **settings
) -> Topology | None:
    return resolve_topology(
        ParallelConfig(**settings), device, environ=env or {}, cuda_devices=gpus
    )


def test_a_single_process_has_no_group() -> None:
    assert resolve() is None
    assert resolve({"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None


def test_tallow_spawns_the_ranks_of_its_node() -> None:
    t = resolve(tensor_parallel_size=4)
    assert (t.world_size, t.rank, t.local_rank, t.local_world_size) == (4, 0, 0, 4)
    assert t.spawned_ranks() == [1, 2, 3] and t.is_driver and not t.external
    assert (t.master_addr, t.master_port, t.backend, t.device()) == (
        "127.0.0.1",
        None,
        "gloo",
        "cpu",
    )
    child = t.for_rank(2)
    assert (child.rank, child.local_rank, child.spawned_ranks()) == (2, 2, [])


def test_nodes_split_the_ranks_and_meet_at_node_0() -> None:
    t = resolve(tensor_parallel_size=4, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    assert (t.rank, t.local_world_size, t.spawned_ranks(), t.master_port) == (2, 2, [3], 29500)
    assert not t.is_driver
    t = resolve(
        {"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "1234"}, tensor_parallel_size=4, nnodes=2
    )
    assert (t.rank, t.master_addr, t.master_port) == (0, "10.0.0.2", 1234)


def test_torchrun_variables_start_every_rank_on_their_own() -> None:
    env = {
        "WORLD_SIZE": "4",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29400",
        "GROUP_RANK": "1",
    }
    t = resolve(env, device="auto", gpus=2)
    assert (t.world_size, t.rank, t.local_rank, t.nnodes, t.node_rank) == (4, 3, 1, 2, 1)
    assert t.external and t.spawned_ranks() == [] and t.backend == "nccl"
    assert t.device() == "cuda:1" and (t.master_addr, t.master_port) == ("node0", 29400)
    assert resolve(env, tensor_parallel_size=4).world_size == 4  # agreeing is fine


@pytest.mark.parametrize(
    "env,settings,device,gpus,message",
    [
        (
            {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            {"tensor_parallel_size": 4},
            "cpu",
            0,
            "launcher started 2 processes",
        ),
        ({"WORLD_SIZE": "2", "RANK": "0"}, {}, "cpu", 0, "MASTER_ADDR or MASTER_PORT"),
        ({"WORLD_SIZE": "two", "RANK": "0"}, {}, "cpu", 0, "$WORLD_SIZE is 'two'"),
        (
            {},
            {"tensor_parallel_size": 3, "nnodes": 2},
            "cpu",
            0,
            "not divisible by parallel.nnodes",
        ),
        (
            {},
            {"tensor_parallel_size": 4, "nnodes": 2, "node_rank": 2},
            "cpu",
            0,
            "node_rank 2 is out of range",
        ),
        ({}, {"nnodes": 2}, "cpu", 0, "tensor_parallel_size is 1"),
        ({}, {"tensor_parallel_size": 2}, "cuda:1", 1, "each rank takes the GPU of its local rank"),
        ({}, {"tensor_parallel_size": 4}, "auto", 2, "need as many GPUs; it has 2"),
        (
            {},
            {"tensor_parallel_size": 2, "distributed_backend": "nccl"},
            "cpu",
            0,
            "'nccl' needs CUDA devices",
        ),
    ],
)
def test_groups_that_cannot_run_are_refused_clearly(env, settings, device, gpus, message) -> None:
    with pytest.raises(TopologyError, match=message.replace("$", r"\$").replace("(", r"\(")):
        resolve(env, device=device, gpus=gpus, **settings)


def test_nvlink_multicast_is_switched_off() -> None:
    env = {"NCCL_NVLS_ENABLE": "1"}
    disable_nvlink_multicast(env)
    assert env == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


def test_multicast_is_off_before_the_process_group_starts(monkeypatch) -> None:
    for name in MULTICAST_OFF:
        monkeypatch.delenv(name, raising=False)
    seen: dict[str, str | None] = {}

    class Stop(Exception):
        pass

    def init_process_group(*args, **kwargs):
        seen.update({name: os.environ.get(name) for name in MULTICAST_OFF})
        raise Stop

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    topology = Topology(1, 0, 0, 1, 1, 0, "127.0.0.1", None, False, "cpu", "gloo")
    with pytest.raises(Stop):
        launch._start(
            topology, collective_timeout_s=10, heartbeat_timeout_s=10, log_level="WARNING"
        )
    assert seen == MULTICAST_OFF


def test_parallel_settings_are_keywords_flags_and_variables() -> None:
    from tallow.config import load_config

    config = load_config(
        env={"TALLOW_PARALLEL__NNODES": "2"},
        keywords={"tensor_parallel_size": 4, "master_port": 1234},
        caller="test",
    )
    assert (
        config.parallel.tensor_parallel_size,
        config.parallel.nnodes,
        config.parallel.master_port,
    ) == (4, 2, 1234)
