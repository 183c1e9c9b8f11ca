"""PyTorch integration: sparse layers whose tables live in the daemons (Embedding,
EmbeddingBag, SampledSoftmax) and the dense DDP-style wrapper."""

from .session import default_client, set_default_client
from .sparse import (Embedding, EmbeddingBag, LogUniformSampler, SampledSoftmax,
                     sampled_softmax_loss)

__all__ = ["default_client", "set_default_client", "Embedding", "EmbeddingBag",
           "LogUniformSampler", "SampledSoftmax", "sampled_softmax_loss"]
