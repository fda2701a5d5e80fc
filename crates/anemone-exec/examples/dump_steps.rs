//! Prints a function's ops with their output shapes (a debugging aid).
//!
//! `cargo run --release -p anemone-exec --example dump_steps -- PATH.mlpackage FUNCTION`
use std::collections::HashMap;

use anemone_exec::{LoadedPackage, Precision, Tensor};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("path");
    let function = args.next().unwrap_or_else(|| "decode".into());
    let package = LoadedPackage::load(path.as_ref(), Precision::Fp16).expect("load");
    let sig = package.signature(&function).expect("function").clone();
    for p in &sig.inputs {
        println!("input {} {}", p.name, p.ty);
    }
    for p in &sig.states {
        println!("state {} {}", p.name, p.ty);
    }
    let inputs: HashMap<String, Tensor> = sig
        .inputs
        .iter()
        .map(|p| {
            let n = p.ty.numel();
            (
                p.name.clone(),
                Tensor::new(p.ty.dtype, p.ty.shape.clone(), vec![0.0; n]).expect("tensor"),
            )
        })
        .collect();
    let mut state = package.new_state(&function).expect("state");
    package
        .predict_observed(&function, &inputs, &mut state, &mut |o| {
            println!("{:24} {:14} {}", o.op, o.op_type, o.tensor);
        })
        .expect("predict");
}
