// Dense operations against a real parallaxd, two local workers (two clients in two
// threads of this process).
#![deny(warnings)]

mod common;

use common::{workers, WAIT};
use parallax::{Bf16, DType, DenseOptions, ReduceOp, Status, F16};

#[test]
fn connect_and_world() {
    workers("world", 2, |c| {
        let w = c.world();
        assert_eq!((w.node_index, w.node_count), (0, 1));
        assert_eq!((w.world_size, w.local_size), (2, 2));
        assert_eq!(w.rank, w.local_rank);
        assert!(w.rank < 2);
        c.barrier(WAIT).unwrap();
    });
}

#[test]
fn allreduce_every_dtype() {
    workers("allreduce", 2, |c| {
        let r = c.world().rank;
        let sum = c
            .register_dense::<f32>("f32-sum", 3, ReduceOp::Sum)
            .unwrap();
        let input = [1.0f32 + r as f32, 10.0, -0.5];
        let mut out = vec![0.0f32; 3];
        sum.allreduce(&input, &mut out).unwrap().wait(WAIT).unwrap();
        assert_eq!(out, [3.0, 20.0, -1.0]);

        let mean = c
            .register_dense::<f64>("f64-mean", 2, ReduceOp::Mean)
            .unwrap();
        let mut buf = [r as f64, 4.0];
        mean.allreduce_in_place(&mut buf)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(buf, [0.5, 4.0]);

        let max = c
            .register_dense::<i32>("i32-max", 2, ReduceOp::Max)
            .unwrap();
        let mut m = [r as i32 * 7, -(r as i32)];
        max.allreduce_in_place(&mut m[..])
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(m, [7, 0]);

        let min = c
            .register_dense::<i64>("i64-min", 1, ReduceOp::Min)
            .unwrap();
        let mut v = vec![1i64 << 40 | r as i64];
        min.allreduce_in_place(&mut v).unwrap().wait(WAIT).unwrap();
        assert_eq!(v, [1i64 << 40]);

        // f16 and bf16 travel as bits: 1.5 + 1.5 = 3.
        let h = c.register_dense::<F16>("f16", 1, ReduceOp::Sum).unwrap();
        let mut hb = [F16(0x3e00)];
        h.allreduce_in_place(&mut hb).unwrap().wait(WAIT).unwrap();
        assert_eq!(hb[0], F16(0x4200));
        let b = c.register_dense::<Bf16>("bf16", 1, ReduceOp::Sum).unwrap();
        let mut bb = [Bf16::from_f32(1.5)];
        b.allreduce_in_place(&mut bb).unwrap().wait(WAIT).unwrap();
        assert_eq!(bb[0].to_f32(), 3.0);
    });
}

#[test]
fn a_16_bit_wire_is_an_option_of_f32_variables() {
    workers("wire", 2, |c| {
        let bf16 = DenseOptions::new().wire_dtype(DType::Bf16);
        // One node sends nothing between nodes: the sum is f32's.
        let v = c
            .register_dense_with::<f32>("wired", 2, ReduceOp::Sum, &bf16)
            .unwrap();
        let mut x = [1.0f32 + 1e-4, 2.0];
        v.allreduce_in_place(&mut x).unwrap().wait(WAIT).unwrap();
        assert_eq!(x, [2.0f32 + 2e-4, 4.0]);
        let e = c
            .register_dense_with::<f64>("wired-f64", 2, ReduceOp::Sum, &bf16)
            .err()
            .expect("a bf16 wire on an f64 variable is refused");
        assert_eq!(e.status(), Status::Invalid);
        c.barrier(WAIT).unwrap();
    });
}

#[test]
fn several_steps_in_flight_then_wait_all() {
    workers("inflight", 2, |c| {
        let v = c.register_dense::<f32>("v", 4, ReduceOp::Sum).unwrap();
        let inputs: Vec<Vec<f32>> = (0..3).map(|s| vec![s as f32; 4]).collect();
        let mut outs = vec![vec![0.0f32; 4]; 3];
        let mut reqs = Vec::new();
        for (input, out) in inputs.iter().zip(outs.iter_mut()) {
            reqs.push(v.allreduce(input, out).unwrap());
        }
        parallax::Request::wait_all(&mut reqs, WAIT).unwrap();
        drop(reqs);
        for (s, out) in outs.iter().enumerate() {
            assert_eq!(out, &vec![2.0 * s as f32; 4]);
        }
    });
}

#[test]
fn arena_buffers_in_place_and_as_input() {
    workers("arena", 2, |c| {
        let r = c.world().rank as f32;
        let v = c
            .register_dense::<f32>("grad", 1000, ReduceOp::Sum)
            .unwrap();
        let mut buf = c.alloc::<f32>(1000).unwrap();
        assert!(buf.iter().all(|&x| x == 0.0));
        for (i, x) in buf.iter_mut().enumerate() {
            *x = i as f32 + r;
        }
        let mut req = v.allreduce_in_place(&mut buf).unwrap();
        assert!(req.test().is_ok());
        req.wait(WAIT).unwrap();
        drop(req);
        assert_eq!(buf[0], 1.0);
        assert_eq!(buf[999], 2.0 * 999.0 + 1.0);

        // Arena memory as an input (read in place), ordinary memory as the output.
        let mut out = vec![0.0f32; 1000];
        v.allreduce(&buf, &mut out).unwrap().wait(WAIT).unwrap();
        assert_eq!(out[1], 2.0 * (2.0 * 1.0 + 1.0));
        // And arena memory of another allocation as the output.
        let mut out2 = c.alloc::<f32>(1000).unwrap();
        v.allreduce(&out, &mut out2).unwrap().wait(WAIT).unwrap();
        assert_eq!(out2[1], 2.0 * out[1]);
    });
}

#[test]
fn broadcast_from_a_root() {
    workers("broadcast", 2, |c| {
        let r = c.world().rank;
        let v = c
            .register_dense::<i64>("weights", 3, ReduceOp::Sum)
            .unwrap();
        let mut buf = if r == 1 { [7i64, 8, 9] } else { [0i64; 3] };
        v.broadcast_in_place(1, &mut buf)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(buf, [7, 8, 9]);

        let input = [r as i64 + 100; 3];
        let mut out = [0i64; 3];
        let given = if r == 0 { Some(&input[..]) } else { None };
        v.broadcast(0, given, &mut out).unwrap().wait(WAIT).unwrap();
        assert_eq!(out, [100, 100, 100]);

        let e = v.broadcast_in_place(5, &mut buf).unwrap_err();
        assert_eq!(e.status(), parallax::Status::Invalid);
        assert!(e.message().contains("root 5"), "{}", e);
    });
}

#[test]
fn allgather_and_allgatherv() {
    workers("allgather", 2, |c| {
        let r = c.world().rank;
        let v = c.register_dense::<i32>("block", 3, ReduceOp::Sum).unwrap();
        let input = [r as i32; 3];
        let mut out = vec![-1i32; 6];
        v.allgather(&input, &mut out).unwrap().wait(WAIT).unwrap();
        assert_eq!(out, [0, 0, 0, 1, 1, 1]);

        let counts = [1u64, 3];
        let mine: Vec<i32> = (0..counts[r]).map(|i| 10 * r as i32 + i as i32).collect();
        let mut all = vec![-1i32; 4];
        v.allgatherv(&mine, &counts, &mut all)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(all, [0, 10, 11, 12]);
    });
}

#[test]
fn reduce_scatter_alltoall_and_alltoallv() {
    workers("exchange", 2, |c| {
        let r = c.world().rank;
        let v = c
            .register_dense::<i64>("exchange", 2, ReduceOp::Prod)
            .unwrap();
        // Rank r gives block k the values (r + 2) * (k + 1): products over both ranks.
        let input: Vec<i64> = (0..4).map(|i| (r as i64 + 2) * (i / 2 + 1)).collect();
        let mut mine = [0i64; 2];
        v.reduce_scatter(&input, &mut mine)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        let k = r as i64 + 1;
        assert_eq!(mine, [2 * k * 3 * k, 2 * k * 3 * k]);

        let blocks: Vec<i64> = (0..4).map(|i| 10 * r as i64 + i).collect();
        let mut got = vec![-1i64; 4];
        v.alltoall(&blocks, &mut got).unwrap().wait(WAIT).unwrap();
        let want: Vec<i64> = (0..2)
            .flat_map(|s| (0..2).map(move |j| 10 * s + 2 * r as i64 + j))
            .collect();
        assert_eq!(got, want);

        // Rank 0 sends 1 element to itself and 2 to rank 1; rank 1 sends 0 and 1.
        let send: [u64; 2] = if r == 0 { [1, 2] } else { [0, 1] };
        let recv: [u64; 2] = if r == 0 { [1, 0] } else { [2, 1] };
        let data: Vec<i64> = (0..send.iter().sum::<u64>() as i64)
            .map(|i| 100 * r as i64 + i)
            .collect();
        let mut out = vec![-1i64; recv.iter().sum::<u64>() as usize];
        v.alltoallv(&data, &send, &mut out, &recv)
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(out, if r == 0 { vec![0] } else { vec![1, 2, 100] });
    });
}

#[test]
fn stats_count_operations() {
    workers("stats", 1, |c| {
        let v = c.register_dense::<f32>("s", 8, ReduceOp::Sum).unwrap();
        let mut b = [1.0f32; 8];
        for _ in 0..3 {
            v.allreduce_in_place(&mut b).unwrap().wait(WAIT).unwrap();
        }
        assert_eq!(b, [1.0; 8]);
        assert_eq!(v.stats().unwrap().ops, 3);
        assert_eq!(c.world().world_size, 1);
    });
}
