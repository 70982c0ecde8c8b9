//! ctrlhub SDK
