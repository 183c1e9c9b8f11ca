"""PyTorch integration: parallax.torch.

parallelize(model, optimizer) (parallelize.py) turns an unmodified single-process model
into one every worker trains: its embeddings become the sparse layers below, the rest
goes through the DDP engine.

Dense (ddp.py): DistributedDataParallel, DistributedOptimizer, broadcast_parameters,
broadcast_optimizer_state. Sparse (sparse.py): Embedding, EmbeddingBag, SampledSoftmax,
whose tables live in the daemons; collections (collection.py): EmbeddingBagCollection and
EmbeddingCollection in TorchRec's shape, all their tables in one step. Pipeline (pipeline.py): TrainPipeline, the data loader
one batch ahead and its sparse rows prefetched during backward. client() is the process's
default parallax.Client. Importing it registers torch.distributed's "parallax" backend
(backend.py).
"""

from .ddp import (BucketInfo, Compression, DistributedDataParallel,  # noqa: F401
                  DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters, client)
from .backend import register as _register_backend
from .collection import (EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection,
                         EmbeddingConfig, JaggedTensor, KeyedJaggedTensor, KeyedTensor)
from .parallelize import ParallelPlan, parallelize, plan
from .pipeline import TrainPipeline
from .session import default_client, set_default_client
from .sparse import (Embedding, EmbeddingBag, LogUniformSampler, SampledSoftmax,
                     sampled_softmax_loss)

__all__ = ["BucketInfo", "Compression", "DistributedDataParallel", "DistributedOptimizer",
           "broadcast_optimizer_state", "broadcast_parameters", "client", "default_client",
           "set_default_client", "Embedding", "EmbeddingBag", "LogUniformSampler",
           "SampledSoftmax", "sampled_softmax_loss", "TrainPipeline", "parallelize",
           "ParallelPlan", "plan", "EmbeddingBagCollection", "EmbeddingBagConfig",
           "EmbeddingCollection", "EmbeddingConfig", "JaggedTensor", "KeyedJaggedTensor",
           "KeyedTensor"]

_register_backend()
