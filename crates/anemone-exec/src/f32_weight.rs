//! f32 projection weights (1×1 conv, linear) read in place from the package's bytes: no
//! decoded copy, so they stay where the package's weights were loaded (a file map, in huge pages
//! where the kernel gives them: [`anemone_mil::huge_pages`]). The values are the decoded
//! constant's bit for bit (the bytes are little-endian f32, read as they are), and every step
//! reads them as it would read that constant.

use anemone_mil::{DType, TensorData};

/// A projection weight `[O, I, 1…]` (or `[O, I]`) of f32 values held in the package's bytes.
pub(crate) struct F32Weight {
    pub shape: Vec<usize>,
    data: TensorData,
}

impl F32Weight {
    /// An f32 const of a pointwise projection shape whose bytes can be read as f32 in place
    /// (aligned, on a little-endian machine), else `None` (then it is decoded as usual).
    pub fn of(value: &TensorData) -> Option<Self> {
        let shape = value.shape();
        let pointwise = shape.len() >= 2 && shape[2..].iter().all(|&d| d == 1);
        if value.dtype() != DType::F32 || !pointwise || cfg!(target_endian = "big") {
            return None;
        }
        let numel: usize = shape.iter().product();
        let weight = F32Weight {
            shape: shape.to_vec(),
            data: value.clone(),
        };
        (weight.in_place()?.len() == numel).then_some(weight)
    }

    fn in_place(&self) -> Option<&[f32]> {
        // SAFETY: f32 is a plain 4-byte type for which every bit pattern is a value; align_to
        // only reinterprets the aligned middle part.
        let (head, values, tail) = unsafe { self.data.bytes().align_to::<f32>() };
        (head.is_empty() && tail.is_empty()).then_some(values)
    }

    /// The weight's values, row-major.
    pub fn values(&self) -> &[f32] {
        // `of` checked that the bytes read in place
        self.in_place().unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_the_decoded_constant_bit_for_bit() {
        let values: Vec<f32> = (0..24)
            .map(|i| f32::from_bits(0x3f80_0000 ^ (i * 0x0101_7f3b)))
            .chain([f32::NAN, -0.0, f32::INFINITY, f32::MIN_POSITIVE / 8.0])
            .collect();
        let t = TensorData::from_f32([7, 4, 1, 1], &values).unwrap();
        let w = F32Weight::of(&t).expect("an aligned f32 projection weight");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(w.values()), bits(&t.to_f32_vec()));
        assert_eq!(w.shape, [7, 4, 1, 1]);
        // not a projection weight: decoded as usual
        let spatial = TensorData::from_f32([2, 2, 3, 1], &values[..12]).unwrap();
        assert!(F32Weight::of(&spatial).is_none());
        let halves: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
        let half = TensorData::from_f16([7, 4], &halves).unwrap();
        assert!(F32Weight::of(&half).is_none());
    }
}
