//! The `hawser` binary.
fn main() {}
