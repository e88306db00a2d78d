//! SmolLM2-135M-Instruct's tokenizer files, built in (see `assets/smollm2/README.md`): the
//! default tokenizer of `switchyard serve`.

/// Names the vocabulary: workers and frontends agree on what its tokens mean.
pub const NAME: &str = "smollm2-135m";
/// `tokenizer.json`: byte-level BPE, 49,152 tokens.
pub const TOKENIZER: &str = include_str!("../../assets/smollm2/tokenizer.json");
/// `tokenizer_config.json`: the chat template and special tokens.
pub const TOKENIZER_CONFIG: &str = include_str!("../../assets/smollm2/tokenizer_config.json");
/// `config.json`: the context length and end-of-sequence token.
pub const CONFIG: &str = include_str!("../../assets/smollm2/config.json");
/// `<|im_end|>`, which ends a chat turn.
pub const EOS: u32 = 2;
