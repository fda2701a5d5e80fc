//! Sub-byte packing (LSB-first) and blob dtype mapping against hand-computed bytes.

use anemone_mil::{blob_dtype_code, DType, TensorData};

#[test]
fn uint4_packs_low_nibble_first() {
    let t = TensorData::pack_ints(DType::U4, vec![3], &[1, 2, 15]).unwrap();
    assert_eq!(t.bytes(), &[0x21, 0x0F]);
    assert_eq!(t.to_i32_vec().unwrap(), [1, 2, 15]);
}

#[test]
fn int4_is_twos_complement() {
    let t = TensorData::pack_ints(DType::I4, vec![2], &[-1, -8]).unwrap();
    assert_eq!(t.bytes(), &[0x8F]);
    assert_eq!(t.to_i32_vec().unwrap(), [-1, -8]);
    assert!(TensorData::pack_ints(DType::I4, vec![1], &[8]).is_err());
}

#[test]
fn uint6_and_uint3_straddle_bytes() {
    // naive reference: concatenate bits LSB-first
    fn naive(bits: usize, vals: &[i32]) -> Vec<u8> {
        let mut out = vec![0u8; (vals.len() * bits).div_ceil(8)];
        for (i, v) in vals.iter().enumerate() {
            for b in 0..bits {
                if (v >> b) & 1 == 1 {
                    let pos = i * bits + b;
                    out[pos / 8] |= 1 << (pos % 8);
                }
            }
        }
        out
    }
    let v6: Vec<i32> = (0..11).map(|i| (i * 23 + 5) % 64).collect();
    let t = TensorData::pack_ints(DType::U6, vec![11], &v6).unwrap();
    assert_eq!(t.bytes(), naive(6, &v6).as_slice());
    assert_eq!(t.to_i32_vec().unwrap(), v6);
    let v3: Vec<i32> = (0..13).map(|i| (i * 5 + 1) % 8).collect();
    let t = TensorData::pack_ints(DType::U3, vec![13], &v3).unwrap();
    assert_eq!(t.bytes(), naive(3, &v3).as_slice());
    assert_eq!(t.to_i32_vec().unwrap(), v3);
    let v1 = [1, 0, 1, 1, 0, 0, 0, 1, 1];
    let t = TensorData::pack_ints(DType::U1, vec![9], &v1).unwrap();
    assert_eq!(t.bytes(), &[0b1000_1101, 0b1]);
}

#[test]
fn byte_lengths_are_checked() {
    assert!(TensorData::from_bytes(DType::F16, vec![3], vec![0u8; 5]).is_err());
    assert!(TensorData::from_bytes(DType::U4, vec![3], vec![0u8; 2]).is_ok());
    assert!(TensorData::from_f32(vec![2, 2], &[1.0; 3]).is_err());
}

#[test]
fn blob_dtype_codes() {
    let codes: Vec<(DType, u32)> = DType::ALL
        .iter()
        .filter_map(|&d| blob_dtype_code(d).map(|c| (d, c)))
        .collect();
    let want = [
        (DType::F16, 1),
        (DType::F32, 2),
        (DType::I32, 14),
        (DType::I8, 4),
        (DType::U8, 3),
        (DType::I4, 8),
        (DType::U1, 9),
        (DType::U2, 10),
        (DType::U3, 12),
        (DType::U4, 11),
        (DType::U6, 13),
    ];
    assert_eq!(codes, want);
}
