//! Arbitrary bytes as model files through the real loader: a GGUF, a Hugging Face directory
//! (config.json + model.safetensors), a tokenizer.json, or a chat template
//! (`tandem_model::fuzzing::model_files`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tandem_model::fuzzing::model_files(data);
});
