"""DDP that survives torchrun's restarts: each start of the workers gets process-group keys of its own."""

import os
from typing import Any

import torch.distributed as dist
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.constants import default_pg_timeout


class ElasticDDPStrategy(DDPStrategy):
    """``DDPStrategy`` for ``torchrun --max-restarts N`` (``configs/elastic.yaml``); the same arguments.

    torchrun restarts all workers of a job when one dies, and the new workers meet in the store the agent keeps
    for the whole job. torch 2.14 gives them no key prefix of their own there: they read the addresses the dead
    workers published, and the new process group fails to connect (gloo) or hangs (measured; NCCL exchanges its
    id through the same keys). Here each start of the workers uses its own prefix: global rank r counts its starts
    in the store, and as torchrun always restarts every worker together, all ranks count the same.
    """

    def setup_distributed(self) -> None:
        if "TORCHELASTIC_RESTART_COUNT" not in os.environ:  # not under torchrun: plain DDP
            return super().setup_distributed()
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._get_process_group_backend()
        env = self.cluster_environment
        assert env is not None
        # The agent serves the store at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE); otherwise rank 0
        # hosts a fresh one for each start.
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(
            env.main_address,
            env.main_port,
            env.world_size(),
            is_master=not agent_store and env.global_rank() == 0,
            timeout=self._timeout or default_pg_timeout,
        )
        start = store.add(f"project/elastic/starts/rank{env.global_rank()}", 1)
        kwargs: dict[str, Any] = {
            "timeout": self._timeout,
            "store": dist.PrefixStore(f"project/elastic/start{start}/", store),
            "device_id": self.root_device if self.root_device.type != "cpu" else None,
        }
        _init_dist_connection(env, self._process_group_backend, **kwargs)
