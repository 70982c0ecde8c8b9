//! The ctrlhub binary.
fn main() {}
