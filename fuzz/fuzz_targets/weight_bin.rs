#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| anemone_fuzz::weight_bin(data));
