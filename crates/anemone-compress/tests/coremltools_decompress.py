"""Loads an .mlpackage with coremltools' own milproto loader and writes the value every
constexpr op decompresses to (coremltools' `decompress` implementations), as float32 raw files
OUT/<op name>.f32. Used by tests/validator.rs to prove our decoding is bit-identical to theirs.

Usage: coremltools_decompress.py PKG.mlpackage OUT_DIR
"""
import os
import sys

import numpy as np
from coremltools.converters.mil.frontend.milproto import load as milproto_load
from coremltools.proto import Model_pb2

pkg, out = sys.argv[1], sys.argv[2]
data = os.path.join(pkg, "Data", "com.apple.CoreML")
spec = Model_pb2.Model()
with open(os.path.join(data, "model.mlmodel"), "rb") as f:
    spec.ParseFromString(f.read())
prog = milproto_load.load(spec, spec.specificationVersion, os.path.join(data, "weights"))
os.makedirs(out, exist_ok=True)
count = 0
for fn in prog.functions.values():
    for op in fn.operations:
        if op.op_type.startswith("constexpr_"):
            value = np.asarray(op.materialized_val_inference())
            value.astype("<f4").tofile(os.path.join(out, f"{op.name}.f32"))
            count += 1
print(count)
