//! The `anemone` binary: one module per verb; `anyhow` at this edge only.

fn main() {
    println!("anemone");
}
