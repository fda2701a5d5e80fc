//! f32 buffers whose element 0 sits on a 64-byte boundary: the activations the prefill matrix
//! product reads as `x`, so that every 16-value row load of a row that is a multiple of 16 long
//! touches one cache line (and the product needs no aligned copy of them).

/// One cache line of f32.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub [f32; 16]);

/// `len` f32, 64-byte aligned, zeroed when made.
pub(super) struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        Self {
            lines: vec![Line([0.0; 16]); len.div_ceil(16)],
            len,
        }
    }

    /// A buffer of `len` values from `rows` rows of `n` values each (`values` holds them back
    /// to back), each row starting on a 64-byte boundary: the row stride is `n` rounded up to 16
    /// (the gaps are zero). Returns the buffer and the stride. (The AVX-512 product's copy of
    /// an x that is not aligned.)
    #[cfg(any(target_arch = "x86_64", test))]
    pub fn rows_from(values: &[f32], rows: usize, n: usize) -> (Self, usize) {
        let stride = n.next_multiple_of(16);
        let mut buf = Self::zeroed(rows * stride);
        if n > 0 {
            for (row, out) in values
                .chunks_exact(n)
                .take(rows)
                .zip(buf.chunks_exact_mut(stride))
            {
                out[..n].copy_from_slice(row);
            }
        }
        (buf, stride)
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` over `[f32; 16]` (no padding: 64 bytes, align 64), so the
        // lines are `16 · lines.len() ≥ len` contiguous, initialised f32.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const f32, self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut f32, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_rows_keep_their_values() {
        for n in [0usize, 1, 15, 16, 17, 896] {
            let values: Vec<f32> = (0..3 * n).map(|i| i as f32 + 0.5).collect();
            let (buf, stride) = AlignedBuf::rows_from(&values, 3, n);
            assert_eq!(buf.as_ptr() as usize % 64, 0);
            assert_eq!(stride % 16, 0);
            for r in 0..3 {
                assert_eq!(
                    &buf[r * stride..r * stride + n],
                    &values[r * n..(r + 1) * n]
                );
                assert!(buf[r * stride + n..(r + 1) * stride]
                    .iter()
                    .all(|&v| v == 0.0));
            }
        }
        let mut z = AlignedBuf::zeroed(33);
        assert_eq!((z.len(), z.as_ptr() as usize % 64), (33, 0));
        z[32] = 1.0;
        assert!(z[..32].iter().all(|&v| v == 0.0));
    }
}
