//! The tokenizer and chat template a GGUF file holds, written as the files a frontend reads
//! from a model directory.

use candle_core::quantized::gguf_file;

use super::{Gguf, ModelError};

/// A GGUF model's tokenizer and chat template, as the files a frontend reads from a model
/// directory: `tokenizer.json` (a byte-level BPE built from `tokenizer.ggml.tokens` and
/// `merges`), `tokenizer_config.json` (`tokenizer.chat_template`, the BOS and EOS tokens)
/// and `config.json` (the context length).
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    pub tokenizer: String,
    pub tokenizer_config: String,
    pub config: String,
}

impl Gguf {
    /// The id of the token that ends a sequence (`tokenizer.ggml.eos_token_id`).
    pub fn eos_token(&self) -> Option<u32> {
        let id = self.number("tokenizer.ggml.eos_token_id").ok()?;
        (id >= 0.0 && id <= f64::from(u32::MAX)).then_some(id as u32)
    }

    /// The tokenizer files of a GGUF model with a byte-level BPE tokenizer
    /// (`tokenizer.ggml.model = "gpt2"`): vocabulary, merges and the added tokens
    /// (control tokens special), with the pre-tokenizer `tokenizer.ggml.pre` names (`smollm`:
    /// digits split one by one; `gpt2` and unnamed: GPT-2's). Other tokenizers are an
    /// error that says to pass the model's tokenizer directory instead.
    pub fn tokenizer_files(&self) -> Result<TokenizerFiles, ModelError> {
        use serde_json::{Value, json};
        let model = self.string("tokenizer.ggml.model").unwrap_or("gpt2");
        if model != "gpt2" {
            return Err(self.invalid(format!(
                "its tokenizer is {model:?}; only byte-level BPE (\"gpt2\") tokenizers are read from GGUF files (give the model's tokenizer directory with --tokenizer)"
            )));
        }
        let pre = self.string("tokenizer.ggml.pre").unwrap_or("gpt2");
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let pre_tokenizer = match pre {
            "smollm" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level]}),
            "gpt2" | "default" => byte_level,
            other => {
                return Err(self.invalid(format!(
                    "its pre-tokenizer {other:?} is not one this build reads from GGUF files (give the model's tokenizer directory with --tokenizer)"
                )));
            }
        };
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            match self.metadata(key) {
                Some(gguf_file::Value::Array(items)) => items
                    .iter()
                    .map(|v| match v {
                        gguf_file::Value::String(s) => Ok(s.clone()),
                        _ => Err(self.invalid(format!("{key} holds a non-string"))),
                    })
                    .collect(),
                _ => Err(self.invalid(format!("{key} is missing"))),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<i64> = match self.metadata("tokenizer.ggml.token_type") {
            Some(gguf_file::Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    gguf_file::Value::I32(t) => i64::from(*t),
                    gguf_file::Value::U32(t) => i64::from(*t),
                    _ => 1,
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        // llama.cpp's token types: 1 normal, 3 control, 4 user-defined.
        let added: Vec<Value> = tokens
            .iter()
            .zip(types.iter().chain(std::iter::repeat(&1)))
            .enumerate()
            .filter(|(_, (_, t))| matches!(**t, 3 | 4))
            .map(|(id, (content, t))| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": *t == 3})
            })
            .collect();
        let vocab: serde_json::Map<String, Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), json!(i)))
            .collect();
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merges},
        });
        let token = |key: &str| -> Option<String> {
            let id = self.number(key).ok()? as usize;
            tokens.get(id).cloned()
        };
        let mut tokenizer_config = serde_json::Map::new();
        if let Some(template) = self.string("tokenizer.chat_template") {
            tokenizer_config.insert("chat_template".into(), template.into());
        }
        if let Some(bos) = token("tokenizer.ggml.bos_token_id") {
            tokenizer_config.insert("bos_token".into(), bos.into());
        }
        if let Some(eos) = token("tokenizer.ggml.eos_token_id") {
            tokenizer_config.insert("eos_token".into(), eos.into());
        }
        for key in ["add_bos_token", "add_eos_token"] {
            if let Some(gguf_file::Value::Bool(add)) =
                self.metadata(&format!("tokenizer.ggml.{key}"))
            {
                tokenizer_config.insert(key.into(), (*add).into());
            }
        }
        let mut config = serde_json::Map::new();
        if let Ok(context) = self.number("llama.context_length") {
            config.insert("max_position_embeddings".into(), (context as u64).into());
        }
        Ok(TokenizerFiles {
            tokenizer: tokenizer.to_string(),
            tokenizer_config: Value::Object(tokenizer_config).to_string(),
            config: Value::Object(config).to_string(),
        })
    }
}
