"""parallax.torch's sparse layers against real daemons, checked against plain PyTorch."""

from __future__ import annotations

import os

from conftest import Daemon, run_cluster, run_workers


def _torch_workers(daemon, scenario, n, *args, **kw):
    return run_workers(daemon, scenario, n, *args, worker="torchworker.py", **kw)


def test_embedding_matches_nn_embedding_with_adagrad_2_local_workers(daemon):
    results = _torch_workers(daemon, "embedding_matches_reference", 2)
    assert all(r["max_rel_err"] < 1e-5 for r in results)


def test_embedding_matches_reference_on_a_cluster_2x2():
    results = run_cluster(2, 2, "embedding_matches_reference", worker="torchworker.py")
    assert len(results) == 4


def test_embedding_on_the_alltoall_route_by_columns_2x2():
    # DIM 6 over 2 nodes: 3 columns each; the same reference as every other route.
    results = run_cluster(2, 2, "embedding_matches_reference", "route=alltoall",
                          "alltoall_split=columns", worker="torchworker.py")
    assert len(results) == 4
    assert all(r["max_rel_err"] < 1e-5 for r in results)


def test_embedding_on_the_auto_route_moving_every_other_step_2x2():
    # route="auto", the daemons pinned to move the table every 2 pull steps (by columns,
    # replicated, back to ps, ...): the same reference as every fixed route.
    results = run_cluster(2, 2, "embedding_matches_reference", "route=auto",
                          worker="torchworker.py",
                          daemon_args=("--route-estimate-steps", "2", "--route-auto-sequence",
                                       "alltoall-columns,allreduce,ps"))
    assert len(results) == 4
    assert all(r["max_rel_err"] < 1e-5 for r in results)


def test_embedding_prefetch_pipeline_matches_reference_on_a_cluster_2x2():
    # Each next batch's rows pulled between forward and backward: the same table.
    results = run_cluster(2, 2, "embedding_matches_reference", "pipeline=1", "route=ps",
                          worker="torchworker.py")
    assert len(results) == 4
    assert all(r["max_rel_err"] < 1e-5 for r in results)


def test_train_pipeline_prefetches_and_matches_reference_on_a_cluster_2x2():
    # pxt.TrainPipeline takes each next batch from the iterator and prefetches its rows
    # during backward: the same table, rows were served ahead, StopIteration at the end.
    results = run_cluster(2, 2, "embedding_matches_reference", "pipeline=train", "route=ps",
                          worker="torchworker.py")
    assert len(results) == 4
    assert all(r["max_rel_err"] < 1e-5 for r in results)
    assert max(r["served_ahead"] for r in results) > 0


def test_a_table_looked_up_twice_in_a_step_on_one_worker(daemon):
    # The repro of a tied embedding: (emb(a) * emb(b)).sum().backward() waited for the
    # operation deadline; one pull step and one push step a training step now.
    results = _torch_workers(daemon, "tables_looked_up_more_than_once", 1)
    assert results[0]["pull_steps"] == 5 and results[0]["push_steps"] == 5
    _check_misuse(results[0]["misuse"])


def _check_misuse(misuse):
    # Step 2's forward without backward, told at each table's next training lookup.
    assert len(misuse) == 2, misuse
    assert ("'t.tied': 3 of the 6 training-mode lookups of training step 3 got no gradient"
            in misuse[0]), misuse[0]
    assert "'t.bag2': 2 of the 4 training-mode lookups of training step 3" in misuse[1], misuse[1]
    assert all("eval() or torch.no_grad()" in m for m in misuse)


def test_tables_looked_up_more_than_once_match_nn_embedding_on_a_cluster_2x2():
    results = run_cluster(2, 2, "tables_looked_up_more_than_once", worker="torchworker.py")
    assert len(results) == 4
    assert all(r["pull_steps"] == 5 and r["push_steps"] == 5 for r in results)
    for r in results:
        _check_misuse(r["misuse"])


def test_collection_matches_nn_embedding_bags_one_step_per_group(daemon):
    # Three tables in two widths: two groups, each one pull and one push step a training
    # step (4 steps), whatever its tables and features.
    for r in _torch_workers(daemon, "collection_matches_reference", 2):
        assert r["pull_steps"] == [4, 4] and r["push_steps"] == [4, 4], r


def test_collection_matches_nn_embedding_bags_on_a_cluster_2x2():
    results = run_cluster(2, 2, "collection_matches_reference", worker="torchworker.py")
    assert len(results) == 4


def test_embedding_bag_and_eval_reads_without_steps(daemon):
    _torch_workers(daemon, "embedding_bag_and_eval", 1)


def test_sampled_softmax_matches_tf_formula_on_the_global_batch(daemon):
    results = _torch_workers(daemon, "sampled_softmax_matches_reference", 2)
    assert results[0]["losses"] != results[1]["losses"]  # different halves of the batch


def test_sampled_softmax_prefetch_pipeline_on_a_cluster_2x1():
    # The next step's targets and sample prefetched before backward: the same table.
    results = run_cluster(2, 1, "sampled_softmax_matches_reference", "pipeline=1",
                          worker="torchworker.py")
    assert len(results) == 2


def test_bad_input_raises(daemon):
    seen = _torch_workers(daemon, "bad_input", 1)[0]["seen"]
    assert "integers" in seen["float_indices"]
    assert "meta" in seen["meta_indices"] and "host memory" in seen["meta_indices"]
    assert "10" in seen["out_of_range"] and "t.bad" in seen["out_of_range"]
    assert "momentum" in seen["unknown_option"]
    assert "3 x 2" not in seen["load_shape"] and "10 x 2" in seen["load_shape"]
    assert "Linear has no prefetch(batch)" in seen["pipeline_no_prefetch"]
    assert "returned str" in seen["pipeline_no_loss"]


def test_checkpoint_then_restore_in_a_new_daemon(tmp_path):
    first = Daemon()
    try:
        saved = _torch_workers(first, "checkpoint_and_restore", 2, str(tmp_path),
                               job="ckpt")[0]["weight"]
    finally:
        first.stop()
    assert any(f.endswith(".manifest") for f in os.listdir(tmp_path))
    second = Daemon("--restore", str(tmp_path))
    try:
        restored = _torch_workers(second, "checkpoint_and_restore", 2, str(tmp_path),
                                  job="ckpt", extra_env={"PXPY_PHASE": "restore"})
    finally:
        second.stop()
    assert restored[0]["weight"] == saved


# parallax.torch.parallelize() on unmodified models (parallelizeworker.py).
def test_parallelized_recommender_matches_one_process_on_a_cluster_2x2():
    # Adagrad over the whole model: tables mapped to the daemons' adagrad, the MLP averaged.
    results = run_cluster(2, 2, "recommender", "adagrad", worker="parallelizeworker.py")
    assert len(results) == 4
    # Two lookups of the item table a step (history, candidate): one pull and one push.
    assert all(r["items_pull_steps"] == 5 and r["items_push_steps"] == 5 for r in results)


def test_parallelized_recommender_with_sparse_adam_on_a_cluster_2x2():
    # nn.EmbeddingBag(sparse=True) + SparseAdam for the tables, Adam for the MLP.
    results = run_cluster(2, 2, "recommender", "sparseadam", worker="parallelizeworker.py")
    assert len(results) == 4


def test_parallelize_refuses_what_tables_cannot_do(daemon):
    seen = run_workers(daemon, "refusals", 1, worker="parallelizeworker.py")[0]["seen"]
    assert "'0.weight' (SGD): momentum=0.9" in seen["momentum"], seen["momentum"]
    assert "RMSprop): no daemon optimizer applies it" in seen["rmsprop"], seen["rmsprop"]
    assert "dense=['0']" in seen["rmsprop"]
    assert "'refused.max_norm.0': max_norm" in seen["max_norm"], seen["max_norm"]
    assert "in no param group" in seen["not_trained"], seen["not_trained"]
    assert "nope" in seen["unknown_table"], seen["unknown_table"]
    assert "come from the optimizer" in seen["table_lr"], seen["table_lr"]
    assert "_Scaled changes Embedding's forward" in seen["subclass"], seen["subclass"]
    assert "lazy, as torch.optim.SparseAdam" in seen["adam"], seen["adam"]


def test_parallelized_recommender_under_an_lr_schedule_on_a_cluster_2x2():
    # LambdaLR (warm-up, then decay) on the optimizer: the tables follow their param group
    # at each forward (px_set_sparse_lr), as the reference's embeddings do.
    results = run_cluster(2, 2, "recommender", "scheduled", worker="parallelizeworker.py")
    assert len(results) == 4
