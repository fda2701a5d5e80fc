//! Bit identity of constexpr decompression with coremltools' own `decompress`
//! (fixture made by tests/fixtures/make_decompress_fixture.py).

mod common;

use anemone_exec::decompress::{blockwise_shift_scale, lut_to_dense};
use anemone_exec::Precision;
use anemone_mil::{DType, FunctionBuilder, TensorData, TensorType};
use serde_json::Value;

fn tensor_data(v: &Value) -> TensorData {
    let dtype = DType::from_mil_name(v["dtype"].as_str().unwrap()).unwrap();
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let vals = v["values"].as_array().unwrap();
    match dtype {
        DType::F16 => TensorData::f16_from_f32(
            shape,
            &vals
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect::<Vec<_>>(),
        ),
        DType::F32 => TensorData::from_f32(
            shape,
            &vals
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect::<Vec<_>>(),
        ),
        _ => TensorData::pack_ints(
            dtype,
            shape,
            &vals
                .iter()
                .map(|x| x.as_i64().unwrap() as i32)
                .collect::<Vec<_>>(),
        ),
    }
    .unwrap()
}

fn expected_bits(case: &Value) -> (DType, Vec<usize>, Vec<u32>) {
    let e = &case["expected"];
    (
        DType::from_mil_name(e["dtype"].as_str().unwrap()).unwrap(),
        e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect(),
        e["bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u32)
            .collect(),
    )
}

fn bits_of(dtype: DType, values: &[f32]) -> Vec<u32> {
    values
        .iter()
        .map(|&v| match dtype {
            DType::F16 => half::f16::from_f32(v).to_bits() as u32,
            _ => v.to_bits(),
        })
        .collect()
}

fn cases() -> Vec<Value> {
    let text = include_str!("fixtures/decompress_coremltools.json");
    let doc: Value = serde_json::from_str(text).unwrap();
    doc["cases"].as_array().unwrap().clone()
}

fn payloads(case: &Value) -> (TensorData, TensorData, Option<TensorData>) {
    if case["op"] == "constexpr_blockwise_shift_scale" {
        let offset = (!case["offset"].is_null()).then(|| tensor_data(&case["offset"]));
        (
            tensor_data(&case["data"]),
            tensor_data(&case["scale"]),
            offset,
        )
    } else {
        (
            tensor_data(&case["indices"]),
            tensor_data(&case["lut"]),
            None,
        )
    }
}

#[test]
fn decompression_is_bit_identical_to_coremltools() {
    let cases = cases();
    assert!(cases.len() >= 14, "fixture holds every case");
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let (a, b, offset) = payloads(case);
        let got = if case["op"] == "constexpr_blockwise_shift_scale" {
            blockwise_shift_scale(&a, &b, offset.as_ref())
        } else {
            lut_to_dense(&a, &b)
        }
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (dtype, shape, want) = expected_bits(case);
        assert_eq!(got.dtype, dtype, "{name}: dtype");
        assert_eq!(got.shape, shape, "{name}: shape");
        let got_bits = bits_of(dtype, &got.data);
        if let Some(i) = (0..want.len()).find(|&i| got_bits[i] != want[i]) {
            panic!(
                "{name}: element {i}: bits {:#x} (value {}), coremltools {:#x}",
                got_bits[i], got.data[i], want[i]
            );
        }
    }
}

/// The same payloads written into a package and read back by the executor decode to the
/// same bits (sub-byte packing in weight.bin included).
#[test]
fn decompression_through_a_package_matches_coremltools() {
    for case in cases() {
        let name = case["name"].as_str().unwrap();
        let (a, b, offset) = payloads(&case);
        let (dtype, shape, want) = expected_bits(&case);
        let mut f = FunctionBuilder::new("main");
        let x = f.input("x", TensorType::new(dtype, shape.clone())).unwrap();
        let w = if case["op"] == "constexpr_blockwise_shift_scale" {
            f.constexpr_blockwise_shift_scale("w", a, b, offset)
                .unwrap()
        } else {
            f.constexpr_lut_to_dense("w", a, b).unwrap()
        };
        // y = x + w with x = 0 exposes w (fp16 + 0 keeps every bit, inf included)
        let y = f.add("y", x, w).unwrap();
        f.output(y).unwrap();
        let zeros = anemone_exec::Tensor::zeros(dtype, shape.clone());
        let out = common::run(f.finish().unwrap(), vec![("x", zeros)], Precision::Fp16);
        let got = bits_of(dtype, &out["y"].data);
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{name}: element {i}: bits {:#x}, coremltools {:#x}",
                got[i], want[i]
            );
        }
    }
}
