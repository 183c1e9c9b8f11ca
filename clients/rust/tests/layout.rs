// The sys structs have the header's layout (sizes and offsets as tests/unit/
// test_abi_layout.cc pins them), and the *_init functions fill what the header says.
#![deny(warnings)]

use std::mem::{size_of, MaybeUninit};
use std::ptr::addr_of;

use parallax::sys;

macro_rules! offset {
    ($t:ty, $field:ident) => {{
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        // SAFETY: addr_of! takes the field's address without reading it.
        (unsafe { addr_of!((*base).$field) } as usize) - (base as usize)
    }};
}

#[test]
fn struct_layouts_match_the_header() {
    assert_eq!(size_of::<sys::px_launch_info>(), 40);
    assert_eq!(offset!(sys::px_launch_info, rank), 12);
    assert_eq!(offset!(sys::px_launch_info, launcher), 16);
    assert_eq!(offset!(sys::px_launch_info, job_name), 24);
    assert_eq!(offset!(sys::px_launch_info, socket_path), 32);
    assert_eq!(size_of::<sys::px_connect_options>(), 56);
    assert_eq!(offset!(sys::px_connect_options, abi_version), 4);
    assert_eq!(offset!(sys::px_connect_options, socket_path), 8);
    assert_eq!(offset!(sys::px_connect_options, job_name), 16);
    assert_eq!(offset!(sys::px_connect_options, local_rank), 24);
    assert_eq!(offset!(sys::px_connect_options, local_size), 28);
    assert_eq!(offset!(sys::px_connect_options, timeout_ms), 32);
    assert_eq!(offset!(sys::px_connect_options, arena_bytes), 40);
    assert_eq!(offset!(sys::px_connect_options, wait_for_daemon), 48);

    assert_eq!(size_of::<sys::px_op_options>(), 32);
    assert_eq!(offset!(sys::px_op_options, memory_kind), 4);
    assert_eq!(offset!(sys::px_op_options, device), 8);
    assert_eq!(offset!(sys::px_op_options, priority), 12);
    assert_eq!(offset!(sys::px_op_options, stream), 16);
    assert_eq!(offset!(sys::px_op_options, root), 24);

    assert_eq!(size_of::<sys::px_alloc_options>(), 16);
    assert_eq!(offset!(sys::px_alloc_options, memory_kind), 4);
    assert_eq!(offset!(sys::px_alloc_options, device), 8);
    assert_eq!(size_of::<sys::px_world_info>(), 28);
    assert_eq!(offset!(sys::px_world_info, node_index), 4);
    assert_eq!(offset!(sys::px_world_info, rank), 12);
    assert_eq!(offset!(sys::px_world_info, local_size), 24);

    assert_eq!(size_of::<sys::px_var_stats>(), 168);
    assert_eq!(offset!(sys::px_var_stats, cache_hits), 128);
    assert_eq!(offset!(sys::px_var_stats, cache_rows_flushed), 160);
    assert_eq!(offset!(sys::px_var_stats, ops), 8);
    assert_eq!(offset!(sys::px_var_stats, pull_steps), 40);
    assert_eq!(offset!(sys::px_var_stats, bytes_received), 88);
    assert_eq!(offset!(sys::px_var_stats, request_partitions), 96);
    assert_eq!(offset!(sys::px_var_stats, search_steps_left), 104);
    assert_eq!(offset!(sys::px_var_stats, restored_steps), 112);
    assert_eq!(offset!(sys::px_var_stats, rows_served_ahead), 120);

    assert_eq!(size_of::<sys::px_dense_options>(), 8);
    assert_eq!(offset!(sys::px_dense_options, wire_dtype), 4);
    assert_eq!(size_of::<sys::px_sparse_options>(), 144);
    assert_eq!(offset!(sys::px_sparse_options, optimizer), 4);
    assert_eq!(offset!(sys::px_sparse_options, learning_rate), 8);
    assert_eq!(offset!(sys::px_sparse_options, initializer), 48);
    assert_eq!(offset!(sys::px_sparse_options, init_seed), 56);
    assert_eq!(offset!(sys::px_sparse_options, init_std), 80);
    assert_eq!(offset!(sys::px_sparse_options, aggregation), 88);
    assert_eq!(offset!(sys::px_sparse_options, partitions), 100);
    assert_eq!(offset!(sys::px_sparse_options, route), 104);
    assert_eq!(offset!(sys::px_sparse_options, nonfinite), 108);
    assert_eq!(offset!(sys::px_sparse_options, alltoall_split), 112);
    assert_eq!(offset!(sys::px_sparse_options, wire_dtype), 116);
    assert_eq!(offset!(sys::px_sparse_options, prefetch), 120);
    assert_eq!(offset!(sys::px_sparse_options, cache_rows), 128);
    assert_eq!(offset!(sys::px_sparse_options, cache_staleness), 132);
    assert_eq!(offset!(sys::px_sparse_options, replicas), 136);
}

#[test]
fn init_functions_fill_sizes_and_defaults() {
    let mut c = MaybeUninit::<sys::px_connect_options>::uninit();
    let c = unsafe {
        sys::px_connect_options_init_abi(c.as_mut_ptr(), sys::PX_ABI_VERSION);
        c.assume_init()
    };
    assert_eq!(c.struct_size as usize, size_of::<sys::px_connect_options>());
    assert_eq!(c.abi_version, sys::PX_ABI_VERSION);
    assert_eq!((c.local_rank, c.wait_for_daemon), (-1, -1));

    let mut o = MaybeUninit::<sys::px_op_options>::uninit();
    let o = unsafe {
        sys::px_op_options_init(o.as_mut_ptr());
        o.assume_init()
    };
    assert_eq!(o.struct_size as usize, size_of::<sys::px_op_options>());
    assert_eq!(
        (o.memory_kind, o.device, o.priority, o.root),
        (sys::PX_MEMORY_HOST, -1, 0, 0)
    );
    assert!(o.stream.is_null());

    let s = parallax::SparseOptions::new().to_raw();
    assert_eq!(s.struct_size as usize, size_of::<sys::px_sparse_options>());
    assert_eq!((s.optimizer, s.learning_rate), (sys::PX_OPT_SGD, 0.01));
    assert_eq!(
        (s.route, s.consistency),
        (sys::PX_ROUTE_HYBRID, sys::PX_SYNC)
    );
    assert_eq!(s.wire_dtype, sys::PX_F32);
    let bf16 = parallax::SparseOptions::new()
        .wire_dtype(parallax::DType::Bf16)
        .to_raw();
    assert_eq!(bf16.wire_dtype, sys::PX_BF16);
    assert_eq!(s.prefetch, 0);
    let ahead = parallax::SparseOptions::new().prefetch(true);
    assert_eq!(ahead.to_raw().prefetch, 1);
    assert_eq!(ahead.prefetch(false).to_raw().prefetch, 0);
    assert_eq!(s.cache_rows, 0);
    let cached = parallax::SparseOptions::new().cache(64, 2).to_raw();
    assert_eq!((cached.cache_rows, cached.cache_staleness), (64, 2));
    assert_eq!(s.replicas, 1);
    assert_eq!(parallax::SparseOptions::new().replicas(2).to_raw().replicas, 2);
}

#[test]
fn abi_version_and_status_names() {
    assert_eq!(parallax::abi_version(), (1, 16));
    for raw in 0..=16 {
        let s = parallax::Status::from_raw(raw);
        assert_eq!(s.raw(), raw);
        assert!(s.name().starts_with("PX_"), "{}", s.name());
    }
    assert_eq!(parallax::Status::Index.name(), "PX_ERR_INDEX");
    assert_eq!(parallax::Status::Membership.name(), "PX_ERR_MEMBERSHIP");
    assert_eq!(
        parallax::Status::from_raw(99),
        parallax::Status::Unknown(99)
    );
    assert_eq!(parallax::Status::Unknown(99).name(), "PX_STATUS_UNKNOWN");
}

#[test]
fn bf16_rounds_to_nearest_even() {
    use parallax::Bf16;
    assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
    assert_eq!(Bf16::from_f32(1.0).to_f32(), 1.0);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even (1.0).
    assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).0, 0x3f80);
    assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).0, 0x3f82);
    assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
}
