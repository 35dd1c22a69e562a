//! Arbitrary bytes through request parsing (OpenAI chat, Anthropic messages), chat-template
//! rendering in the minijinja sandbox, and the reasoning / tool-call output parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tandem_server::fuzzing::request_and_template(data);
});
