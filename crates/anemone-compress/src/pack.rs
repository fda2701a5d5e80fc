//! Sub-byte packing as weight.bin stores it: element `i` occupies bits `i·n .. i·n + n`,
//! least significant bit first.

use rayon::prelude::*;

/// Packs the low `bits` bits of each code (bits ∈ 1..=8).
pub(crate) fn pack_bits(codes: &[u8], bits: usize) -> Vec<u8> {
    assert!((1..=8).contains(&bits), "pack_bits: {bits} bits");
    let mut out = vec![0u8; (codes.len() * bits).div_ceil(8)];
    if bits == 8 {
        out.copy_from_slice(codes);
        return out;
    }
    let mask = ((1u16 << bits) - 1) as u64;
    // 8 codes fill exactly `bits` bytes, so chunks of 8 codes pack independently
    const CODES_PER_JOB: usize = 8 * 4096;
    out.par_chunks_mut(CODES_PER_JOB / 8 * bits)
        .zip(codes.par_chunks(CODES_PER_JOB))
        .for_each(|(out, codes)| {
            for (o, c) in out.chunks_mut(bits).zip(codes.chunks(8)) {
                let mut word = 0u64;
                for (i, &v) in c.iter().enumerate() {
                    word |= (v as u64 & mask) << (i * bits);
                }
                let bytes = word.to_le_bytes();
                o.copy_from_slice(&bytes[..o.len()]);
            }
        });
    out
}

/// Two's-complement int4 values (given as int8 bytes in [-8, 7]) packed two per byte, low
/// nibble first.
pub(crate) fn pack_int4(values: &[u8]) -> Vec<u8> {
    pack_bits(values, 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anemone_mil::{DType, TensorData};

    #[test]
    fn matches_the_mil_packer_for_every_width_and_length() {
        for (bits, dtype) in [
            (1, DType::U1),
            (2, DType::U2),
            (3, DType::U3),
            (4, DType::U4),
            (6, DType::U6),
            (8, DType::U8),
        ] {
            // lengths around the 8-code and job boundaries
            for n in [1usize, 7, 8, 9, 31, 8 * 4096 - 1, 8 * 4096, 8 * 4096 + 13] {
                let codes: Vec<u8> = (0..n)
                    .map(|i| ((i * 2654435761) >> 7) as u8 & ((1u16 << bits) - 1) as u8)
                    .collect();
                let ints: Vec<i32> = codes.iter().map(|&c| c as i32).collect();
                let reference = TensorData::pack_ints(dtype, vec![n], &ints).unwrap();
                assert_eq!(
                    pack_bits(&codes, bits),
                    reference.bytes(),
                    "{bits} bits, {n} codes"
                );
            }
        }
    }
}
