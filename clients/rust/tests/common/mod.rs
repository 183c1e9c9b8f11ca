// Helpers shared by the integration tests: every test runs against the real parallaxd
// that run_tests.sh started at $PARALLAX_SOCKET, with a job name of its own, so tests run
// in parallel threads without meeting.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parallax::Client;

pub const WAIT: Duration = Duration::from_secs(20);

pub fn socket() -> String {
    std::env::var("PARALLAX_SOCKET")
        .expect("PARALLAX_SOCKET must name a running parallaxd (clients/rust/run_tests.sh)")
}

pub fn unique_job(tag: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "rust-{}-{}-{}",
        tag,
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn connect(job: &str, rank: u32, size: u32) -> Client {
    Client::builder()
        .socket(socket())
        .job(job)
        .local_rank(rank)
        .local_size(size)
        .timeout(WAIT)
        .arena_bytes(8 << 20)
        .connect()
        .unwrap_or_else(|e| panic!("connect {} rank {}/{}: {}", job, rank, size, e))
}

/// Runs `body` as `n` local workers of one fresh job, one thread and client each (two
/// clients in one process work: each has its own arena and connection).
pub fn workers<F>(tag: &str, n: u32, body: F)
where
    F: Fn(&Client) + Sync,
{
    let job = unique_job(tag);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let (job, body) = (&job, &body);
                s.spawn(move || {
                    let client = connect(job, rank, n);
                    body(&client);
                    // Leave together: a worker that disconnects fails its peers' pending
                    // operations. Errors are ignored (a test may have aborted the job).
                    let _ = client.barrier(std::time::Duration::from_secs(30));
                })
            })
            .collect();
        for h in handles {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}
