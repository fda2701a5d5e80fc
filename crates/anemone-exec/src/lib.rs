//! CPU interpreter of MIL programs as written to disk, in fp32 or fp16-faithful arithmetic.
