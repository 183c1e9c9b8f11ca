//! Element types, reduction ops, and the output buffers an operation may write.
use std::sync::atomic::AtomicUsize;

use crate::client::{overlaps_arena_block, ArenaBuffer};
use crate::{sys, Error, Result};

/// A `px_dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `PX_F32`
    F32,
    /// `PX_F64`
    F64,
    /// `PX_F16`, IEEE binary16 (reduced in f32, rounded once).
    F16,
    /// `PX_BF16`, bfloat16 (reduced in f32, rounded once).
    Bf16,
    /// `PX_I32`
    I32,
    /// `PX_I64`
    I64,
}

impl DType {
    /// The raw `px_dtype` value.
    pub fn raw(self) -> sys::px_dtype {
        match self {
            DType::F32 => sys::PX_F32,
            DType::F64 => sys::PX_F64,
            DType::F16 => sys::PX_F16,
            DType::Bf16 => sys::PX_BF16,
            DType::I32 => sys::PX_I32,
            DType::I64 => sys::PX_I64,
        }
    }
}

/// A `px_reduce_op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `PX_SUM` (integers wrap).
    Sum,
    /// `PX_MEAN`: the sum divided by the number of workers (integers truncate).
    Mean,
    /// `PX_MIN` (NaN in any input gives NaN).
    Min,
    /// `PX_MAX` (NaN in any input gives NaN).
    Max,
    /// `PX_PROD` (ABI 1.9; integers wrap, f16/bf16 multiply in f32).
    Prod,
}

impl ReduceOp {
    /// The raw `px_reduce_op` value.
    pub fn raw(self) -> sys::px_reduce_op {
        match self {
            ReduceOp::Sum => sys::PX_SUM,
            ReduceOp::Mean => sys::PX_MEAN,
            ReduceOp::Min => sys::PX_MIN,
            ReduceOp::Max => sys::PX_MAX,
            ReduceOp::Prod => sys::PX_PROD,
        }
    }
}

/// IEEE binary16 as its bits: Rust has no stable `f16`, and the daemon does the arithmetic.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// bfloat16 as its bits (the upper half of an `f32`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }

    /// `x` rounded to the nearest bfloat16, ties to even (NaN stays a quiet NaN).
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        let rounding = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(rounding) >> 16) as u16)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

/// An element type libparallax reduces: `f32`, `f64`, `i32`, `i64`, [`F16`], [`Bf16`].
/// Sealed: the dtype must match the bytes, or the daemon would misread the buffer.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The `px_dtype` of this type.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f64 {
    const DTYPE: DType = DType::F64;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for F16 {
    const DTYPE: DType = DType::F16;
}
impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
}

pub(crate) mod out {
    use super::*;

    /// What an operation needs of its output: where, how long, and the in-flight count
    /// of the arena buffer it is (None for ordinary memory).
    pub struct OutParts<'a, T> {
        pub ptr: *mut T,
        pub len: usize,
        pub busy: Option<&'a AtomicUsize>,
    }

    pub trait SealedOut<T> {
        fn out_parts(&mut self) -> Result<OutParts<'_, T>>;
    }
}

use out::{OutParts, SealedOut};

/// Memory an operation may write its result into: a slice, `Vec` or array of ordinary
/// memory, or an [`ArenaBuffer`] passed whole. A slice into an arena is refused: see the
/// crate documentation on `mem::forget`.
pub trait OutBuffer<T: Element>: SealedOut<T> {}

fn ordinary<T>(ptr: *mut T, len: usize) -> Result<OutParts<'static, T>> {
    let bytes = len * std::mem::size_of::<T>();
    if overlaps_arena_block(ptr as usize, bytes) {
        return Err(Error::invalid(
            "an output buffer lies in the shared arena: pass its ArenaBuffer itself \
             (&mut buffer), not a slice of it, so it stays locked while parallaxd writes it",
        ));
    }
    Ok(OutParts {
        ptr,
        len,
        busy: None,
    })
}

impl<T: Element> SealedOut<T> for [T] {
    fn out_parts(&mut self) -> Result<OutParts<'_, T>> {
        ordinary(self.as_mut_ptr(), self.len())
    }
}
impl<T: Element> OutBuffer<T> for [T] {}

impl<T: Element> SealedOut<T> for Vec<T> {
    fn out_parts(&mut self) -> Result<OutParts<'_, T>> {
        ordinary(self.as_mut_ptr(), self.len())
    }
}
impl<T: Element> OutBuffer<T> for Vec<T> {}

impl<T: Element, const N: usize> SealedOut<T> for [T; N] {
    fn out_parts(&mut self) -> Result<OutParts<'_, T>> {
        ordinary(self.as_mut_ptr(), N)
    }
}
impl<T: Element, const N: usize> OutBuffer<T> for [T; N] {}

impl<'c, T: Element> SealedOut<T> for ArenaBuffer<'c, T> {
    fn out_parts(&mut self) -> Result<OutParts<'_, T>> {
        let (ptr, len, busy) = self.parts_for_operation()?;
        Ok(OutParts {
            ptr,
            len,
            busy: Some(busy),
        })
    }
}
impl<'c, T: Element> OutBuffer<T> for ArenaBuffer<'c, T> {}
