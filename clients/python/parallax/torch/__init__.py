"""PyTorch integration: parallax.torch.

Dense (ddp.py): DistributedDataParallel, DistributedOptimizer, broadcast_parameters,
broadcast_optimizer_state, and client() (the process's default parallax.Client).
"""

from .ddp import (BucketInfo, DistributedDataParallel, DistributedOptimizer,  # noqa: F401
                  broadcast_optimizer_state, broadcast_parameters, client)
