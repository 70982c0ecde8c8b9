//! The manager under adversity: hostile tenants, strangers without credentials, unfair load and
//! injected faults, each measured against a well-behaved tenant or a reconcile log. These tests
//! measure time on a 2-core machine, so they take turns (`ctrlhub_tests::SERIAL`) across every
//! module of this binary.

mod fairness;
mod faults;
mod hostile;
mod strangers;
