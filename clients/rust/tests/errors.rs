// Failures carry their status and the library's or daemon's message; buffers are checked
// before C is called; dropping, leaking and timing out requests.
#![deny(warnings)]

mod common;

use std::time::{Duration, Instant};

use common::{connect, unique_job, workers, WAIT};
use parallax::{Client, ReduceOp, SparseOptions, Status};

#[test]
fn registering_again_with_another_type_is_a_mismatch() {
    workers("mismatch-self", 1, |c| {
        let _w = c.register_dense::<f32>("w", 4, ReduceOp::Sum).unwrap();
        let e = c.register_dense::<f64>("w", 4, ReduceOp::Sum).unwrap_err();
        assert_eq!(e.status(), Status::Mismatch);
        assert!(
            e.message().contains("'w'") && e.message().contains("f64[4]"),
            "{}",
            e
        );
        assert_eq!(c.last_error(), e.message());
    });
}

#[test]
fn workers_registering_different_shapes_both_fail() {
    workers("mismatch-peers", 2, |c| {
        let r = c.world().rank;
        if r == 1 {
            c.barrier(WAIT).unwrap();
        }
        let reg = c.register_dense::<f32>("weights", 4 + r, ReduceOp::Sum);
        if r == 0 {
            c.barrier(WAIT).unwrap();
            c.barrier(WAIT).unwrap(); // rank 1 has registered
            let v = reg.unwrap();
            let mut b = [0.0f32; 4];
            let e = v
                .allreduce_in_place(&mut b)
                .unwrap()
                .wait(WAIT)
                .unwrap_err();
            assert_eq!(e.status(), Status::Mismatch);
            assert!(
                e.message().contains("f32[4]") && e.message().contains("f32[5]"),
                "{}",
                e
            );
        } else {
            let e = reg.unwrap_err();
            assert_eq!(e.status(), Status::Mismatch);
            assert!(e.message().contains("weights"), "{}", e);
            c.barrier(WAIT).unwrap();
        }
    });
}

#[test]
fn bad_sparse_options_are_refused_with_the_reason() {
    workers("badopts", 1, |c| {
        let e = c
            .register_sparse("t", 10, 2, &SparseOptions::new().learning_rate(-1.0))
            .unwrap_err();
        assert_eq!(e.status(), Status::Invalid);
        assert!(e.message().contains("learning_rate"), "{}", e);
    });
}

#[test]
fn an_index_out_of_range_names_it() {
    workers("index", 1, |c| {
        let t = c
            .register_sparse("t", 100, 2, &SparseOptions::new())
            .unwrap();
        let mut out = [0.0f32; 4];
        let e = t
            .pull_rows(&[3, 1000], &mut out)
            .unwrap()
            .wait(WAIT)
            .unwrap_err();
        assert_eq!(e.status(), Status::Index);
        assert!(
            e.message().contains("1000") && e.message().contains("'t'"),
            "{}",
            e
        );
        assert_eq!(e.to_string(), format!("PX_ERR_INDEX: {}", e.message()));
    });
}

#[test]
fn wrong_buffer_lengths_fail_before_any_step_is_taken() {
    workers("lengths", 2, |c| {
        let r = c.world().rank;
        let v = c.register_dense::<f32>("v", 4, ReduceOp::Sum).unwrap();
        if r == 0 {
            let mut short = [0.0f32; 3];
            let e = v.allreduce(&[1.0; 4], &mut short).unwrap_err();
            assert_eq!(e.status(), Status::Invalid);
            assert!(e.message().contains("3 elements, 4 expected"), "{}", e);
            let mut gathered = [0.0f32; 4];
            let e = v.allgather(&[1.0; 4], &mut gathered).unwrap_err();
            assert!(e.message().contains("4 elements, 8 expected"), "{}", e);
            let e = v.allgatherv(&[1.0], &[1], &mut gathered).unwrap_err();
            assert!(e.message().contains("counts has 1 entries"), "{}", e);
            let t = c
                .register_sparse("t", 10, 3, &SparseOptions::new())
                .unwrap();
            let mut rows = [0.0f32; 5];
            let e = t.pull_rows(&[1, 2], &mut rows).unwrap_err();
            assert!(
                e.message()
                    .contains("need 2 x 3 = 6 values, the buffer has 5"),
                "{}",
                e
            );
            let e = t.push_rows(&[1], &[0.0; 2]).unwrap_err();
            assert_eq!(e.status(), Status::Invalid);
        } else {
            let _t = c
                .register_sparse("t", 10, 3, &SparseOptions::new())
                .unwrap();
        }
        // Step 0 is still the first step of both workers.
        let mut b = [1.0f32 + r as f32; 4];
        v.allreduce_in_place(&mut b).unwrap().wait(WAIT).unwrap();
        assert_eq!(b, [3.0; 4]);
    });
}

#[test]
fn a_slice_of_an_arena_buffer_is_refused_as_an_output() {
    workers("arena-slice", 1, |c| {
        let v = c.register_dense::<f32>("v", 4, ReduceOp::Sum).unwrap();
        let mut buf = c.alloc::<f32>(8).unwrap();
        let e = v.allreduce(&[1.0; 4], &mut buf[2..6]).unwrap_err();
        assert_eq!(e.status(), Status::Invalid);
        assert!(e.message().contains("ArenaBuffer"), "{}", e);
        // As an input it is fine: the daemon only reads it.
        let mut out = [0.0f32; 4];
        buf[2..6].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        v.allreduce(&buf[2..6], &mut out)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    });
}

#[test]
fn a_request_dropped_before_completion_withdraws_its_step() {
    workers("dropped", 2, |c| {
        let r = c.world().rank;
        let v = c.register_dense::<f32>("v", 4, ReduceOp::Sum).unwrap();
        let mut out = c.alloc::<f32>(4).unwrap();
        if r == 0 {
            let req = v.allreduce(&[1.0; 4], &mut out).unwrap();
            drop(req); // rank 1 has not submitted: the step is withdrawn
        }
        c.barrier(WAIT).unwrap();
        if r == 1 {
            let e = v
                .allreduce(&[1.0; 4], &mut out)
                .unwrap()
                .wait(WAIT)
                .unwrap_err();
            assert_eq!(e.status(), Status::Cancelled);
            assert!(
                e.message().contains("local rank 0") && e.message().contains("withdrew"),
                "{}",
                e
            );
        }
        // Step 1 works for both, into the same arena buffer.
        v.allreduce(&[1.0; 4], &mut out)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(&out[..], &[2.0; 4]);
    });
}

#[test]
fn a_wait_that_times_out_leaves_the_request_pending() {
    workers("timeout", 2, |c| {
        let r = c.world().rank;
        let v = c.register_dense::<f32>("v", 2, ReduceOp::Sum).unwrap();
        let mut out = [0.0f32; 2];
        if r == 0 {
            let mut req = v.allreduce(&[1.0; 2], &mut out).unwrap();
            let start = Instant::now();
            let e = req.wait(Duration::from_millis(100)).unwrap_err();
            assert!(start.elapsed() >= Duration::from_millis(100));
            assert_eq!(e.status(), Status::Timeout);
            assert!(
                e.message().contains("did not complete within 100 ms"),
                "{}",
                e
            );
            assert!(!req.test().unwrap());
            c.barrier(WAIT).unwrap(); // rank 1 submits after this
            req.wait(WAIT).unwrap();
            req.wait(WAIT).unwrap(); // a completed request answers again
        } else {
            c.barrier(WAIT).unwrap();
            v.allreduce(&[2.0; 2], &mut out)
                .unwrap()
                .wait(WAIT)
                .unwrap();
        }
        assert_eq!(out, [3.0; 2]);
    });
}

#[test]
fn cancel_then_wait_says_cancelled() {
    workers("cancel", 1, |c| {
        let v = c.register_dense::<f32>("v", 2, ReduceOp::Sum).unwrap();
        let mut out = [0.0f32; 2];
        let mut req = v.allreduce(&[1.0; 2], &mut out).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        req.cancel().unwrap();
        let e = req.wait(WAIT).unwrap_err();
        assert_eq!(e.status(), Status::Cancelled);
        assert!(!e.message().is_empty());
        assert!(req.cancel().is_ok()); // again: nothing left to withdraw
    });
}

#[test]
fn a_leaked_request_poisons_its_arena_buffer() {
    workers("leak", 1, |c| {
        let v = c.register_dense::<f32>("v", 4, ReduceOp::Sum).unwrap();
        let mut buf = c.alloc::<f32>(4).unwrap();
        std::mem::forget(v.allreduce_in_place(&mut buf).unwrap());
        // parallaxd may still write it: no access, no reuse, no free.
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| buf[0]));
        assert!(read.is_err());
        let e = v.allreduce_in_place(&mut buf).unwrap_err();
        assert!(e.message().contains("leaked"), "{}", e);
    });
}

#[test]
fn abort_fails_the_other_workers_with_the_reason() {
    workers("abort", 2, |c| {
        let r = c.world().rank;
        let v = c.register_dense::<f32>("v", 2, ReduceOp::Sum).unwrap();
        let mut out = [0.0f32; 2];
        if r == 1 {
            let mut req = v.allreduce(&[1.0; 2], &mut out).unwrap();
            c.barrier(WAIT).unwrap();
            let e = req.wait(WAIT).unwrap_err();
            assert_eq!(e.status(), Status::PeerLost);
            assert!(e.message().contains("the loss went NaN"), "{}", e);
        } else {
            c.barrier(WAIT).unwrap();
            c.abort("the loss went NaN").unwrap();
        }
    });
}

#[test]
fn connect_errors() {
    let start = Instant::now();
    let e = Client::builder()
        .socket("/nonexistent/parallaxd.sock")
        .connect()
        .unwrap_err();
    assert_eq!(e.status(), Status::Connect);
    assert!(e.message().contains("/nonexistent/parallaxd.sock"), "{}", e);
    assert!(start.elapsed() < Duration::from_secs(5));

    let e = Client::builder()
        .socket(common::socket())
        .job(unique_job("rank"))
        .local_rank(2)
        .local_size(2)
        .connect()
        .unwrap_err();
    assert_eq!(e.status(), Status::Invalid);
    assert!(e.message().contains("local_rank 2"), "{}", e);

    let e = Client::builder().job("a\0b").connect().unwrap_err();
    assert_eq!(e.status(), Status::Invalid);

    let c = connect(&unique_job("nul"), 0, 1);
    let e = c
        .register_dense::<f32>("x\0y", 1, ReduceOp::Sum)
        .unwrap_err();
    assert!(e.message().contains("NUL"), "{}", e);
    c.disconnect().unwrap();
}
