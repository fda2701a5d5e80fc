//! Weight compression: int8/int4 linear quantization and LUT palettization with measured error.
