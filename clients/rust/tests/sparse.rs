// Sparse tables against a real parallaxd: load, pull, push with SGD, read, initializers,
// a checkpoint; two local workers.
#![deny(warnings)]

mod common;

use common::{workers, WAIT};
use parallax::{Consistency, Initializer, Optimizer, Route, SparseOptions};

#[test]
fn sgd_pull_push_read_give_the_expected_values() {
    workers("sgd", 2, |c| {
        let r = c.world().rank;
        let opts = SparseOptions::new()
            .optimizer(Optimizer::Sgd)
            .learning_rate(0.5)
            .consistency(Consistency::Sync)
            .route(Route::Hybrid);
        let table = c.register_sparse("emb", 10, 2, &opts).unwrap();
        assert_eq!((table.rows(), table.dim()), (10, 2));
        if r == 0 {
            let ids: Vec<i64> = (0..10).collect();
            let values: Vec<f32> = (0..10).flat_map(|i| [i as f32, i as f32 + 0.5]).collect();
            table.load_rows(&ids, &values).unwrap().wait(WAIT).unwrap();
        }
        c.barrier(WAIT).unwrap();

        let ids = [1i64, 3];
        let mut rows = vec![0.0f32; 4];
        table
            .pull_rows(&ids, &mut rows)
            .unwrap()
            .wait(WAIT)
            .unwrap(); // pull step 0
        assert_eq!(rows, [1.0, 1.5, 3.0, 3.5]);

        // Rank 0: 1 for rows 1 and 3; rank 1: 2 for row 1 and, duplicated, 2 + 2 for row 3.
        let (push_ids, grads): (Vec<i64>, Vec<f32>) = if r == 0 {
            (vec![1, 3], vec![1.0; 4])
        } else {
            (vec![1, 3, 3], vec![2.0; 6])
        };
        table
            .push_rows(&push_ids, &grads)
            .unwrap()
            .wait(WAIT)
            .unwrap(); // push step 0

        // Pull step 1 sees push step 0 of both workers: w -= 0.5 * summed gradient.
        let mut arena_rows = c.alloc::<f32>(4).unwrap();
        table
            .pull_rows(&ids, &mut arena_rows)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(&arena_rows[..], &[-0.5, 0.0, 0.5, 1.0]);

        let mut read = [0.0f32; 6];
        table
            .read_rows(&[3, 0, 1], &mut read)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(read, [0.5, 1.0, 0.0, 0.5, -0.5, 0.0]);

        let stats = table.stats().unwrap();
        assert_eq!((stats.pull_steps, stats.push_steps), (2, 1));
        // A worker that disconnects fails its peers' pending operations (a read included):
        // leave together.
        c.barrier(WAIT).unwrap();
    });
}

#[test]
fn initializer_is_the_same_on_every_worker() {
    let rows: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());
    workers("init", 2, |c| {
        let opts = SparseOptions::new()
            .initializer(Initializer::Uniform {
                low: -1.0,
                high: 1.0,
            })
            .seed(7);
        let table = c.register_sparse("t", 50, 4, &opts).unwrap();
        let mut out = vec![0.0f32; 8];
        table
            .pull_rows(&[49, 0], &mut out)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert!(out.iter().all(|&x| (-1.0..1.0).contains(&x)), "{:?}", out);
        assert!(out.iter().any(|&x| x != 0.0));
        rows.lock().unwrap().push(out);
    });
    let rows = rows.into_inner().unwrap();
    assert_eq!(rows[0], rows[1]);
}

#[test]
fn checkpoint_writes_a_manifest() {
    let dir = std::env::temp_dir().join(format!("px-rust-ckpt-{}", std::process::id()));
    let job = std::sync::Mutex::new(String::new());
    workers("ckpt", 2, |c| {
        let table = c
            .register_sparse("ckpt_table", 8, 2, &SparseOptions::new())
            .unwrap();
        let mut out = [0.0f32; 2];
        table.pull_rows(&[5], &mut out).unwrap().wait(WAIT).unwrap();
        table
            .push_rows(&[5], &[1.0, 1.0])
            .unwrap()
            .wait(WAIT)
            .unwrap();
        c.barrier(WAIT).unwrap();
        if c.world().rank == 0 {
            c.checkpoint(&dir, WAIT).unwrap();
        }
        c.barrier(WAIT).unwrap();
        let _ = &job;
    });
    let manifests: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with("ckpt_table.manifest")
        })
        .collect();
    assert_eq!(manifests.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_group_takes_one_step_over_several_tables() {
    workers("group", 2, |c| {
        let opts = SparseOptions::new()
            .optimizer(Optimizer::Sgd)
            .learning_rate(0.5);
        let group = c
            .register_sparse_group("rs.group", &[("user", 10), ("item", 20)], 2, &opts)
            .unwrap();
        let (user, item) = (group.table("user").unwrap(), group.table("item").unwrap());
        assert_eq!((user.rows(), item.rows(), group.var().rows()), (10, 20, 30));
        let mut rows = vec![1.0f32; 6];
        group
            .pull_tables(&[(item, &[19, 0]), (user, &[9])], &mut rows)
            .unwrap()
            .wait(WAIT)
            .unwrap(); // pull step 0: zeros
        assert_eq!(rows, [0.0; 6]);
        group
            .push_tables(&[(user, &[9]), (item, &[19, 19])], &[1.0; 6])
            .unwrap()
            .wait(WAIT)
            .unwrap(); // push step 0: both workers, summed, lr 0.5
        let mut after = vec![0.0f32; 4];
        group
            .pull_tables(&[(item, &[19]), (user, &[9])], &mut after)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(after, [-2.0, -2.0, -1.0, -1.0]);
        // item's row 19 is the group's row 29.
        let mut own = [0.0f32; 2];
        group
            .var()
            .read_rows(&[29], &mut own)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(own, [-2.0, -2.0]);
        let stats = user.stats().unwrap();
        assert_eq!((stats.pull_steps, stats.push_steps), (2, 1));
        let err = user
            .read_rows(&[10], &mut own)
            .unwrap()
            .wait(WAIT)
            .unwrap_err();
        assert!(
            err.message()
                .contains("index 10 of table 'user', outside its 10 rows"),
            "{}",
            err.message()
        );
        c.barrier(WAIT).unwrap();
    });
}
