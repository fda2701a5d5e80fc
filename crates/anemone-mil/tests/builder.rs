//! Shape and type inference as ops are added, and the typed errors for bad graphs.

use anemone_mil::{
    ConvParams, DType, FunctionBuilder, MilError, Op, Program, SpecVersion, TensorData, TensorType,
    Var,
};

fn f16(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F16, shape.to_vec())
}

fn shape(b: &FunctionBuilder, v: Var) -> Vec<usize> {
    b.tensor_type(v).unwrap().shape.clone()
}

fn weight(b: &mut FunctionBuilder, name: &str, s: &[usize]) -> Var {
    let n: usize = s.iter().product();
    b.constant(
        name,
        TensorData::f16_from_f32(s.to_vec(), &vec![0.5; n]).unwrap(),
    )
    .unwrap()
}

fn mismatch_detail(e: MilError, op: &str) -> String {
    match e {
        MilError::TypeMismatch { op: o, detail, .. } if o == op => detail,
        other => panic!("expected a type mismatch on `{op}`, got {other:?}"),
    }
}

#[test]
fn broadcasting_follows_numpy() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[2, 1, 4])).unwrap();
    let y = b.input("y", f16(&[3, 1])).unwrap();
    let s = b.add("s", x, y).unwrap();
    assert_eq!(shape(&b, s), [2, 3, 4]);
    let z = b.input("z", f16(&[5])).unwrap();
    let e = b.mul("bad", x, z).unwrap_err();
    assert!(mismatch_detail(e, "bad").contains("do not broadcast"));
    let i = b.input("i", TensorType::new(DType::I32, [4])).unwrap();
    let e = b.add("mixed", x, i).unwrap_err();
    assert!(mismatch_detail(e, "mixed").contains("dtypes differ"));
    let e = b.real_div("int_div", i, i).unwrap_err();
    assert!(mismatch_detail(e, "int_div").contains("fp16/fp32"));
    assert_eq!(shape(&b, b.function().find_value("s").unwrap()), [2, 3, 4]);
}

#[test]
fn conv_output_shapes() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[1, 8, 10, 12])).unwrap();
    let w = weight(&mut b, "w", &[16, 8, 1, 1]);
    let y = b.conv1x1("pw", x, w, None).unwrap();
    assert_eq!(shape(&b, y), [1, 16, 10, 12]);
    // 3x3, stride 2, pad 1 each side, dilation 1: floor((10 + 2 - 3) / 2) + 1 = 5, (12+2-3)/2+1 = 6
    let w3 = weight(&mut b, "w3", &[4, 8, 3, 3]);
    let p = ConvParams {
        strides: [2, 2],
        pad: [1, 1, 1, 1],
        ..Default::default()
    };
    let y = b.conv("c3", x, w3, None, p).unwrap();
    assert_eq!(shape(&b, y), [1, 4, 5, 6]);
    // dilation 2 on a 3x3 kernel spans 5: 10 - 5 + 1 = 6, 12 - 5 + 1 = 8
    let p = ConvParams {
        dilations: [2, 2],
        ..Default::default()
    };
    let y = b.conv("dil", x, w3, None, p).unwrap();
    assert_eq!(shape(&b, y), [1, 4, 6, 8]);
    // groups: weight [O, C/g, kh, kw]
    let wg = weight(&mut b, "wg", &[8, 2, 1, 1]);
    let y = b
        .conv(
            "grouped",
            x,
            wg,
            None,
            ConvParams {
                groups: 4,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(shape(&b, y), [1, 8, 10, 12]);
    let e = b
        .conv(
            "bad_groups",
            x,
            wg,
            None,
            ConvParams {
                groups: 3,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(mismatch_detail(e, "bad_groups").contains("groups 3"));
    let bias = weight(&mut b, "bias", &[5]);
    let e = b.conv1x1("bad_bias", x, w, Some(bias)).unwrap_err();
    assert!(mismatch_detail(e, "bad_bias").contains("bias must be [16]"));
    let big = weight(&mut b, "big", &[4, 8, 11, 1]);
    let e = b
        .conv("too_big", x, big, None, ConvParams::default())
        .unwrap_err();
    assert!(mismatch_detail(e, "too_big").contains("does not fit"));
}

#[test]
fn matmul_transposes_and_batch_broadcast() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[2, 1, 5, 3])).unwrap();
    let y = b.input("y", f16(&[4, 7, 3])).unwrap();
    let e = b.matmul("plain", x, y, false, false).unwrap_err();
    assert!(mismatch_detail(e, "plain").contains("inner dims differ"));
    let m = b.matmul("xyt", x, y, false, true).unwrap();
    assert_eq!(shape(&b, m), [2, 4, 5, 7]);
    let m = b.matmul("xtx", x, x, true, false).unwrap();
    assert_eq!(shape(&b, m), [2, 1, 3, 3]);
}

#[test]
fn linear_needs_const_weight() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[2, 8])).unwrap();
    let w = weight(&mut b, "w", &[4, 8]);
    let y = b.linear("lin", x, w, None).unwrap();
    assert_eq!(shape(&b, y), [2, 4]);
    let dynamic = b.input("dyn_w", f16(&[4, 8])).unwrap();
    let e = b.linear("lin_dyn", x, dynamic, None).unwrap_err();
    assert!(mismatch_detail(e, "lin_dyn").contains("const"));
}

#[test]
fn slices_concat_split_reshape_transpose() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[1, 8, 1, 10])).unwrap();
    let s = b
        .slice_by_index("s", x, &[0, 2, 0, 1], &[1, 6, 1, -1], Some(&[1, 1, 1, 2]))
        .unwrap();
    assert_eq!(shape(&b, s), [1, 4, 1, 4]); // channels 2..6, positions 1, 3, 5, 7
    let e = b
        .slice_by_index("empty", x, &[0, 5, 0, 0], &[1, 5, 1, 10], None)
        .unwrap_err();
    assert!(mismatch_detail(e, "empty").contains("empty or out of bounds"));
    let c = b.concat("c", &[x, s], 3).unwrap_err();
    assert!(mismatch_detail(c, "c").contains("outside axis 3"));
    let c = b.concat("c2", &[x, x], -1).unwrap();
    assert_eq!(shape(&b, c), [1, 8, 1, 20]);
    let e = b.concat("c3", &[x], 4).unwrap_err();
    assert!(
        matches!(
            e,
            MilError::AxisOutOfRange {
                axis: 4,
                rank: 4,
                ..
            }
        ),
        "{e:?}"
    );
    let parts = b.split("sp", x, &[3, 5], 1).unwrap();
    assert_eq!(shape(&b, parts[0]), [1, 3, 1, 10]);
    assert_eq!(shape(&b, parts[1]), [1, 5, 1, 10]);
    assert_eq!(b.function().value_name(parts[1]), "sp_1");
    let e = b.split("sp_bad", x, &[3, 4], 1).unwrap_err();
    assert!(mismatch_detail(e, "sp_bad").contains("sum to dim 8"));
    let r = b.reshape("r", x, &[2, -1, 5]).unwrap();
    assert_eq!(shape(&b, r), [2, 8, 5]);
    let e = b.reshape("r_bad", x, &[3, -1, 7]).unwrap_err();
    assert!(mismatch_detail(e, "r_bad").contains("cannot reshape"));
    let t = b.transpose("t", r, &[2, 0, 1]).unwrap();
    assert_eq!(shape(&b, t), [5, 2, 8]);
    let e = b.transpose("t_bad", r, &[0, 0, 1]).unwrap_err();
    assert!(mismatch_detail(e, "t_bad").contains("not a permutation"));
    let ex = b.expand_dims("ex", t, &[0, -1]).unwrap();
    assert_eq!(shape(&b, ex), [1, 5, 2, 8, 1]);
    let sq = b.squeeze("sq", ex, &[0, 4]).unwrap();
    assert_eq!(shape(&b, sq), [5, 2, 8]);
    let e = b.squeeze("sq_bad", ex, &[1]).unwrap_err();
    assert!(mismatch_detail(e, "sq_bad").contains("not of size 1"));
}

#[test]
fn strided_slice_length_is_ceil() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[10])).unwrap();
    // indices 1,3,5,7 of 1..9 (end -1 = 9)
    let s = b.slice_by_index("s", x, &[1], &[-1], Some(&[2])).unwrap();
    assert_eq!(shape(&b, s), [4]);
    let s = b
        .slice_by_index("s2", x, &[0], &[i64::MAX], Some(&[3]))
        .unwrap();
    assert_eq!(shape(&b, s), [4]); // 0,3,6,9
}

#[test]
fn reductions_norms_and_casts() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[1, 16, 1, 4])).unwrap();
    let r = b.reduce_mean("m", x, &[1], true).unwrap();
    assert_eq!(shape(&b, r), [1, 1, 1, 4]);
    let r = b.reduce_sum("s", x, &[1, -1], false).unwrap();
    assert_eq!(shape(&b, r), [1, 1]);
    let e = b.reduce_max("dup", x, &[1, 1], false).unwrap_err();
    assert!(mismatch_detail(e, "dup").contains("listed twice"));
    let g = weight(&mut b, "g", &[16]);
    let n = b.layer_norm("ln", x, &[1], Some(g), None, 1e-5).unwrap();
    assert_eq!(shape(&b, n), [1, 16, 1, 4]);
    let e = b
        .layer_norm("ln_bad", x, &[3], Some(g), None, 1e-5)
        .unwrap_err();
    assert!(mismatch_detail(e, "ln_bad").contains("shape [4]"));
    let c = b.cast("c", x, DType::F32).unwrap();
    assert_eq!(b.tensor_type(c).unwrap().dtype, DType::F32);
    let e = b.cast("c_bad", x, DType::U4).unwrap_err();
    assert!(mismatch_detail(e, "c_bad").contains("cast supports"));
    let e = b.softmax("sm", x, 4).unwrap_err();
    assert!(matches!(e, MilError::AxisOutOfRange { .. }));
    // fp16 epsilons are stored as written: rounded to fp16
    let rs = b.rsqrt("rs", x, 1e-6).unwrap();
    let op = b
        .function()
        .operations()
        .iter()
        .find(|o| o.outputs == [rs])
        .unwrap();
    let Op::Rsqrt { epsilon, .. } = op.op else {
        panic!()
    };
    assert_eq!(epsilon, half::f16::from_f32(1e-6).to_f32());
}

#[test]
fn states_only_through_read_and_write_state() {
    let mut b = FunctionBuilder::new("f");
    let st = b.state("cache", f16(&[1, 4, 1, 32])).unwrap();
    let x = b.input("x", f16(&[1, 4, 1, 32])).unwrap();
    let e = b.add("bad", st, x).unwrap_err();
    assert!(mismatch_detail(e, "bad").contains("is a state"));
    let r = b.read_state("r", st).unwrap();
    assert_eq!(shape(&b, r), [1, 4, 1, 32]);
    let e = b.read_state("r2", x).unwrap_err();
    assert!(mismatch_detail(e, "r2").contains("must be a state"));
    let small = b.input("small", f16(&[1, 4, 1, 1])).unwrap();
    let e = b.write_state("w_bad", st, small).unwrap_err();
    assert!(mismatch_detail(e, "w_bad").contains("does not match state"));
    let pos = b.input("pos", TensorType::new(DType::I32, [4])).unwrap();
    let u = b.slice_update("u", r, small, pos, pos).unwrap();
    b.write_state("w", st, u).unwrap();
    let big = b.input("big", f16(&[1, 4, 1, 33])).unwrap();
    let e = b.slice_update("u_bad", r, big, pos, pos).unwrap_err();
    assert!(mismatch_detail(e, "u_bad").contains("does not fit"));
    let e = b
        .state("st32", TensorType::new(DType::F32, [4]))
        .unwrap_err();
    assert!(matches!(e, MilError::InvalidFunction { .. }));
}

#[test]
fn names_are_unique_identifiers() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[2])).unwrap();
    assert!(matches!(
        b.add("x", x, x).unwrap_err(),
        MilError::DuplicateName { .. }
    ));
    assert!(matches!(
        b.add("1bad", x, x).unwrap_err(),
        MilError::InvalidName { .. }
    ));
    assert!(matches!(
        b.add("a-b", x, x).unwrap_err(),
        MilError::InvalidName { .. }
    ));
    // generated parameter const names may not collide with user names
    let y = b.softmax("sm", x, 0).unwrap();
    let _ = b
        .constant("sm_axis", TensorData::from_f32(vec![1], &[1.0]).unwrap())
        .unwrap();
    b.output(y).unwrap();
    let e = b.finish().unwrap_err().to_string();
    assert!(e.contains("sm_axis") && e.contains("collides"), "{e}");
}

#[test]
fn verifier_checks_outputs_and_program_rules() {
    let mut b = FunctionBuilder::new("f");
    let x = b.input("x", f16(&[2])).unwrap();
    assert!(b
        .finish()
        .unwrap_err()
        .to_string()
        .contains("at least one output"));

    let mut b = FunctionBuilder::new("f");
    let x2 = b.input("x", f16(&[2])).unwrap();
    b.output(x2).unwrap();
    assert!(b
        .finish()
        .unwrap_err()
        .to_string()
        .contains("is a function input"));
    let _ = x;

    let mut b = FunctionBuilder::new("main");
    let st = b.state("cache", f16(&[32])).unwrap();
    let r = b.read_state("r", st).unwrap();
    let y = b.exp("y", r).unwrap();
    b.output(y).unwrap();
    let f = b.finish().unwrap();
    let mut p = Program::new(SpecVersion::V8);
    p.add_function(f.clone()).unwrap();
    let e = anemone_mil::verify_program(&p).unwrap_err().to_string();
    assert!(e.contains("spec version 9"), "{e}");
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(f.clone()).unwrap();
    anemone_mil::verify_program(&p).unwrap();
    let counts = f.op_counts();
    assert_eq!(counts.get("read_state"), Some(&1));
    assert_eq!(counts.get("exp"), Some(&1));
    assert_eq!(f.producer(y).unwrap().name, "y");
    assert!(f.producer(f.inputs()[0]).is_none());
    // before spec 9 the single function must be `main`
    let mut b = FunctionBuilder::new("decode");
    let x = b.input("x", f16(&[2])).unwrap();
    let e = b.exp("e", x).unwrap();
    b.output(e).unwrap();
    let mut old = Program::new(SpecVersion::V8);
    old.add_function(b.finish().unwrap()).unwrap();
    let msg = anemone_mil::verify_program(&old).unwrap_err().to_string();
    assert!(msg.contains("named `main`"), "{msg}");
    assert!(
        p.add_function(f).is_err(),
        "duplicate function name accepted"
    );
    assert!(p.set_default_function("nope").is_err());
}

#[test]
fn constexpr_payload_checks() {
    let mut b = FunctionBuilder::new("f");
    let data = TensorData::pack_ints(DType::I4, vec![8, 6], &[1; 48]).unwrap();
    let scale = TensorData::f16_from_f32(vec![8, 4], &[0.1; 32]).unwrap();
    let e = b
        .constexpr_blockwise_shift_scale("q", data.clone(), scale, None)
        .unwrap_err();
    assert!(mismatch_detail(e, "q").contains("not a multiple of scale dim 4"));
    let scale = TensorData::f16_from_f32(vec![8, 2], &[0.1; 16]).unwrap();
    let w = b
        .constexpr_blockwise_shift_scale("q2", data, scale, None)
        .unwrap();
    assert_eq!(
        b.tensor_type(w).unwrap(),
        &TensorType::new(DType::F16, [8, 6])
    );

    let idx = TensorData::pack_ints(DType::U4, vec![8, 6], &[3; 48]).unwrap();
    let lut = TensorData::f16_from_f32(vec![2, 1, 8, 1], &[0.0; 16]).unwrap();
    let e = b.constexpr_lut_to_dense("l", idx.clone(), lut).unwrap_err();
    assert!(mismatch_detail(e, "l").contains("2^4 = 16"));
    let lut = TensorData::f16_from_f32(vec![2, 1, 16, 1], &[0.0; 32]).unwrap();
    let w = b.constexpr_lut_to_dense("l2", idx, lut).unwrap();
    assert_eq!(
        b.tensor_type(w).unwrap(),
        &TensorType::new(DType::F16, [8, 6])
    );
}
