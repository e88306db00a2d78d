//! An answer's text split into reasoning, content and tool calls, whole or as it streams.

use openai_protocol::common::Tool;
use reasoning_parser::ReasoningParser;
use tool_parser::ToolParser;

use crate::openai::tools::{FunctionCallOut, FunctionDelta, ToolCallDelta, ToolCallOut};

use super::ToolRequest;

/// The parts of a whole answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub content: String,
    pub reasoning: Option<String>,
    pub calls: Vec<ToolCallOut>,
}

/// One streamed piece of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Content(String),
    Reasoning(String),
    Calls(Vec<ToolCallDelta>),
}

/// The tool side of an answer's parsing.
pub struct ToolState {
    parser: Box<dyn ToolParser>,
    tools: Vec<Tool>,
    parallel: bool,
    /// The ids given to the calls streamed so far, by the parser's index.
    ids: Vec<String>,
    /// Parsing failed midway: the rest is passed on as content.
    broken: bool,
}

impl ToolState {
    pub(super) fn new(parser: Box<dyn ToolParser>, request: &ToolRequest) -> Self {
        let tools = request
            .tools
            .iter()
            .filter_map(|t| serde_json::to_value(t).ok())
            .filter_map(|t| serde_json::from_value(t).ok())
            .collect();
        ToolState {
            parser,
            tools,
            parallel: request.parallel,
            ids: Vec::new(),
            broken: false,
        }
    }

    /// The calls of a streamed chunk as OpenAI deltas (the first of each call with its id,
    /// type and name), dropping calls after the first when parallel calls are off.
    fn deltas(&mut self, items: Vec<tool_parser::types::ToolCallItem>) -> Vec<ToolCallDelta> {
        let mut deltas = Vec::new();
        for item in items {
            if !self.parallel && item.tool_index > 0 {
                continue;
            }
            let index = u32::try_from(item.tool_index).unwrap_or(u32::MAX);
            let (id, kind) = if item.name.is_some() {
                while self.ids.len() <= item.tool_index {
                    self.ids.push(call_id());
                }
                (self.ids.get(item.tool_index).cloned(), Some("function"))
            } else {
                (None, None)
            };
            if item.name.is_none() && item.parameters.is_empty() {
                continue;
            }
            deltas.push(ToolCallDelta {
                index,
                id,
                kind,
                function: FunctionDelta {
                    name: item.name,
                    arguments: Some(item.parameters),
                },
            });
        }
        deltas
    }
}

impl std::fmt::Debug for ToolState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolState")
            .field("tools", &self.tools.len())
            .field("parallel", &self.parallel)
            .field("ids", &self.ids)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// A fresh id for a call.
pub(super) fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// The longest tag [`Recut`] waits for the end of.
const MAX_TAG: usize = 64;

/// The longest piece of plain text [`Recut`] gives, in characters.
const MAX_PIECE: usize = 16;

/// Streamed text cut again before it reaches the parsers, which expect the pieces of a
/// token stream: a tag (`<tool_call>`, `</think>`: from `<` to the next `>`, up to
/// [`MAX_TAG`] bytes) comes whole and alone; other pieces end at a newline, before `<`, `[`
/// and `{` (Mistral's `[TOOL_CALLS]`, JSON calls), or after [`MAX_PIECE`] characters.
///
/// Where a piece ends depends on the text alone, never on how the engine's chunks split
/// it: a piece whose end is not yet known is held. So an answer streamed in any chunks
/// reaches the parsers as the same pieces as the whole answer, and parses the same.
#[derive(Debug, Default)]
pub struct Recut {
    held: String,
}

impl Recut {
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.held.push_str(text);
        let mut pieces = Vec::new();
        let mut start = 0;
        while start < self.held.len() {
            let Some(end) = piece_end(&self.held[start..]) else {
                break;
            };
            pieces.push(self.held[start..start + end].to_owned());
            start += end;
        }
        self.held.drain(..start);
        pieces
    }

    /// What is held, once the text has ended.
    pub fn flush(&mut self) -> Option<String> {
        (!self.held.is_empty()).then(|| std::mem::take(&mut self.held))
    }
}

/// Where the piece at the start of `rest` ends, if `rest` says so already.
fn piece_end(rest: &str) -> Option<usize> {
    if rest.starts_with('<') {
        return match rest.find('>') {
            Some(close) if close < MAX_TAG => Some(close + 1),
            // Wait for the tag's end.
            None if rest.len() < MAX_TAG => None,
            _ => Some(1),
        };
    }
    // Past the first character (it may be `[` or `{`); a newline ends its piece.
    for (n, (at, c)) in rest.char_indices().enumerate() {
        if n > 0 && matches!(c, '<' | '[' | '{') {
            return Some(at);
        }
        if c == '\n' || n + 1 == MAX_PIECE {
            return Some(at + c.len_utf8());
        }
    }
    None
}

/// The parsers of one answer (one choice).
pub struct AnswerParser {
    reasoning: Option<Box<dyn ReasoningParser>>,
    tools: Option<ToolState>,
    /// gpt-oss's format, which says reasoning, content and calls apart itself.
    harmony: Option<super::harmony::Harmony>,
    recut: Recut,
    /// A call was streamed: the answer ends with `finish_reason: "tool_calls"`.
    called: bool,
}

impl std::fmt::Debug for AnswerParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerParser")
            .field(
                "reasoning",
                &self.reasoning.as_ref().map(|p| p.model_type().to_owned()),
            )
            .field("tools", &self.tools)
            .field("harmony", &self.harmony)
            .field("recut", &self.recut)
            .field("called", &self.called)
            .finish()
    }
}

impl AnswerParser {
    pub(super) fn new(
        reasoning: Option<Box<dyn ReasoningParser>>,
        tools: Option<ToolState>,
    ) -> Self {
        AnswerParser {
            reasoning,
            tools,
            harmony: None,
            recut: Recut::default(),
            called: false,
        }
    }

    /// A parser of gpt-oss's Harmony format, its calls kept when the request has tools.
    pub(super) fn harmony(tools: Option<&ToolRequest>) -> Self {
        let parser =
            super::harmony::Harmony::new(tools.is_some(), tools.is_none_or(|t| t.parallel));
        AnswerParser {
            harmony: Some(parser),
            ..Self::new(None, None)
        }
    }

    /// Whether the answer is read in Harmony's format: its special tokens must reach the
    /// parser as text.
    pub fn keeps_special_tokens(&self) -> bool {
        self.harmony.is_some()
    }

    /// The prompt ends inside the reasoning (its template opened `<think>`): the answer
    /// starts as reasoning.
    pub fn reasoning_started(&mut self) {
        if let Some(parser) = &mut self.reasoning {
            parser.mark_reasoning_started();
            parser.mark_think_start_stripped();
        }
    }

    /// Whether nothing is parsed (the text passes as it is).
    pub fn is_plain(&self) -> bool {
        self.reasoning.is_none() && self.tools.is_none() && self.harmony.is_none()
    }

    /// Whether the answer called a tool so far.
    pub fn called(&self) -> bool {
        self.called
    }

    /// The finish reason, given the engine's: a finished answer that called tools ends in
    /// `tool_calls`.
    pub fn finish_reason(&self, reason: &'static str) -> &'static str {
        if self.called && reason == "stop" {
            "tool_calls"
        } else {
            reason
        }
    }

    /// The whole answer's parts: its text parsed as a stream of one chunk, and the parts
    /// aggregated, so that a whole answer and a streamed one cannot disagree.
    pub async fn parse_whole(&mut self, text: String) -> Answer {
        let mut parts = self.push(&text).await;
        parts.extend(self.finish().await);
        aggregate(parts)
    }

    /// The parts of the next streamed chunk of text.
    pub async fn push(&mut self, text: &str) -> Vec<Part> {
        let mut parts = Vec::new();
        for piece in self.recut.push(text) {
            self.push_piece(&piece, &mut parts).await;
        }
        parts
    }

    async fn push_piece(&mut self, text: &str, parts: &mut Vec<Part>) {
        if let Some(harmony) = &mut self.harmony {
            let got = harmony.push(text);
            self.called |= got.iter().any(|p| matches!(p, Part::Calls(_)));
            parts.extend(got);
            return;
        }
        let normal = match &mut self.reasoning {
            None => text.to_owned(),
            Some(parser) => match parser.parse_reasoning_streaming_incremental(text) {
                Ok(result) => {
                    if !result.reasoning_text.is_empty() {
                        parts.push(Part::Reasoning(result.reasoning_text));
                    }
                    result.normal_text
                }
                Err(error) => {
                    tracing::debug!(%error, "the reasoning parser failed; the rest is content");
                    self.reasoning = None;
                    text.to_owned()
                }
            },
        };
        self.tool_parts(&normal, parts).await;
    }

    /// What the parsers held back, once the text has ended.
    pub async fn finish(&mut self) -> Vec<Part> {
        let mut parts = Vec::new();
        if let Some(held) = self.recut.flush() {
            self.push_piece(&held, &mut parts).await;
        }
        if let Some(harmony) = &mut self.harmony {
            let got = harmony.finish();
            self.called |= got.iter().any(|p| matches!(p, Part::Calls(_)));
            parts.extend(got);
            return parts;
        }
        let mut normal = String::new();
        if let Some(parser) = &mut self.reasoning
            && let Ok(result) = parser.flush()
        {
            if !result.reasoning_text.is_empty() {
                parts.push(Part::Reasoning(result.reasoning_text));
            }
            normal = result.normal_text;
        }
        if !normal.is_empty() {
            self.tool_parts(&normal, &mut parts).await;
        }
        if let Some(tools) = &mut self.tools
            && !tools.broken
        {
            if let Some(rest) = tools.parser.get_unstreamed_tool_args() {
                let deltas = tools.deltas(rest);
                if !deltas.is_empty() {
                    self.called = true;
                    parts.push(Part::Calls(deltas));
                }
            }
            let held = tools.parser.take_unstreamed_normal_text();
            if !held.is_empty() {
                parts.push(Part::Content(held));
            }
        }
        parts
    }

    async fn tool_parts(&mut self, normal: &str, parts: &mut Vec<Part>) {
        if normal.is_empty() {
            return;
        }
        let Some(tools) = self.tools.as_mut().filter(|t| !t.broken) else {
            parts.push(Part::Content(normal.to_owned()));
            return;
        };
        match tools.parser.parse_incremental(normal, &tools.tools).await {
            Ok(result) => {
                if !result.normal_text.is_empty() {
                    parts.push(Part::Content(result.normal_text));
                }
                let deltas = tools.deltas(result.calls);
                if !deltas.is_empty() {
                    self.called = true;
                    parts.push(Part::Calls(deltas));
                }
            }
            Err(error) => {
                tracing::debug!(%error, "the tool-call parser failed; the rest is content");
                tools.broken = true;
                parts.push(Part::Content(normal.to_owned()));
            }
        }
    }
}

/// The answer streamed parts add up to, as a client assembles them: texts joined, each
/// call's first delta (with its id and name) followed by pieces of its arguments.
pub fn aggregate(parts: Vec<Part>) -> Answer {
    let mut answer = Answer::default();
    let mut reasoning = String::new();
    for part in parts {
        match part {
            Part::Content(text) => answer.content.push_str(&text),
            Part::Reasoning(text) => reasoning.push_str(&text),
            Part::Calls(deltas) => {
                for delta in deltas {
                    let index = delta.index as usize;
                    while answer.calls.len() <= index {
                        answer.calls.push(ToolCallOut {
                            id: String::new(),
                            kind: "function",
                            function: FunctionCallOut {
                                name: String::new(),
                                arguments: String::new(),
                            },
                        });
                    }
                    let call = &mut answer.calls[index];
                    if let Some(id) = delta.id {
                        call.id = id;
                    }
                    if let Some(name) = delta.function.name {
                        call.function.name.push_str(&name);
                    }
                    if let Some(arguments) = delta.function.arguments {
                        call.function.arguments.push_str(&arguments);
                    }
                }
            }
        }
    }
    // A call the parser never named (its index skipped) is not a call.
    answer.calls.retain(|call| !call.function.name.is_empty());
    answer.reasoning = (!reasoning.is_empty()).then_some(reasoning);
    answer
}
