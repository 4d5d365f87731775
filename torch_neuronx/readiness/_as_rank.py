"""A process as one rank of a torchrun job: the rank's environment, and the job's store."""

from __future__ import annotations


def rank_env(rank: int, nproc: int, world: int, port: int) -> dict:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % nproc),
        "GROUP_RANK": str(rank // nproc),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        # The ranks join this process's store as torchrun's workers join its agent's, so no
        # rank has to host it (they start at different times).
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RUN_ID": "dry-run",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


class AsRank:
    """This process as rank `rank` of a job of `world` ranks, for a dry run in process: the
    rank's torchrun environment (``init_process_group("neuron")`` then gives the real rank
    and world size, so DeviceMesh coordinates are the real ones) and the job's store hosted
    here. Nothing waits for the other ranks, which are not run. On exit the process group
    made inside (a fake one) is destroyed and the environment restored."""

    def __init__(self, rank: int, world: int, nproc_per_node: int | None = None):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a job of world size {world} (ranks 0-{world - 1})")
        self.rank, self.world, self.nproc = rank, world, nproc_per_node
        self._store = None
        self._prev = None

    def __enter__(self) -> "AsRank":
        import torch
        import torch.distributed as dist

        from neuronsim import settings as _settings

        if dist.is_initialized():
            raise RuntimeError("a process group already exists in this process; dry-run as another rank before it")
        nproc = self.nproc or min(self.world, torch.neuron.device_count())
        self._store = dist.TCPStore("127.0.0.1", 0, self.world, is_master=True, wait_for_workers=False)
        self._prev = _settings.set_rank_environment(rank_env(self.rank, nproc, self.world, self._store.port))
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        from neuronsim import settings as _settings

        if dist.is_initialized():
            dist.destroy_process_group()  # a fake group: no real run may use it
        _settings.set_rank_environment(self._prev)
        self._store = None
