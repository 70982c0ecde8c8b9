//! memcached controller
fn main() {}
