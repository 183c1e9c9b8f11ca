//! One worker of a Parallax job, in Rust over the `parallax` crate: an allreduce (sum), an
//! allreduce in place (mean) and an allgather. Start it once per worker under a launcher
//! that sets `PARALLAX_*`, e.g. on 2 nodes x 2 workers (libparallax on the loader's path):
//!
//! ```text
//! tools/px-cluster --nodes 2 --workers-per-node 2 -- target/debug/px-example-rust
//! ```
//!
//! Every value is a small integer or a half, so the printed results are exact: each worker
//! checks them and exits 1 if one is wrong.
use std::process::exit;
use std::time::Duration;

use parallax::{Client, ReduceOp};

const WAIT: Duration = Duration::from_secs(30);

fn run() -> parallax::Result<bool> {
    let client = Client::connect_default()?; // socket, job, local rank and size: PARALLAX_*
    let world = client.world();
    let (rank, workers) = (world.rank as i64, world.world_size as i64);

    // Worker r contributes (r + 1) * (i + 1): the sum is (1 + 2 + ... + workers) * (i + 1).
    let sum = client.register_dense::<i64>("example.sum", 4, ReduceOp::Sum)?;
    let input: Vec<i64> = (1..=4).map(|i| (rank + 1) * i).collect();
    let mut total = vec![0i64; 4];
    sum.allreduce(&input, &mut total)?.wait(WAIT)?;

    // The mean of the ranks, in place: (workers - 1) / 2.
    let mean = client.register_dense::<f64>("example.mean", 1, ReduceOp::Mean)?;
    let mut mean_rank = [rank as f64];
    mean.allreduce_in_place(&mut mean_rank)?.wait(WAIT)?;

    // Every worker's node index, in rank order.
    let nodes = client.register_dense::<i32>("example.nodes", 1, ReduceOp::Sum)?;
    let my_node = [world.node_index as i32];
    let mut node_of = vec![0i32; workers as usize];
    nodes.allgather(&my_node, &mut node_of)?.wait(WAIT)?;

    let triangle = workers * (workers + 1) / 2;
    let ok = total.iter().zip(1..).all(|(&t, i)| t == triangle * i)
        && mean_rank[0] == (workers - 1) as f64 / 2.0
        && node_of
            .iter()
            .enumerate()
            .all(|(r, &n)| n as usize == r / world.local_size);
    client.barrier(WAIT)?;
    if rank == 0 {
        println!("{} workers on {} nodes", workers, world.node_count);
        println!("allreduce sum: {:?}", total);
        println!("mean rank: {}", mean_rank[0]);
        println!("node of each rank: {:?}", node_of);
    }
    client.barrier(WAIT)?;
    println!("worker {}: {}", rank, if ok { "OK" } else { "WRONG" });
    drop((sum, mean, nodes)); // the variables borrow the client
    client.disconnect()?;
    Ok(ok)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => exit(1),
        Err(e) => {
            eprintln!("px-example-rust: {}", e);
            exit(1);
        }
    }
}
