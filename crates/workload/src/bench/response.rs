//! Reading OpenAI responses: stream chunks and whole completions, chat or text.

use serde_json::Value;

use super::record::{ErrorKind, RequestError};

/// Token counts a server reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt tokens the server found in its prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`), when it says.
    pub cached_tokens: Option<u64>,
}

/// What one stream event carried.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Chunk {
    /// Some generated text (a token, or several) arrived.
    pub content: bool,
    /// The answer's text in it (`content`, or `text` on the completions endpoint), for a
    /// session's next turn; reasoning is timed but not kept.
    pub text: String,
    /// A choice reported its finish reason.
    pub finished: bool,
    pub usage: Option<Usage>,
}

/// A whole (non-streamed) completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Completion {
    /// Whitespace-separated words of the generated text: the token count when the server
    /// sends no usage (the one-word-one-token assumption of the prompts).
    pub words: u64,
    /// The generated text (of every choice).
    pub text: String,
    pub usage: Option<Usage>,
}

/// Parses the data of one server-sent event (not `[DONE]`).
pub(crate) fn parse_chunk(data: &str) -> Result<Chunk, RequestError> {
    let value = parse_json(data.as_bytes())?;
    let mut chunk = Chunk {
        usage: usage(&value),
        ..Chunk::default()
    };
    for choice in choices(&value) {
        let delta = choice.get("delta");
        let answer = delta
            .and_then(|d| d.get("content"))
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str);
        let text = ["reasoning_content", "reasoning"]
            .iter()
            .filter_map(|key| delta.and_then(|d| d.get(key)).and_then(Value::as_str))
            .chain(answer);
        chunk.content |= text.into_iter().any(|t| !t.is_empty());
        if let Some(answer) = answer {
            chunk.text.push_str(answer);
        }
        chunk.finished |= choice
            .get("finish_reason")
            .is_some_and(|reason| !reason.is_null());
    }
    Ok(chunk)
}

/// Parses a whole chat or text completion body.
pub(crate) fn parse_completion(body: &[u8]) -> Result<Completion, RequestError> {
    let value = parse_json(body)?;
    let mut choices = choices(&value).peekable();
    if choices.peek().is_none() {
        return Err(RequestError::new(
            ErrorKind::Protocol,
            "the response has no choices",
        ));
    }
    let text = choices
        .filter_map(|choice| {
            choice
                .get("message")
                .and_then(|m| m.get("content"))
                .or_else(|| choice.get("text"))
                .and_then(Value::as_str)
        })
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Completion {
        words: text.split_whitespace().count() as u64,
        text,
        usage: usage(&value),
    })
}

fn parse_json(bytes: &[u8]) -> Result<Value, RequestError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        RequestError::new(
            ErrorKind::Protocol,
            format!("not JSON ({e}): {}", snippet(bytes)),
        )
    })?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_string);
        return Err(RequestError::new(ErrorKind::Server, message));
    }
    Ok(value)
}

fn choices(value: &Value) -> impl Iterator<Item = &Value> {
    value
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn usage(value: &Value) -> Option<Usage> {
    let usage = value.get("usage")?;
    Some(Usage {
        prompt_tokens: usage.get("prompt_tokens")?.as_u64()?,
        completion_tokens: usage.get("completion_tokens")?.as_u64()?,
        cached_tokens: usage
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64),
    })
}

/// The start of a body, for error messages.
pub(crate) fn snippet(bytes: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]);
    let text = text.trim();
    if bytes.len() > MAX {
        format!("{text}…")
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_and_text_chunks_carry_content_finish_and_usage() {
        let chat = parse_chunk(r#"{"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}"#);
        assert_eq!(
            chat,
            Ok(Chunk {
                content: true,
                text: "hi".into(),
                finished: false,
                usage: None
            })
        );
        let role_only = parse_chunk(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#).unwrap();
        assert!(!role_only.content);
        let text = parse_chunk(r#"{"choices":[{"text":" a","finish_reason":"length"}]}"#).unwrap();
        assert!(text.content && text.finished);
        assert_eq!(text.text, " a");
        let usage = parse_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#,
        )
        .unwrap();
        assert_eq!(
            usage.usage,
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 3,
                cached_tokens: None,
            })
        );
        // OpenAI's (and vLLM's, SGLang's, Switchyard's) count of prompt tokens served
        // from the prefix cache.
        let cached = parse_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,
                "prompt_tokens_details":{"cached_tokens":8}}}"#,
        )
        .unwrap();
        assert_eq!(cached.usage.and_then(|u| u.cached_tokens), Some(8));
        let null_details = parse_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,
                "prompt_tokens_details":null}}"#,
        )
        .unwrap();
        assert_eq!(
            null_details
                .usage
                .map(|u| (u.prompt_tokens, u.cached_tokens)),
            Some((12, None))
        );
        let reasoning = parse_chunk(r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#);
        assert!(reasoning.unwrap().content);
    }

    #[test]
    fn errors_in_a_stream_are_server_errors_and_garbage_is_protocol() {
        let err = parse_chunk(r#"{"error":{"message":"overloaded","code":503}}"#).unwrap_err();
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::Server, "overloaded")
        );
        let err = parse_chunk("not json").unwrap_err();
        assert_eq!(err.kind, ErrorKind::Protocol);
        assert!(err.message.contains("not json"));
    }

    #[test]
    fn whole_completions_count_words_and_usage() {
        let chat = parse_completion(
            br#"{"choices":[{"message":{"role":"assistant","content":"one two three"}}],
                "usage":{"prompt_tokens":5,"completion_tokens":4}}"#,
        )
        .unwrap();
        assert_eq!(chat.words, 3);
        assert_eq!(chat.text.split_whitespace().count(), 3);
        assert_eq!(chat.usage.map(|u| u.completion_tokens), Some(4));
        let text = parse_completion(br#"{"choices":[{"text":"a b"}]}"#).unwrap();
        assert_eq!((text.words, text.usage), (2, None));
        let empty = parse_completion(br#"{"object":"list"}"#).unwrap_err();
        assert_eq!(empty.kind, ErrorKind::Protocol);
    }
}
