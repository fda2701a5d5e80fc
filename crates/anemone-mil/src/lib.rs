//! Core ML ML Program model: typed ops as a closed enum, a shape-checking builder, proto and weight.bin encoding, .mlpackage read/write and a MIL text printer.
