"""parallelize(model, optimizer): a single-process model and its optimizer, trained by
every worker of a job as one model (the Parallax paper's promise: write the model for
one device, and the sparse and dense variables are each parallelized their way).

What it does, in place:
* Every nn.Embedding / nn.EmbeddingBag (a subclass too, if it keeps their forward and
  holds nothing more; sparse=True or not) whose
  weight is trained becomes a parallax.torch.Embedding / EmbeddingBag: a table held by
  the daemons, named "<name>.<module path>", holding rank 0's weights (loaded by rank 0
  behind a barrier), with padding_idx, mode, include_last_offset as the module had them.
  Modules sharing one weight share one table (looked up several times a step).
* The table's optimizer is the user's for that weight, mapped to the daemons'
  (_table_optimizer); the weight leaves the user's optimizer, whose other parameters stay.
  The table follows its param group's lr (a scheduler's changes) at each forward of the
  model (px_set_sparse_lr).
* The other parameters are averaged as DistributedDataParallel averages them (its engine,
  driven by hooks on the model): rank 0's parameters and buffers are broadcast now, the
  buffers again at each training forward, and each gradient is the mean over every
  worker when backward returns.
The model keeps its class, attributes, forward and state_dict keys (a table's "weight" is
read from the daemons); the optimizer keeps its class and param_groups.

Left dense (averaged as the rest, no table): an embedding whose weight another module
also uses (an output layer tied to the input embedding, nn.Linear's weight), with a
warning; a frozen one (requires_grad False, nothing to communicate); those named in dense.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..client import Client
from ..errors import invalid
from .ddp import BucketInfo, Compression, DistributedDataParallel, broadcast_parameters
from .session import default_client
from .sparse import Embedding, EmbeddingBag, _SparseModule

__all__ = ["parallelize", "ParallelPlan", "plan"]

Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]


@dataclass
class ParallelPlan:
    """What parallelize() made of a model: tables (module path -> the Parallax layer; a
    layer shared by several paths is listed under each), dense (the parameters averaged as
    DDP averages them), buckets (their allreduce buckets), and the client."""
    client: Client
    tables: Dict[str, _SparseModule] = field(default_factory=dict)
    dense: List[str] = field(default_factory=list)
    engine: Optional[DistributedDataParallel] = None

    @property
    def buckets(self) -> List[BucketInfo]:
        """The dense parameters' allreduce buckets, in submission order."""
        return self.engine.buckets if self.engine is not None else []


def plan(model: nn.Module) -> ParallelPlan:
    """The ParallelPlan of a model parallelize() returned."""
    found = model.__dict__.get("_parallax_plan")
    if found is None:
        raise invalid(f"{type(model).__name__} was not made by parallax.torch.parallelize()")
    return found


def _table_optimizer(opt: torch.optim.Optimizer, group: dict, path: str) -> Tuple[dict, str]:
    """The daemons' optimizer options for a table the user's optimizer trains in group, and
    a warning ("" if none). Refused: any class or setting the daemons cannot apply exactly
    as torch would to the rows a step touches."""
    kind = type(opt).__name__
    where = f"'{path}.weight' ({kind}"

    def refuse(why: str) -> Exception:
        return invalid(f"{where}): {why}; keep this table out with dense=['{path}'] or "
                       "train it with SGD, Adagrad, Adam or SparseAdam")

    def zero(key: str) -> None:
        if group.get(key):
            raise refuse(f"{key}={group[key]} is not applied by the daemons' optimizers")

    def unset(key: str) -> None:
        if group.get(key):
            raise refuse(f"{key}=True is not applied by the daemons' optimizers")

    lr = float(group["lr"])
    unset("maximize")
    if isinstance(opt, torch.optim.SGD):
        for key in ("momentum", "weight_decay"):
            zero(key)
        unset("nesterov")
        return dict(optimizer="sgd", lr=lr), ""
    if isinstance(opt, torch.optim.Adagrad):
        for key in ("lr_decay", "weight_decay"):
            zero(key)
        return dict(optimizer="adagrad", lr=lr, epsilon=float(group["eps"]),
                    initial_accumulator=float(group["initial_accumulator_value"])), ""
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW, torch.optim.SparseAdam)):
        zero("weight_decay")
        unset("amsgrad")
        beta1, beta2 = (float(b) for b in group["betas"])
        options = dict(optimizer="adam", lr=lr, beta1=beta1, beta2=beta2,
                       epsilon=float(group["eps"]))
        if isinstance(opt, torch.optim.SparseAdam):
            return options, ""
        return options, (f"{where}): the daemons' Adam is lazy, as torch.optim.SparseAdam: "
                         "a step moves only the rows it looked up, where torch.optim."
                         f"{kind} also moves the others by their moments (and scales eps by "
                         "its bias correction)")
    raise refuse("no daemon optimizer applies it")


def _group_of(optimizers: List[torch.optim.Optimizer], p: torch.Tensor, path: str):
    """(optimizer, the index of the param group that holds p)."""
    for opt in optimizers:
        for index, group in enumerate(opt.param_groups):
            if any(q is p for q in group["params"]):
                return opt, index
    raise invalid(f"'{path}.weight' is in no param group of the optimizer(s): train it "
                  "(add it to one) or freeze it (requires_grad=False)")


def _shared_with(model: nn.Module, tables: Dict[int, Tuple[str, nn.Module]]) -> Dict[int, str]:
    """Weights of candidate tables that a module other than an embedding also holds: id ->
    that module's path (such a weight is multiplied densely, so it stays dense)."""
    ids = {id(m.weight) for _, m in tables.values()}
    shared: Dict[int, str] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        if id(module) in tables:
            continue
        for p in module.parameters(recurse=False):
            if id(p) in ids:
                shared.setdefault(id(p), path or "the model")
    return shared


def _replace_modules(model: nn.Module, made: Dict[int, nn.Module]) -> None:
    """Every reference to a converted module, at any path, points to its replacement."""
    for module in list(model.modules()):
        for child_name, child in list(module._modules.items()):
            if child is not None and id(child) in made:
                module._modules[child_name] = made[id(child)]


def _check_module(module: nn.Module, table_name: str) -> None:
    """Refuses what a daemon-held table cannot do as torch does it."""
    base = nn.EmbeddingBag if isinstance(module, nn.EmbeddingBag) else nn.Embedding
    own_forward = type(module).forward is not base.forward
    more_state = (any(n != "weight" for n, _ in module.named_parameters())
                  or any(True for _ in module.buffers()) or any(True for _ in module.children()))
    if own_forward or more_state:
        raise invalid(f"'{table_name}': {type(module).__name__} changes {base.__name__}'s "
                      f"{'forward' if own_forward else 'state'}, "
                      "which the table would drop; keep it dense with dense=[...] or make "
                      f"the table an {base.__name__} inside it")
    if module.max_norm is not None:
        raise invalid(f"'{table_name}': max_norm renormalises rows in place at lookup, "
                      "which a daemon-held table does not do")
    if module.scale_grad_by_freq:
        raise invalid(f"'{table_name}': scale_grad_by_freq scales by each worker's own "
                      "batch counts, which differs from the global batch's")
    if module.weight.dtype != torch.float32:
        raise invalid(f"'{table_name}': the weight is {module.weight.dtype}; daemon-held "
                      "tables are float32")


def _parallax_layer(module: nn.Module, table_name: str, client: Client, options: dict,
                    shared_table=None) -> _SparseModule:
    rows, dim = module.weight.shape
    common = dict(initializer="zeros")  # rank 0's weights are loaded over it
    common.update(options)
    common.update(name=table_name, client=client, _table=shared_table)
    if isinstance(module, nn.EmbeddingBag):
        layer: _SparseModule = EmbeddingBag(rows, dim, module.mode,
                                            include_last_offset=module.include_last_offset,
                                            **common)
    else:
        layer = Embedding(rows, dim, **common)
    # Set after construction: the layers' own zeroing of the padding row would race rank
    # 0's load of its weights (which hold the row as the model has it).
    layer.padding_idx = module.padding_idx
    layer.train(module.training)
    return layer


def _follow_learning_rates(tables: List[Tuple[torch.optim.Optimizer, int, _SparseModule]]
                           ) -> None:
    """Gives each table its param group's lr (a scheduler changes the group's): run before
    every forward of the model, so a change made after step n's optimizer.step() applies
    from push step n + 1, as the group's new lr does to the dense parameters. The group is
    found by its index each time: optimizer.load_state_dict() replaces the group dicts."""
    for opt, index, layer in tables:
        rate = float(opt.param_groups[index]["lr"])
        if rate != layer.lr:
            layer.lr = rate


def parallelize(model: nn.Module, optimizer: Optimizers, *, client: Optional[Client] = None,
                name: str = "model", tables: Optional[Dict[str, dict]] = None,
                dense: Iterable[str] = (), load_weights: bool = True,
                bucket_cap_mb: float = 25.0, broadcast_buffers: bool = True,
                compression: Any = Compression.none) -> Tuple[nn.Module, Optimizers]:
    """Turns a single-process model and its optimizer (or a list of them) into the pair
    every worker trains with (module docstring); returns (model, optimizer), the same
    objects, changed in place. Every worker must call it with the same model structure.

    tables: options per module path for its table ("route", "consistency", "wire_dtype",
    "prefetch", ...: parallax.torch.Embedding's; not the optimizer, which is the user's).
    dense: module paths of embeddings to leave dense. load_weights=False keeps the tables'
    values as they are in the daemons (a daemon restored from a checkpoint) instead of
    loading rank 0's weights. bucket_cap_mb, broadcast_buffers, compression:
    DistributedDataParallel's.
    """
    c = client or default_client()
    optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
    tables = dict(tables or {})
    dense = set(dense)
    if "_parallax_plan" in model.__dict__:
        raise invalid(f"{type(model).__name__} was parallelized already")
    if isinstance(model, (nn.Embedding, nn.EmbeddingBag)):
        raise invalid("parallelize() takes the model that holds the embeddings, not one")
    found: Dict[int, Tuple[str, nn.Module]] = {}
    for path, module in model.named_modules():
        if (isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and path not in dense
                and module.weight.requires_grad):
            found[id(module)] = (path, module)
    unknown = set(tables) - {path for path, _ in found.values()}
    if unknown:
        raise invalid(f"tables names {', '.join(sorted(unknown))}: not a trained "
                      "nn.Embedding or nn.EmbeddingBag of the model")
    for key, shared_path in _shared_with(model, found).items():
        for mid, (path, module) in list(found.items()):
            if id(module.weight) == key:
                warnings.warn(f"'{path}' shares its weight with '{shared_path}', which uses "
                              "it densely: kept dense (averaged as DDP does)", stacklevel=2)
                del found[mid]
    # Everything is checked before anything is made: a refusal leaves no table behind.
    checked = []  # (module id, path, module, options with the optimizer's; None: shared)
    groups: Dict[int, Tuple[torch.optim.Optimizer, int]] = {}  # weight id -> its group
    weights = set()
    for mid, (path, module) in found.items():
        _check_module(module, f"{name}.{path}")
        options = dict(tables.get(path, {}))
        if "optimizer" in options or "lr" in options:
            raise invalid(f"'{path}': a table's optimizer and lr come from the optimizer "
                          "given to parallelize()")
        if id(module.weight) in weights:
            checked.append((mid, path, module, None))
            continue
        weights.add(id(module.weight))
        opt, index = _group_of(optimizers, module.weight, path)
        mapped, warning = _table_optimizer(opt, opt.param_groups[index], path)
        if warning:
            warnings.warn(warning, stacklevel=2)
        groups[id(module.weight)] = (opt, index)
        checked.append((mid, path, module, {**options, **mapped}))
    the_plan = ParallelPlan(client=c)
    made: Dict[int, nn.Module] = {}
    by_weight: Dict[int, _SparseModule] = {}  # weight id -> the first layer made on it
    for mid, path, module, options in checked:
        if options is not None:
            layer = _parallax_layer(module, f"{name}.{path}", c, options)
            if load_weights and c.rank == 0:
                layer._table.load_all(module.weight.detach())
            by_weight[id(module.weight)] = layer
        else:  # a module sharing the weight of one made before: the same table
            first = by_weight[id(module.weight)]
            layer = _parallax_layer(module, first.table_name, c, {}, first._table)
        made[mid] = layer
        the_plan.tables[path] = layer
    # The weights leave the user's optimizers (their state too), then the model.
    for opt in optimizers:
        for group in opt.param_groups:
            group["params"] = [p for p in group["params"] if id(p) not in by_weight]
        for p in [p for p in opt.state if id(p) in by_weight]:
            del opt.state[p]
    _replace_modules(model, made)
    # Every worker's tables hold rank 0's weights before anyone's first pull.
    if load_weights and by_weight:
        c.barrier()
    named = list(model.named_parameters())
    the_plan.dense = [n for n, _ in named]
    if named:
        broadcast_parameters(dict(named + list(model.named_buffers())), 0, c,
                             name=f"{name}.init")
        the_plan.engine = DistributedDataParallel(model, c, bucket_cap_mb, name,
                                                  broadcast_buffers, init_sync=False,
                                                  compression=compression)
        model.register_forward_pre_hook(lambda module, args: the_plan.engine._before_forward())
    following = [(*groups[w], layer) for w, layer in by_weight.items()]
    if following:
        model.register_forward_pre_hook(lambda module, args: _follow_learning_rates(following))
    model.__dict__["_parallax_plan"] = the_plan
    return model, optimizer
