//! The compressed matvec against decompress-then-fp16-matvec, bit for bit.

use super::*;
use crate::decompress::{blockwise_shift_scale, lut_to_dense};
use crate::kernels::fp16acc;
use anemone_testkit::Rng;

/// Every matvec of `packed` equals the fp16 matvec of `expanded` (same accumulation), and its
/// wide expansion equals `expanded`.
fn assert_same(packed: &HalfWeight, expanded: &crate::Tensor, rng: &mut Rng) {
    assert_eq!(expanded.dtype, DType::F16);
    let (rows, k) = packed.rows_cols();
    let w16: Vec<f16> = expanded.data.iter().map(|&v| f16::from_f32(v)).collect();
    let x = rng.floats(k, 3.0);
    for acc in [Accumulation::F32, Accumulation::Fp16Blocks] {
        let mut want = vec![0.0; rows];
        match acc {
            Accumulation::F32 => linalg::matvec_f16(&mut want, &w16, &x).unwrap(),
            Accumulation::Fp16Blocks => fp16acc::matvec_f16(&mut want, &w16, &x).unwrap(),
        }
        let mut got = vec![0.0; rows];
        packed.matvec(&mut got, &x, acc).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{acc:?}");
    }
    packed.with_widened(|w| assert_eq!(w, expanded.data.as_slice()));
}

/// On a CPU with the fused kernels, 8-bit and 4-bit weights whose rows are a multiple of 32 and
/// blocks a multiple of 16 columns take them (so the comparisons above test them).
fn assert_fused_where_covered(w: &HalfWeight) {
    if !quant::available() {
        return;
    }
    let (per, k) = match &w.data {
        WeightData::Half(_) => return,
        WeightData::ShiftScale { data, blocks, .. } => {
            if data.dtype().bits() % 4 != 0 {
                return;
            }
            (blocks.cols_per, w.shape[1])
        }
        WeightData::Lut {
            indices, blocks, ..
        } => {
            if indices.dtype() != DType::U4 {
                return;
            }
            (blocks.cols_per, w.shape[1])
        }
    };
    assert_eq!(w.fused(), k % 32 == 0 && per % 16 == 0, "{:?}", w.shape);
}

fn ints(rng: &mut Rng, dtype: DType, shape: Vec<usize>) -> TensorData {
    let (lo, hi) = match dtype {
        DType::I8 => (-128, 127),
        DType::U8 => (0, 255),
        DType::I4 => (-8, 7),
        other => (0, (1 << other.bits()) - 1),
    };
    let n = shape.iter().product();
    let v: Vec<i32> = (0..n).map(|_| rng.int(lo, hi)).collect();
    TensorData::pack_ints(dtype, shape, &v).unwrap()
}

#[test]
fn shift_scale_matvec_is_the_expanded_fp16_matvec() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // (data dtype, weight shape, scale shape, offset: none / same dtype / fp16 / fp32);
    // 320×1024 reaches the parallel path
    type Case = (DType, Vec<usize>, Vec<usize>, Option<DType>);
    let cases: [Case; 16] = [
        (DType::I8, vec![320, 1024, 1, 1], vec![320, 1, 1, 1], None),
        (DType::I8, vec![96, 64], vec![96, 4], Some(DType::I8)),
        (
            DType::I8,
            vec![64, 96, 1, 1],
            vec![64, 3, 1, 1],
            Some(DType::F16),
        ),
        (
            DType::U8,
            vec![64, 96, 1, 1],
            vec![8, 3, 1, 1],
            Some(DType::F32),
        ),
        (DType::I4, vec![64, 128, 1, 1], vec![64, 4, 1, 1], None),
        (DType::U4, vec![48, 64], vec![48, 2], Some(DType::F16)),
        (
            DType::U4,
            vec![32, 40, 1, 1],
            vec![1, 1, 1, 1],
            Some(DType::U4),
        ),
        (DType::I4, vec![40, 96], vec![20, 6], Some(DType::I4)),
        (
            DType::I4,
            vec![24, 64, 1, 1],
            vec![24, 2, 1, 1],
            Some(DType::F32),
        ),
        (DType::U8, vec![24, 64], vec![24, 2], Some(DType::U8)),
        // more than 16 blocks a row (scales widened 16 at a time, the last run partial) and
        // row counts that leave a tail after the four-row passes
        (DType::I8, vec![13, 1056], vec![13, 33], None),
        (
            DType::I4,
            vec![7, 576, 1, 1],
            vec![7, 36, 1, 1],
            Some(DType::F16),
        ),
        (DType::U8, vec![21, 544], vec![21, 34], Some(DType::U8)),
        (DType::I4, vec![37, 1056], vec![37, 33], None),
        (DType::I8, vec![6, 512], vec![3, 32], Some(DType::F32)),
        (DType::U4, vec![11, 1024], vec![11, 16], Some(DType::U4)),
    ];
    for (dtype, shape, sshape, odt) in cases {
        let data = ints(&mut rng, dtype, shape.clone());
        let ns: usize = sshape.iter().product();
        // scales of very different magnitudes, so products round (and overflow) in fp16
        let svals: Vec<f32> = (0..ns)
            .map(|i| rng.float(1e-3 * 10f32.powi(i as i32 % 8)))
            .collect();
        let scale = TensorData::f16_from_f32(sshape.clone(), &svals).unwrap();
        let offset = odt.map(|o| match o {
            DType::F16 => TensorData::f16_from_f32(sshape.clone(), &rng.floats(ns, 4.0)).unwrap(),
            DType::F32 => TensorData::from_f32(sshape.clone(), &rng.floats(ns, 4.0)).unwrap(),
            int => ints(&mut rng, int, sshape.clone()),
        });
        let expanded = blockwise_shift_scale(&data, &scale, offset.as_ref()).unwrap();
        let packed = HalfWeight::shift_scale(&data, &scale, offset.as_ref())
            .unwrap_or_else(|| panic!("{dtype} {shape:?} not kept compressed"));
        assert_fused_where_covered(&packed);
        assert_same(&packed, &expanded, &mut rng);
    }
}

#[test]
fn lut_matvec_is_the_expanded_fp16_matvec() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    // (index dtype, weight shape, palette-group shape)
    let cases: [(DType, Vec<usize>, Vec<usize>); 16] = [
        (DType::U4, vec![320, 1024, 1, 1], vec![1, 1, 1, 1]),
        (DType::U4, vec![64, 96], vec![8, 1]),
        (DType::U4, vec![64, 96, 1, 1], vec![4, 3, 1, 1]),
        (DType::U4, vec![16, 64], vec![16, 4]),
        (DType::U2, vec![40, 64, 1, 1], vec![5, 2, 1, 1]),
        (DType::U3, vec![24, 40], vec![1, 1]),
        (DType::U8, vec![16, 32, 1, 1], vec![16, 1, 1, 1]),
        // many column blocks, a tail after the four-row passes
        (DType::U4, vec![13, 1056], vec![13, 33]),
        (DType::U4, vec![9, 576, 1, 1], vec![9, 36, 1, 1]),
        // rows formed 64 indices a step (`kernels::lut`): four-row runs sharing a palette,
        // runs crossing a row group, column blocks, index widths that straddle bytes
        (DType::U8, vec![64, 192, 1, 1], vec![2, 1, 1, 1]),
        (DType::U8, vec![30, 320], vec![5, 1]),
        (DType::U6, vec![21, 128], vec![3, 1]),
        (DType::U3, vec![12, 576, 1, 1], vec![1, 1, 1, 1]),
        (DType::U8, vec![8, 256], vec![2, 2]),
        // short rows under one palette and under one a row (formed row by row), three rows
        // after the four-row passes
        (DType::U8, vec![103, 64], vec![1, 1]),
        (DType::U8, vec![103, 64, 1, 1], vec![103, 1, 1, 1]),
    ];
    for (dtype, shape, gshape) in cases {
        let indices = ints(&mut rng, dtype, shape.clone());
        let palette = 1usize << dtype.bits();
        let mut lshape = gshape.clone();
        lshape.extend([palette, 1]);
        let n: usize = lshape.iter().product();
        let lut = TensorData::f16_from_f32(lshape, &rng.floats(n, 2.0)).unwrap();
        let expanded = lut_to_dense(&indices, &lut).unwrap();
        let packed = HalfWeight::lut(&indices, &lut)
            .unwrap_or_else(|| panic!("{dtype} {shape:?} not kept compressed"));
        assert_fused_where_covered(&packed);
        assert_same(&packed, &expanded, &mut rng);
    }
}

#[test]
fn non_projection_payloads_are_not_kept_compressed() {
    let mut rng = Rng(7);
    let data = ints(&mut rng, DType::I8, vec![8, 8, 3, 3]);
    let scale = TensorData::f16_from_f32(vec![8, 1, 1, 1], &[0.5; 8]).unwrap();
    assert!(
        HalfWeight::shift_scale(&data, &scale, None).is_none(),
        "3×3 kernel"
    );
    let data = ints(&mut rng, DType::I8, vec![8, 8]);
    let scale32 = TensorData::from_f32(vec![8, 1], &[0.5; 8]).unwrap();
    assert!(
        HalfWeight::shift_scale(&data, &scale32, None).is_none(),
        "fp32 result"
    );
}

#[test]
fn fused_rows_round_like_decompress_at_the_extremes() {
    // scales whose products are fp16 subnormals, ties, and overflow to ±inf; each row's dot
    // and expansion are compared with the row-forming path bit for bit
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
    let svals = [6.0e-8, 1.0e-5, 3.1e-5, 0.5, 0.333, 600.0, 4000.0, 65504.0];
    for dtype in [DType::I8, DType::U8, DType::I4, DType::U4] {
        let shape = vec![8, 64];
        let data = ints(&mut rng, dtype, shape.clone());
        let scale = TensorData::f16_from_f32(vec![8, 2], &[svals, svals].concat()).unwrap();
        for offset in [
            None,
            Some(TensorData::f16_from_f32(vec![8, 2], &rng.floats(16, 3.0)).unwrap()),
            Some(TensorData::from_f32(vec![8, 2], &rng.floats(16, 3.0)).unwrap()),
        ] {
            let expanded = blockwise_shift_scale(&data, &scale, offset.as_ref()).unwrap();
            let packed = HalfWeight::shift_scale(&data, &scale, offset.as_ref()).unwrap();
            assert_fused_where_covered(&packed);
            assert_same(&packed, &expanded, &mut rng);
        }
    }
}

#[test]
fn fp16_weights_are_read_in_place() {
    let v: Vec<f32> = (0..64).map(|i| i as f32 / 8.0).collect();
    let t = TensorData::f16_from_f32(vec![8, 8], &v).unwrap();
    let w = HalfWeight::half(&t).unwrap();
    let WeightData::Half(h) = &w.data else {
        panic!("not fp16")
    };
    assert!(matches!(h, Halves::Shared(_)), "copied");
    assert_eq!(h.as_slice().as_ptr() as *const u8, t.bytes().as_ptr());
    let back: Vec<f32> = h.as_slice().iter().map(|x| x.to_f32()).collect();
    assert_eq!(back, v);
}

/// fp16 offsets of a shift-scale weight are the package's own bytes (no copy); integer
/// offsets become an fp16 copy of the same values.
#[test]
fn fp16_offsets_are_read_in_place() {
    let mut rng = Rng(0x000F_F5E7);
    let data = ints(&mut rng, DType::I8, vec![8, 64]);
    let scale = TensorData::f16_from_f32(vec![8, 2], &rng.floats(16, 0.1)).unwrap();
    let offset = TensorData::f16_from_f32(vec![8, 2], &rng.floats(16, 3.0)).unwrap();
    let w = HalfWeight::shift_scale(&data, &scale, Some(&offset)).unwrap();
    let WeightData::ShiftScale {
        offset: Some(OffsetValues::F16(h)),
        ..
    } = &w.data
    else {
        panic!("fp16 offsets not kept as fp16")
    };
    assert!(matches!(h, Halves::Shared(_)), "copied");
    assert_eq!(h.as_bits().as_ptr() as *const u8, offset.bytes().as_ptr());
    let want: Vec<u16> = offset
        .bytes()
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(h.as_bits(), want.as_slice());
    let expanded = blockwise_shift_scale(&data, &scale, Some(&offset)).unwrap();
    assert_same(&w, &expanded, &mut rng);

    let int_offset = ints(&mut rng, DType::I8, vec![8, 2]);
    let w = HalfWeight::shift_scale(&data, &scale, Some(&int_offset)).unwrap();
    let WeightData::ShiftScale {
        offset: Some(OffsetValues::F16(h)),
        ..
    } = &w.data
    else {
        panic!("int8 offsets not kept as fp16")
    };
    let want: Vec<f32> = int_offset.to_f32_vec();
    let got: Vec<f32> = h.as_slice().iter().map(|v| v.to_f32()).collect();
    assert_eq!(got, want);
}

#[test]
fn a_fused_group_is_each_weights_own_matvec() {
    if !quant::available() {
        return;
    }
    let mut rng = Rng(0x51_7CC1_B727_220A);
    let k = 576;
    // q/k/v-like rows; int8 with fp16 offsets, symmetric int8, int4 with int4 offsets, blocks
    // of 32 and 16 columns (the last also a tail after the four-row passes)
    let cases: [(DType, usize, usize, Option<DType>); 4] = [
        (DType::I8, 576, 32, Some(DType::F16)),
        (DType::I8, 192, 32, None),
        (DType::I4, 192, 16, Some(DType::I4)),
        (DType::U8, 66, 64, Some(DType::U8)),
    ];
    let weights: Vec<HalfWeight> = cases
        .iter()
        .map(|&(dtype, rows, per, odt)| {
            let data = ints(&mut rng, dtype, vec![rows, k]);
            let sshape = vec![rows, k / per];
            let ns = rows * k / per;
            let svals: Vec<f32> = (0..ns)
                .map(|i| rng.float(1e-3 * (1 + i % 5) as f32))
                .collect();
            let scale = TensorData::f16_from_f32(sshape.clone(), &svals).unwrap();
            let offset = odt.map(|o| match o {
                DType::F16 => {
                    TensorData::f16_from_f32(sshape.clone(), &rng.floats(ns, 4.0)).unwrap()
                }
                int => ints(&mut rng, int, sshape.clone()),
            });
            HalfWeight::shift_scale(&data, &scale, offset.as_ref()).unwrap()
        })
        .collect();
    let x = rng.floats(k, 2.0);
    assert_group_is_own_matvecs(&weights, &x);
    // a weight the kernels do not take (rows of 40 columns): the group reports it
    let odd = HalfWeight::shift_scale(
        &ints(&mut rng, DType::I8, vec![8, 40]),
        &TensorData::f16_from_f32(vec![8, 1], &[0.5; 8]).unwrap(),
        None,
    )
    .unwrap();
    let mut d = [0.0; 8];
    assert!(!HalfWeight::matvec_fused_group(
        &mut [(&odd, &mut d[..])],
        &x[..40]
    ));
}

/// On a team of two, [`HalfWeight::matvec_fused_group`] takes `weights` (one input `x`) and
/// gives each its own matvec's values, bit for bit.
fn assert_group_is_own_matvecs(weights: &[HalfWeight], x: &[f32]) {
    let team = crate::team::Team::shared(2).unwrap();
    crate::team::with_team(&team, || {
        let want: Vec<Vec<f32>> = weights
            .iter()
            .map(|w| {
                let mut d = vec![0.0; w.rows_cols().0];
                w.matvec(&mut d, x, Accumulation::F32).unwrap();
                d
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = weights
            .iter()
            .map(|w| vec![f32::NAN; w.rows_cols().0])
            .collect();
        let mut group: Vec<(&HalfWeight, &mut [f32])> = weights
            .iter()
            .zip(outs.iter_mut())
            .map(|(w, d)| (w, d.as_mut_slice()))
            .collect();
        assert!(HalfWeight::matvec_fused_group(&mut group, x));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (got, want) in outs.iter().zip(&want) {
            assert_eq!(bits(got), bits(want));
        }
    });
}

/// 8-bit palettized q/k/v-like weights (palettes of 32 rows, of 16, one a row; a row count
/// that leaves a tail after the four-row passes) run as one group, each its own matvec's
/// values; with a 4-bit palettized member the group is declined (each runs its own).
#[test]
fn an_8_bit_palettized_group_is_each_weights_own_matvec() {
    if !crate::kernels::lut::matvec8(&mut [0.0; 4], &[0.0; 32], &[0; 128], &[f16::ZERO; 256], 4) {
        return; // no AVX-512 VBMI: these weights run their own matvecs
    }
    let mut rng = Rng(0x8B17_6A0E);
    let k = 576;
    let lut_weight = |rng: &mut Rng, dtype: DType, rows: usize, rows_per: usize| {
        let indices = ints(rng, dtype, vec![rows, k]);
        let palette = 1usize << dtype.bits();
        let lshape = vec![rows / rows_per, 1, palette, 1];
        let lut = TensorData::f16_from_f32(lshape, &rng.floats(rows / rows_per * palette, 2.0));
        HalfWeight::lut(&indices, &lut.unwrap()).unwrap()
    };
    let weights = [
        lut_weight(&mut rng, DType::U8, 576, 32),
        lut_weight(&mut rng, DType::U8, 192, 16),
        lut_weight(&mut rng, DType::U8, 66, 1),
    ];
    let x = rng.floats(k, 2.0);
    assert_group_is_own_matvecs(&weights, &x);
    let mixed = [&weights[1], &lut_weight(&mut rng, DType::U4, 64, 16)];
    let mut outs = [vec![0.0; 192], vec![0.0; 64]];
    let [a, b] = &mut outs;
    assert!(!HalfWeight::matvec_fused_group(
        &mut [(mixed[0], &mut a[..]), (mixed[1], &mut b[..])],
        &x
    ));
}

/// A wide pointwise convolution by a compressed weight (expanded a panel of rows at a time)
/// equals `conv2d` on the whole weight expanded, bit for bit: splittable and unsplittable
/// shapes, 4-bit (fused or not) and 8-bit data, palettes.
#[test]
fn compressed_pointwise_conv_is_the_expanded_conv() {
    use anemone_mil::ConvParams;
    let mut rng = Rng(0xC04E_5EED);
    let p = ConvParams {
        strides: [1, 1],
        pad: [0, 0, 0, 0],
        dilations: [1, 1],
        groups: 1,
    };
    for (o, c, t, dtype) in [
        (1536, 576, 64, DType::I4),
        (300, 576, 7, DType::I8),
        (576, 1536, 64, DType::U4),
        (128, 896, 64, DType::I4),
        (193, 96, 3, DType::U8),
    ] {
        let data = ints(&mut rng, dtype, vec![o, c, 1, 1]);
        let scale =
            TensorData::f16_from_f32(vec![o, c / 32, 1, 1], &rng.floats(o * c / 32, 0.1)).unwrap();
        let offset =
            TensorData::f16_from_f32(vec![o, c / 32, 1, 1], &rng.floats(o * c / 32, 3.0)).unwrap();
        let shift = HalfWeight::shift_scale(&data, &scale, Some(&offset)).unwrap();
        let idx = ints(&mut rng, DType::U4, vec![o, c, 1, 1]);
        let lut =
            TensorData::f16_from_f32(vec![o, 1, 1, 1, 16, 1], &rng.floats(o * 16, 1.0)).unwrap();
        let palettized = HalfWeight::lut(&idx, &lut).unwrap();
        for w in [&shift, &palettized] {
            let x = rng.floats(c * t, 2.0);
            let bias = rng.floats(o, 1.0);
            let (shape_x, out_shape) = ([1, c, 1, t], [1, o, 1, t]);
            let mut want = vec![0.0f32; o * t];
            w.with_widened(|wf| {
                linalg::conv2d(
                    &mut want,
                    &x,
                    &shape_x,
                    wf,
                    &w.shape,
                    Some(&bias),
                    &p,
                    &out_shape,
                    Accumulation::F32,
                )
            })
            .unwrap();
            let mut got = vec![0.0f32; o * t];
            w.pointwise_conv(&mut got, &x, &shape_x, Some(&bias))
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{o}×{c}·{t} {dtype:?}");
        }
    }
}

/// 8-bit data whose blocks hold 16 codes of one progression (`base + step · k`), as a 4-bit
/// source's grid stored in 8 bits; `wide` blocks (one in seven) take a 17th level.
fn grid_codes(
    rng: &mut Rng,
    dtype: DType,
    shape: &[usize],
    sshape: &[usize],
    step: i32,
) -> TensorData {
    let (rows, cols) = (shape[0], shape[1]);
    let (rows_per, cols_per) = (rows / sshape[0], cols / sshape[1]);
    let (lo, hi) = if dtype == DType::I8 {
        (-128, 127)
    } else {
        (0, 255)
    };
    let bases: Vec<i32> = (0..sshape[0] * sshape[1])
        .map(|_| rng.int(lo, hi - 15 * step))
        .collect();
    let v: Vec<i32> = (0..rows * cols)
        .map(|e| {
            let g = e / cols / rows_per * sshape[1] + e % cols / cols_per;
            bases[g] + step * rng.int(0, 15)
        })
        .collect();
    TensorData::pack_ints(dtype, shape.to_vec(), &v).unwrap()
}

#[test]
fn grid_int8_weights_are_held_as_4_bit_codes_forming_the_same_values() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    // (data dtype, shape, scale shape, offset dtype, step of the grid codes, narrowed)
    type Case = (DType, Vec<usize>, Vec<usize>, Option<DType>, i32, bool);
    let cases: [Case; 9] = [
        (
            DType::I8,
            vec![64, 96],
            vec![64, 3],
            Some(DType::F16),
            1,
            true,
        ),
        (
            DType::I8,
            vec![320, 1024, 1, 1],
            vec![320, 32, 1, 1],
            Some(DType::F16),
            1,
            true,
        ),
        (
            DType::U8,
            vec![48, 64],
            vec![48, 2],
            Some(DType::U8),
            1,
            true,
        ),
        (DType::I8, vec![40, 96], vec![20, 6], None, 1, true),
        (
            DType::I8,
            vec![64, 128, 1, 1],
            vec![64, 4, 1, 1],
            Some(DType::F16),
            2,
            true,
        ),
        (
            DType::U8,
            vec![24, 64],
            vec![24, 2],
            Some(DType::F16),
            4,
            true,
        ),
        (
            DType::I8,
            vec![7, 576, 1, 1],
            vec![7, 36, 1, 1],
            Some(DType::F16),
            8,
            true,
        ),
        // fp32 offsets promote (no fp16 rounding of the difference): kept as they are
        (
            DType::I8,
            vec![32, 64],
            vec![32, 2],
            Some(DType::F32),
            1,
            false,
        ),
        // codes over 17 levels in one block: kept as they are
        (
            DType::I8,
            vec![32, 64],
            vec![32, 2],
            Some(DType::F16),
            1,
            false,
        ),
    ];
    for (n, (dtype, shape, sshape, odt, step, narrowed)) in cases.into_iter().enumerate() {
        let mut data = grid_codes(&mut rng, dtype, &shape, &sshape, step);
        if n == 8 {
            // a 17th level in the first block (row 0, columns 0..32)
            let mut v = data.to_i32_vec().unwrap();
            let (lo, hi) = (
                *v[..32].iter().min().unwrap(),
                *v[..32].iter().max().unwrap(),
            );
            v[5] = if lo >= -112 { hi - 16 } else { lo + 16 };
            data = TensorData::pack_ints(dtype, shape.clone(), &v).unwrap();
        }
        let ns: usize = sshape.iter().product();
        // scales of very different magnitudes (products that round, overflow, are subnormal);
        // fractional and integer offsets
        let svals: Vec<f32> = (0..ns)
            .map(|i| rng.float(1e-5 * 10f32.powi(i as i32 % 9)))
            .collect();
        let scale = TensorData::f16_from_f32(sshape.clone(), &svals).unwrap();
        let offset = odt.map(|o| match o {
            DType::F16 => {
                let o: Vec<f32> = (0..ns)
                    .map(|i| {
                        rng.float(40.0).round() + if i % 3 == 0 { 0.0 } else { rng.float(1.0) }
                    })
                    .collect();
                TensorData::f16_from_f32(sshape.clone(), &o).unwrap()
            }
            DType::F32 => TensorData::from_f32(sshape.clone(), &rng.floats(ns, 4.0)).unwrap(),
            int => ints(&mut rng, int, sshape.clone()),
        });
        let expanded = blockwise_shift_scale(&data, &scale, offset.as_ref()).unwrap();
        let packed = HalfWeight::shift_scale(&data, &scale, offset.as_ref()).unwrap();
        let WeightData::ShiftScale { data: held, .. } = &packed.data else {
            panic!("case {n}: not a shift-scale weight");
        };
        let want = if narrowed { DType::U4 } else { dtype };
        assert_eq!(held.dtype(), want, "case {n}: {shape:?} step {step}");
        assert_fused_where_covered(&packed);
        assert_same(&packed, &expanded, &mut rng);
        let mut scratch = Scratch::new(shape[1]);
        let mut row = vec![f16::ZERO; shape[1]];
        for r in [0, shape[0] / 2, shape[0] - 1] {
            packed.row(r, &mut scratch, &mut row);
            let bits = |v: &[f32]| {
                v.iter()
                    .map(|x| f16::from_f32(*x).to_bits())
                    .collect::<Vec<_>>()
            };
            let got: Vec<u16> = row.iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                got,
                bits(&expanded.data[r * shape[1]..(r + 1) * shape[1]]),
                "case {n} row {r}"
            );
        }
    }
}
