//! Log-linear histogram buckets, computed in the kernel and turned into hdrhistogram in
//! userspace.
//!
//! Values below `2^SUB_BITS` get one bucket each (exact). Above, every power of two is split
//! into `2^SUB_BITS` equal buckets, so a bucket's width is at most `1/2^SUB_BITS` of its lower
//! bound. Reporting the bucket midpoint bounds the relative error by `1/2^(SUB_BITS+1)`:
//! 1.6 % with `SUB_BITS = 5`, inside the 2 % the reports promise at every percentile.

pub const SUB_BITS: u32 = 5;
pub const SUB_COUNT: u64 = 1 << SUB_BITS;
/// Largest value bucketed exactly; everything beyond lands in the last bucket.
pub const MAX_VALUE: u64 = (1 << 48) - 1;
/// Number of buckets needed for values up to `MAX_VALUE`.
pub const BUCKETS: u32 = (48 - SUB_BITS + 1) * (SUB_COUNT as u32);

/// Floor of log2 for `v > 0`, written as a fixed sequence of branches because the BPF
/// backend has no count-leading-zeros instruction and the verifier dislikes loops.
#[inline(always)]
pub fn log2_floor(mut v: u64) -> u32 {
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    r
}

/// Bucket index of `v`.
#[inline(always)]
pub fn bucket_of(v: u64) -> u32 {
    let v = if v > MAX_VALUE { MAX_VALUE } else { v };
    if v < SUB_COUNT {
        return v as u32;
    }
    let exp = log2_floor(v); // >= SUB_BITS
    let shift = exp - SUB_BITS;
    let sub = ((v >> shift) - SUB_COUNT) as u32;
    (shift + 1) * SUB_COUNT as u32 + sub
}

/// Smallest value that falls in bucket `b`.
pub fn bucket_low(b: u32) -> u64 {
    let sc = SUB_COUNT as u32;
    if b < sc {
        return b as u64;
    }
    let shift = b / sc - 1;
    let sub = (b % sc) as u64;
    (SUB_COUNT + sub) << shift
}

/// Largest value that falls in bucket `b`.
pub fn bucket_high(b: u32) -> u64 {
    bucket_low(b + 1) - 1
}

/// The value reported for bucket `b`: the midpoint, which halves the worst-case error.
pub fn bucket_mid(b: u32) -> u64 {
    let lo = bucket_low(b);
    lo + (bucket_high(b) - lo) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_ordered() {
        for b in 0..BUCKETS - 1 {
            assert_eq!(bucket_high(b) + 1, bucket_low(b + 1), "bucket {b}");
            assert_eq!(bucket_of(bucket_low(b)), b);
            assert_eq!(bucket_of(bucket_high(b)), b);
        }
    }

    #[test]
    fn midpoint_error_is_below_two_percent() {
        let mut v = 1u64;
        while v < MAX_VALUE {
            let mid = bucket_mid(bucket_of(v));
            let err = (mid as f64 - v as f64).abs() / v as f64;
            assert!(err <= 0.016, "v={v} mid={mid} err={err}");
            v = v + v / 7 + 1;
        }
    }

    #[test]
    fn log2_matches_std() {
        for s in 0..64 {
            let v = 1u64 << s;
            assert_eq!(log2_floor(v), s);
            assert_eq!(log2_floor(v | (v >> 1)), s);
        }
    }
}
