//! Registration validation: a `Register` decoded from arbitrary bytes, through the manager's
//! name, selector and predicate checks (see `ctrlhub_fuzz::check_register`).
#![no_main]

use ctrlhub_proto::v1 as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = pb::Register::decode(data) {
        ctrlhub_fuzz::check_register(&r);
    }
});
