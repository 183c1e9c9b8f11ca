"""TorchRec-shaped collections of tables in the daemons: EmbeddingBagCollection and
EmbeddingCollection, configured by table (name, dim, rows, features, pooling) and fed keyed
jagged features.

Every table of one width is a table of one parallax.SparseGroup (px_register_sparse_group):
the daemons hold them as one variable, their rows one after another, so a training forward
pulls the rows of all of its features in one pull step and the backward pushes their
gradients in one push step, whatever the number of tables and features, as TorchRec's
sharded collections send all tables' rows in one all-to-all. Tables of other widths are
other groups (FBGEMM groups tables by dimension the same way): a step per width.

A group is looked up as the sparse layers' tables are (sparse.py: a forward without backward,
a table looked up more than once a step, prefetch, CUDA features), the features of all its
tables translated to the group's rows first. The input is TorchRec's KeyedJaggedTensor where
torchrec is importable, or this module's KeyedJaggedTensor (the same constructor and
accessors) where it is not; the output is a KeyedTensor (EmbeddingBagCollection) or a dict
of JaggedTensor by feature (EmbeddingCollection), torchrec's when importable. state_dict()
has TorchRec's keys: embedding_bags.TABLE.weight and embeddings.TABLE.weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import parallax

from .session import default_client
from .sparse import _SparseModule, _Table


def _lengths(lengths: Optional[torch.Tensor], offsets: Optional[torch.Tensor],
             what: str) -> torch.Tensor:
    """The lengths given, or those of the offsets given."""
    if lengths is not None:
        return lengths
    if offsets is None:
        raise parallax.InvalidArgument(1, f"{what}: lengths or offsets needed")
    return offsets[1:] - offsets[:-1]


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Where each run of lengths starts, and the end (len(lengths) + 1 values)."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


class _Jagged:
    """Values in runs of given lengths, with optional per-value weights: what JaggedTensor
    and KeyedJaggedTensor share."""

    def __init__(self, values: torch.Tensor, weights: Optional[torch.Tensor],
                 lengths: Optional[torch.Tensor], offsets: Optional[torch.Tensor], what: str):
        self._values, self._weights = values, weights
        self._lengths = _lengths(lengths, offsets, what)

    def values(self) -> torch.Tensor:
        """The values, one run after another."""
        return self._values

    def lengths(self) -> torch.Tensor:
        """How many values each run has (KeyedJaggedTensor: key-major, keys x stride())."""
        return self._lengths

    def offsets(self) -> torch.Tensor:
        """Where each run's values start, and the end (one more than the lengths)."""
        return _offsets(self._lengths)

    def weights_or_none(self) -> Optional[torch.Tensor]:
        """The per-value weights, or None."""
        return self._weights


class JaggedTensor(_Jagged):
    """Values of one feature in variable-length rows (TorchRec's JaggedTensor, in small):
    values(), lengths() (one per example), offsets(), weights_or_none()."""

    def __init__(self, values: torch.Tensor, weights: Optional[torch.Tensor] = None,
                 lengths: Optional[torch.Tensor] = None,
                 offsets: Optional[torch.Tensor] = None):
        super().__init__(values, weights, lengths, offsets, "JaggedTensor")


class KeyedJaggedTensor(_Jagged):
    """Jagged features by key (TorchRec's KeyedJaggedTensor, in small): values of every key
    one after another, lengths key-major (len(keys) x batch), optional per-value weights."""

    def __init__(self, keys: Sequence[str], values: torch.Tensor,
                 weights: Optional[torch.Tensor] = None,
                 lengths: Optional[torch.Tensor] = None,
                 offsets: Optional[torch.Tensor] = None, stride: Optional[int] = None):
        self._keys = list(keys)
        super().__init__(values, weights, lengths, offsets, "KeyedJaggedTensor")
        lengths = self._lengths
        if stride is None:
            stride = lengths.numel() // max(1, len(self._keys))
        self._stride = int(stride)
        if lengths.numel() != self._stride * len(self._keys):
            raise parallax.InvalidArgument(
                1, f"KeyedJaggedTensor: {lengths.numel()} lengths for {len(self._keys)} keys "
                   f"of batch {self._stride}")
        if int(lengths.sum()) != values.numel():
            raise parallax.InvalidArgument(
                1, f"KeyedJaggedTensor: the lengths sum to {int(lengths.sum())}, "
                   f"for {values.numel()} values")

    @classmethod
    def from_lengths_sync(cls, keys: Sequence[str], values: torch.Tensor,
                          lengths: torch.Tensor,
                          weights: Optional[torch.Tensor] = None) -> "KeyedJaggedTensor":
        """TorchRec's constructor: keys, values, lengths (key-major), weights."""
        return cls(keys, values, weights=weights, lengths=lengths)

    def keys(self) -> List[str]:
        """The feature names, in the values' order."""
        return self._keys

    def stride(self) -> int:
        """The batch size."""
        return self._stride

    def to_dict(self) -> Dict[str, JaggedTensor]:
        """{key: JaggedTensor} of each feature."""
        out, at = {}, 0
        lengths = self._lengths.reshape(len(self._keys), self._stride)
        for k, key in enumerate(self._keys):
            n = int(lengths[k].sum())
            w = None if self._weights is None else self._weights[at:at + n]
            out[key] = JaggedTensor(self._values[at:at + n], w, lengths[k])
            at += n
        return out

    def __getitem__(self, key: str) -> JaggedTensor:
        return self.to_dict()[key]


class KeyedTensor:
    """Pooled features by key (TorchRec's KeyedTensor, in small): values() is batch x
    sum(length_per_key()), the keys' columns one after another."""

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int],
                 values: torch.Tensor, key_dim: int = 1):
        self._keys, self._lengths, self._values = list(keys), list(length_per_key), values
        self._key_dim = key_dim

    def keys(self) -> List[str]:
        """The feature names, in the columns' order."""
        return self._keys

    def values(self) -> torch.Tensor:
        """batch x sum(length_per_key()) values."""
        return self._values

    def length_per_key(self) -> List[int]:
        """Each key's width."""
        return self._lengths

    def key_dim(self) -> int:
        """The dimension the keys are laid along (1)."""
        return self._key_dim

    def to_dict(self) -> Dict[str, torch.Tensor]:
        """{key: its batch x width columns}."""
        return dict(zip(self._keys, torch.split(self._values, self._lengths,
                                                dim=self._key_dim)))

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.to_dict()[key]


try:  # TorchRec's own types where it is installed (not a Debian package)
    from torchrec.sparse.jagged_tensor import JaggedTensor as _OutJagged  # type: ignore
    from torchrec.sparse.jagged_tensor import KeyedTensor as _OutKeyed  # type: ignore
except ImportError:
    _OutJagged, _OutKeyed = JaggedTensor, KeyedTensor


@dataclass
class EmbeddingBagConfig:
    """A table of an EmbeddingBagCollection (TorchRec's EmbeddingBagConfig): its rows
    (num_embeddings), width, name, the features looked up in it and how a bag is pooled
    ("sum" or "mean"; TorchRec's PoolingType too)."""
    num_embeddings: int
    embedding_dim: int
    name: str
    feature_names: List[str] = field(default_factory=list)
    pooling: Any = "sum"


@dataclass
class EmbeddingConfig:
    """A table of an EmbeddingCollection (TorchRec's EmbeddingConfig)."""
    num_embeddings: int
    embedding_dim: int
    name: str
    feature_names: List[str] = field(default_factory=list)


def _pooling(config: Any) -> str:
    pooling = getattr(config, "pooling", "sum")
    mode = str(getattr(pooling, "name", pooling)).lower()
    if mode not in ("sum", "mean"):
        raise parallax.InvalidArgument(1, f"table '{config.name}': pooling {pooling} (sum or "
                                          "mean)")
    return mode


class _GroupLookup(_SparseModule):
    """The lookups of one group: _SparseModule's step machinery over the group's rows. Its
    state is saved by the collection's per-table entries, not here."""

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        nn.Module._save_to_state_dict(self, destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        nn.Module._load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                                        missing_keys, unexpected_keys, error_msgs)


class _TableEntry(nn.Module):
    """One table's place in state_dict (PREFIX.weight: its rows of the group), as TorchRec's
    collections have one module per table."""

    def __init__(self, table: _Table, name: str, offset: int, rows: int):
        super().__init__()
        self._group_table, self.name = table, name
        self.offset, self.num_embeddings = offset, rows

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self._group_table.read_all(self.offset,
                                                                    self.num_embeddings)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "weight"
        if key in state_dict:
            self._group_table.load_all(state_dict[key], self.offset, self.num_embeddings,
                                       what=f"{self._group_table.var.name}' table '{self.name}")
        elif strict:
            missing_keys.append(key)


class _Collection(nn.Module):
    """What both collections share: the groups, the features' places in them, one lookup
    per group per forward."""

    _entries_name = "embeddings"

    def __init__(self, tables: Sequence[Any], name: str, client: Optional[parallax.Client],
                 options: dict):
        super().__init__()
        if not tables:
            raise parallax.InvalidArgument(1, f"collection '{name}': no tables")
        self.collection_name = name
        client = client or default_client()
        self._configs = list(tables)
        names = [t.name for t in self._configs]
        if len(set(names)) != len(names):
            raise parallax.InvalidArgument(1, f"collection '{name}': table names repeat: "
                                              f"{names}")
        # feature -> (config, group dim); each feature in one table.
        self._feature_table: Dict[str, Any] = {}
        for t in self._configs:
            features = list(t.feature_names) or [t.name]
            for f in features:
                if f in self._feature_table:
                    raise parallax.InvalidArgument(
                        1, f"collection '{name}': feature '{f}' is in tables "
                           f"'{self._feature_table[f].name}' and '{t.name}'")
                self._feature_table[f] = t
        self._features = [f for t in self._configs for f in (list(t.feature_names) or [t.name])]
        dims = sorted({int(t.embedding_dim) for t in self._configs})
        self._groups = nn.ModuleDict()
        self._offset: Dict[str, int] = {}
        entries = nn.ModuleDict()
        for dim in dims:
            members = [t for t in self._configs if int(t.embedding_dim) == dim]
            group_name = name if len(dims) == 1 else f"{name}.dim{dim}"
            layout = [(t.name, int(t.num_embeddings)) for t in members]

            def register(var_name, rows, width, layout=layout, **opts):
                return client.sparse_group(var_name, layout, width, **opts)

            table = _Table(client, group_name, sum(r for _, r in layout), dim, dict(options),
                           register=register)
            self._groups[str(dim)] = _GroupLookup(table.rows, dim, group_name, client,
                                                  {"_table": table})
            for t in members:
                self._offset[t.name] = table.var.tables[t.name].offset
                entries[t.name] = _TableEntry(table, t.name, self._offset[t.name],
                                              int(t.num_embeddings))
        setattr(self, self._entries_name, entries)

    def _group_indices(self, features: Any):
        """{dim: (group rows of every feature of the group, [(feature, its slice, its
        lengths, its weights)])} from the keyed jagged features."""
        keys = list(features.keys())
        missing = [f for f in self._features if f not in keys]
        if missing:
            raise parallax.InvalidArgument(
                1, f"collection '{self.collection_name}': the features lack "
                   f"{', '.join(missing)}")
        batch = features.stride()
        values = features.values()
        if values.dtype.is_floating_point:
            raise parallax.InvalidArgument(1, f"collection '{self.collection_name}': feature "
                                              f"values must be integers, not {values.dtype}")
        lengths = features.lengths().reshape(len(keys), batch)
        weights = features.weights_or_none()
        starts = torch.cumsum(lengths.sum(1), 0).tolist()
        starts = [0] + starts[:-1]
        parts: Dict[int, list] = {}
        for f in self._features:
            k = keys.index(f)
            n = int(lengths[k].sum())
            t = self._feature_table[f]
            ids = values[starts[k]:starts[k] + n].to(torch.int64)
            if n and (int(ids.min()) < 0 or int(ids.max()) >= int(t.num_embeddings)):
                bad = ids[(ids < 0) | (ids >= int(t.num_embeddings))][0]
                raise parallax.RowIndexError(
                    11, f"collection '{self.collection_name}': feature '{f}' has id "
                        f"{int(bad)}, outside table '{t.name}' ({t.num_embeddings} rows)")
            w = None if weights is None else weights[starts[k]:starts[k] + n]
            parts.setdefault(int(t.embedding_dim), []).append(
                (f, ids + self._offset[t.name], lengths[k], w))
        out = {}
        for dim, items in parts.items():
            rows = torch.cat([ids for _, ids, _, _ in items])
            sliced, at = [], 0
            for f, ids, lens, w in items:
                sliced.append((f, slice(at, at + ids.numel()), lens, w))
                at += ids.numel()
            out[dim] = (rows, sliced)
        return out

    def _lookups(self, features: Any):
        """[(feature, its ids' rows among the group's unique rows (inverse), the rows leaf,
        lengths, weights)], one pull (or read) per group."""
        out = {}
        for dim, (rows, sliced) in self._group_indices(features).items():
            leaf, inverse, _ = self._groups[str(dim)]._rows(rows)
            for f, part, lens, w in sliced:
                out[f] = (inverse[part], leaf, lens, w)
        return out

    def prefetch(self, features: Any) -> None:
        """The next training forward's rows, one prefetch per group (the tables need
        prefetch=True): call it after this step's forward, before its backward."""
        for dim, (rows, _) in self._group_indices(features).items():
            self._groups[str(dim)].prefetch(rows)

    def synchronize(self) -> None:
        """Waits for the pushes this worker has in flight."""
        for group in self._groups.values():
            group.synchronize()

    @property
    def lr(self) -> float:
        return next(iter(self._groups.values())).lr

    @lr.setter
    def lr(self, rate: float) -> None:
        for group in self._groups.values():
            group.lr = rate

    @property
    def variables(self) -> List[parallax.SparseGroup]:
        """The collection's groups, one per table width."""
        return [g.variable for g in self._groups.values()]


class EmbeddingBagCollection(_Collection):
    """TorchRec's EmbeddingBagCollection over tables in the daemons: tables is a list of
    EmbeddingBagConfig (or TorchRec's), forward(KeyedJaggedTensor) -> KeyedTensor of the
    pooled features in the tables' order (each table's features in order), every feature
    embedding_dim wide. is_weighted: the features' weights multiply their ids' rows (sum
    pooling). The tables' optimizer and options are pxt.Embedding's, shared by every table
    (defaults: adagrad, lr 0.1, mean aggregation, normal(1) initial values)."""

    _entries_name = "embedding_bags"

    def __init__(self, tables: Sequence[Any], *, name: str = "ebc",
                 client: Optional[parallax.Client] = None, is_weighted: bool = False,
                 optimizer: str = "adagrad", lr: float = 0.1, aggregation: str = "mean",
                 initializer: str = "normal", init_std: float = 1.0, **options: Any):
        options.update(optimizer=optimizer, lr=lr, aggregation=aggregation,
                       initializer=initializer, init_std=init_std)
        super().__init__(tables, name, client, options)
        self.is_weighted = is_weighted
        self._modes = {t.name: _pooling(t) for t in self._configs}

    def forward(self, features: Any) -> Any:
        looked = self._lookups(features)
        pooled, dims = [], []
        for f in self._features:
            t = self._feature_table[f]
            inverse, rows, lens, w = looked[f]
            offsets = _offsets(lens)[:-1].to(inverse.device, torch.int64)
            pooled.append(F.embedding_bag(inverse, rows, offsets, mode=self._modes[t.name],
                                          per_sample_weights=w if self.is_weighted else None))
            dims.append(int(t.embedding_dim))
        return _OutKeyed(keys=list(self._features), length_per_key=dims,
                         values=torch.cat(pooled, dim=1))


class EmbeddingCollection(_Collection):
    """TorchRec's EmbeddingCollection over tables in the daemons: tables is a list of
    EmbeddingConfig, forward(KeyedJaggedTensor) -> {feature: JaggedTensor} of every id's
    row, unpooled. Options as EmbeddingBagCollection's."""

    _entries_name = "embeddings"

    def __init__(self, tables: Sequence[Any], *, name: str = "ec",
                 client: Optional[parallax.Client] = None, optimizer: str = "adagrad",
                 lr: float = 0.1, aggregation: str = "mean", initializer: str = "normal",
                 init_std: float = 1.0, **options: Any):
        options.update(optimizer=optimizer, lr=lr, aggregation=aggregation,
                       initializer=initializer, init_std=init_std)
        super().__init__(tables, name, client, options)

    def forward(self, features: Any) -> Dict[str, Any]:
        looked = self._lookups(features)
        out = {}
        for f in self._features:
            inverse, rows, lens, w = looked[f]
            out[f] = _OutJagged(values=F.embedding(inverse, rows), weights=w, lengths=lens)
        return out
