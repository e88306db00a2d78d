//! gpt-oss's Harmony format: an answer is a run of messages, each a header and a body.
//!
//! ```text
//! <|channel|>analysis<|message|>The user wants the weather.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//! ```
//!
//! The prompt ends with `<|start|>assistant`, so the first header starts the answer. A
//! header ends at `<|message|>`; a body at `<|end|>`, `<|call|>` or `<|return|>` (the last
//! two end generation and may be missing), or where the next header starts. A body goes to:
//! - a call of function `NAME` when the header's recipient is `to=functions.NAME` and the
//!   request has tools (its body is the call's arguments);
//! - reasoning on the `analysis` channel, or for another recipient (a built-in tool's
//!   input, which is not the answer);
//! - content otherwise (`final`, and `commentary` without a recipient: a preamble).
//!
//! The first header starts with a marker or with its recipient (`to=`); an answer that
//! starts otherwise is content until a header starts, so an answer in no format passes as
//! it is. A marker split across chunks is held until it is whole: where each part ends
//! depends on the text alone, never on the chunks.
//!
//! With `tool_choice` `none` (no tools), a body addressed to a function is reasoning: the
//! model's, not the answer.

use crate::openai::tools::{FunctionDelta, ToolCallDelta};

use super::output::{Part, call_id};

/// The longest marker the parser waits for the end of, in bytes.
const MAX_MARKER: usize = 16;

/// Where a body goes.
#[derive(Debug, Clone, PartialEq)]
enum Body {
    Content,
    Reasoning,
    /// Arguments of the call at this index.
    Call(u32),
    /// A call dropped (parallel calls are off).
    Dropped,
}

#[derive(Debug, Clone, PartialEq)]
enum Mode {
    /// Nothing read yet: a header, or text in no format.
    Start,
    /// Reading a header, up to `<|message|>`.
    Header,
    Body(Body),
}

/// One answer's Harmony parser.
#[derive(Debug)]
pub struct Harmony {
    mode: Mode,
    /// Text not yet parsed: a header, or the start of a marker in a body.
    held: String,
    /// Calls go to `tool_calls` (the request has tools the model may call).
    tools: bool,
    /// More than one call per answer.
    parallel: bool,
    /// Calls seen so far, dropped ones included.
    calls: u32,
}

impl Harmony {
    pub fn new(tools: bool, parallel: bool) -> Self {
        Harmony {
            mode: Mode::Start,
            held: String::new(),
            tools,
            parallel,
            calls: 0,
        }
    }

    /// The parts of the next piece of text.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut parts = Vec::new();
        while self.step(&mut parts) {}
        parts
    }

    /// What is held, once the text has ended: the rest of a body as that body; a header
    /// never finished is dropped.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut parts = Vec::new();
        let rest = std::mem::take(&mut self.held);
        match &self.mode {
            Mode::Start => emit(&Body::Content, rest, &mut parts),
            Mode::Body(body) => emit(body, rest, &mut parts),
            Mode::Header => {}
        }
        parts
    }

    /// Parses what it can of the held text; whether it should be called again.
    fn step(&mut self, parts: &mut Vec<Part>) -> bool {
        match self.mode.clone() {
            Mode::Start => {
                const OPENINGS: [&str; 3] = ["<|", "to=", " to="];
                let held = self.held.as_str();
                if OPENINGS.iter().any(|o| held.starts_with(o)) {
                    self.mode = Mode::Header;
                } else if OPENINGS.iter().any(|o| o.starts_with(held)) {
                    return false;
                } else {
                    self.mode = Mode::Body(Body::Content);
                }
                true
            }
            Mode::Header => {
                let Some(end) = self.held.find(MESSAGE) else {
                    return false;
                };
                let header: String = self.held.drain(..end + MESSAGE.len()).collect();
                let body = self.open(&header[..end], parts);
                self.mode = Mode::Body(body);
                true
            }
            Mode::Body(body) => {
                let Some(at) = self.held.find("<|") else {
                    // All of it is body, but a last `<` may start a marker.
                    let keep = usize::from(self.held.ends_with('<'));
                    let text: String = self.held.drain(..self.held.len() - keep).collect();
                    emit(&body, text, parts);
                    return false;
                };
                let text: String = self.held.drain(..at).collect();
                emit(&body, text, parts);
                let Some(close) = self.held.find("|>").filter(|&c| c < MAX_MARKER) else {
                    if self.held.len() < MAX_MARKER {
                        return false;
                    }
                    // No marker this long: `<|` is text.
                    let text: String = self.held.drain(..2).collect();
                    emit(&body, text, parts);
                    return true;
                };
                let marker = &self.held[..close + 2];
                if [END, CALL, RETURN].contains(&marker) {
                    self.held.drain(..close + 2);
                    self.mode = Mode::Header;
                } else if [START, CHANNEL].contains(&marker) {
                    // A header starts (its body's end was never written): the marker is
                    // the header's.
                    self.mode = Mode::Header;
                } else {
                    let text: String = self.held.drain(..close + 2).collect();
                    emit(&body, text, parts);
                }
                true
            }
        }
    }

    /// Where the body after `header` goes; a call's first delta (its id and name).
    fn open(&mut self, header: &str, parts: &mut Vec<Part>) -> Body {
        let recipient = header
            .split(|c: char| c.is_whitespace() || c == '<')
            .find_map(|word| word.strip_prefix("to="));
        let channel = header
            .rfind(CHANNEL)
            .map(|at| &header[at + CHANNEL.len()..])
            .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next());
        match recipient {
            Some(recipient) => match recipient.strip_prefix("functions.") {
                Some(name) if self.tools && !name.is_empty() => {
                    let index = self.calls;
                    self.calls += 1;
                    if index > 0 && !self.parallel {
                        return Body::Dropped;
                    }
                    parts.push(Part::Calls(vec![ToolCallDelta {
                        index,
                        id: Some(call_id()),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name.to_owned()),
                            arguments: Some(String::new()),
                        },
                    }]));
                    Body::Call(index)
                }
                _ => Body::Reasoning,
            },
            None if channel == Some("analysis") => Body::Reasoning,
            None => Body::Content,
        }
    }
}

const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const START: &str = "<|start|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";

/// Body text as the part it is.
fn emit(body: &Body, text: String, parts: &mut Vec<Part>) {
    if text.is_empty() {
        return;
    }
    parts.push(match body {
        Body::Content => Part::Content(text),
        Body::Reasoning => Part::Reasoning(text),
        Body::Call(index) => Part::Calls(vec![ToolCallDelta {
            index: *index,
            id: None,
            kind: None,
            function: FunctionDelta {
                name: None,
                arguments: Some(text),
            },
        }]),
        Body::Dropped => return,
    });
}
