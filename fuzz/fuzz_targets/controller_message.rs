//! Proto decoding of what a controller sends on its `Connect` stream: arbitrary bytes must
//! decode or fail cleanly, a decoded message must survive a re-encode unchanged, and a
//! decoded Register goes through the manager's registration checks.
#![no_main]

use ctrlhub_proto::v1 as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = pb::ControllerMessage::decode(data) else {
        return;
    };
    let bytes = msg.encode_to_vec();
    let again = pb::ControllerMessage::decode(bytes.as_slice())
        .expect("a message we encoded ourselves decodes");
    assert_eq!(msg, again, "re-encoding changed the message");
    if let Some(pb::controller_message::Message::Register(r)) = &msg.message {
        ctrlhub_fuzz::check_register(r);
    }
});
