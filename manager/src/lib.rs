//! The ctrlhub manager library.

pub mod predicate;
pub mod queue;
