//! A response built from an answer's parsed parts: its output items (reasoning, a message,
//! function calls) and the typed events that stream them. A non-streamed response is the
//! same parts with the events dropped.

use openai_protocol::responses::{
    IncompleteDetails, IncompleteReason, InputTokensDetails, OutputTokensDetails,
    ResponseContentPart, ResponseOutputItem, ResponseReasoningContent, ResponseStatus,
    ResponseUsage, ResponsesResponse, ResponsesUsage,
};
use serde_json::{Value, json};

use crate::openai::ApiError;
use crate::openai::response::Usage;
use crate::tools::output::Part;

/// One event: its type (the SSE `event:` name) and its data, `type` and
/// `sequence_number` included.
pub type Event = (&'static str, Value);

#[derive(Debug)]
enum Kind {
    Reasoning,
    Message,
    Call { call_id: String, name: String },
}

#[derive(Debug)]
struct Item {
    id: String,
    kind: Kind,
    /// Reasoning or message text, or a call's arguments.
    text: String,
    /// Its status once done: `completed`, or `incomplete` when the answer's token limit
    /// cut it.
    done: Option<&'static str>,
}

/// An item's status once done: `incomplete` when the answer reached its token limit.
fn done_status(length: bool) -> &'static str {
    if length { "incomplete" } else { "completed" }
}

/// Builds a response from its parts, and the events that say so.
#[derive(Debug)]
pub struct ResponseBuilder {
    response: ResponsesResponse,
    items: Vec<Item>,
    /// The output position of each call, by the parser's call index.
    calls: Vec<usize>,
    sequence: u64,
    /// The answer reached its token limit: its items end `incomplete`.
    cut: bool,
}

impl ResponseBuilder {
    /// `response`: the response as created (its id, model and echoed request parameters).
    pub fn new(mut response: ResponsesResponse) -> Self {
        response.status = ResponseStatus::InProgress;
        ResponseBuilder {
            response,
            items: Vec::new(),
            calls: Vec::new(),
            sequence: 0,
            cut: false,
        }
    }

    fn event(&mut self, kind: &'static str, mut data: Value) -> Event {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (kind, data)
    }

    /// `response.created` and `response.in_progress`.
    pub fn opening(&mut self) -> Vec<Event> {
        let response = json!({"response": self.response});
        vec![
            self.event("response.created", response.clone()),
            self.event("response.in_progress", response),
        ]
    }

    /// The events of one parsed part of the answer.
    pub fn push(&mut self, part: Part) -> Vec<Event> {
        let mut events = Vec::new();
        match part {
            Part::Reasoning(text) => self.text(Kind::Reasoning, text, &mut events),
            Part::Content(text) => self.text(Kind::Message, text, &mut events),
            Part::Calls(deltas) => {
                for delta in deltas {
                    let index = delta.index as usize;
                    let at = match self.calls.get(index) {
                        Some(&at) => at,
                        None => {
                            let kind = Kind::Call {
                                call_id: delta.id.clone().unwrap_or_else(|| new_id("call")),
                                name: delta.function.name.clone().unwrap_or_default(),
                            };
                            let at = self.open(kind, &mut events);
                            self.calls.resize(index + 1, at);
                            at
                        }
                    };
                    if let Some(arguments) = delta.function.arguments.filter(|a| !a.is_empty()) {
                        self.items[at].text.push_str(&arguments);
                        let item_id = self.items[at].id.clone();
                        events.push(self.event(
                            "response.function_call_arguments.delta",
                            json!({"item_id": item_id, "output_index": at, "delta": arguments}),
                        ));
                    }
                }
            }
        }
        events
    }

    /// Text for the open item of `kind`, or a new one.
    fn text(&mut self, kind: Kind, text: String, events: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        let reasoning = matches!(kind, Kind::Reasoning);
        let at = match self.items.last() {
            Some(last)
                if last.done.is_none()
                    && std::mem::discriminant(&last.kind) == std::mem::discriminant(&kind) =>
            {
                self.items.len() - 1
            }
            _ => self.open(kind, events),
        };
        self.items[at].text.push_str(&text);
        let item_id = self.items[at].id.clone();
        let (name, mut data) = if reasoning {
            ("response.reasoning_text.delta", json!({}))
        } else {
            ("response.output_text.delta", json!({"logprobs": []}))
        };
        data["item_id"] = json!(item_id);
        data["output_index"] = json!(at);
        data["content_index"] = json!(0);
        data["delta"] = json!(text);
        events.push(self.event(name, data));
    }

    /// A new output item (the ones before it are done).
    fn open(&mut self, kind: Kind, events: &mut Vec<Event>) -> usize {
        self.close_all(events);
        let prefix = match kind {
            Kind::Reasoning => "rs",
            Kind::Message => "msg",
            Kind::Call { .. } => "fc",
        };
        let at = self.items.len();
        self.items.push(Item {
            id: new_id(prefix),
            kind,
            text: String::new(),
            done: None,
        });
        let item = self.item(at, "in_progress");
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": at, "item": item}),
        ));
        if let Some(part) = self.part(at, "") {
            let item_id = self.items[at].id.clone();
            events.push(self.event(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": at, "content_index": 0, "part": part}),
            ));
        }
        at
    }

    fn close_all(&mut self, events: &mut Vec<Event>) {
        for at in 0..self.items.len() {
            if self.items[at].done.is_none() {
                self.close(at, events);
            }
        }
    }

    fn close(&mut self, at: usize, events: &mut Vec<Event>) {
        self.items[at].done = Some(done_status(self.cut));
        let item_id = self.items[at].id.clone();
        let text = self.items[at].text.clone();
        let at_json = json!({"item_id": item_id, "output_index": at});
        match &self.items[at].kind {
            Kind::Call { name, .. } => {
                let mut data = at_json;
                data["name"] = json!(name);
                data["arguments"] = json!(text);
                events.push(self.event("response.function_call_arguments.done", data));
            }
            kind => {
                let name = match kind {
                    Kind::Reasoning => "response.reasoning_text.done",
                    _ => "response.output_text.done",
                };
                let mut data = at_json.clone();
                data["content_index"] = json!(0);
                data["text"] = json!(text);
                if name == "response.output_text.done" {
                    data["logprobs"] = json!([]);
                }
                events.push(self.event(name, data));
                let mut data = at_json;
                data["content_index"] = json!(0);
                data["part"] = self.part(at, &text).unwrap_or_default();
                events.push(self.event("response.content_part.done", data));
            }
        }
        let item = self.item(at, done_status(self.cut));
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        ));
    }

    /// The content part of a text item, as it stands.
    fn part(&self, at: usize, text: &str) -> Option<Value> {
        match self.items[at].kind {
            Kind::Reasoning => Some(json!({"type": "reasoning_text", "text": text})),
            Kind::Message => Some(
                json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []}),
            ),
            Kind::Call { .. } => None,
        }
    }

    fn output_item(&self, at: usize, status: &str) -> ResponseOutputItem {
        let item = &self.items[at];
        match &item.kind {
            Kind::Reasoning => ResponseOutputItem::new_reasoning(
                item.id.clone(),
                Vec::new(),
                vec![ResponseReasoningContent::new_reasoning_text(
                    item.text.clone(),
                )],
                Some(status.to_string()),
            ),
            Kind::Message => ResponseOutputItem::new_message(
                item.id.clone(),
                "assistant".into(),
                if status == "in_progress" {
                    Vec::new()
                } else {
                    vec![ResponseContentPart::new_text(
                        item.text.clone(),
                        Vec::new(),
                        None,
                    )]
                },
                status.to_string(),
            ),
            Kind::Call { call_id, name } => ResponseOutputItem::new_function_tool_call(
                item.id.clone(),
                call_id.clone(),
                name.clone(),
                item.text.clone(),
                None,
                status.to_string(),
            ),
        }
    }

    fn item(&self, at: usize, status: &str) -> Value {
        serde_json::to_value(self.output_item(at, status)).unwrap_or_default()
    }

    /// The answer ended: its items are done, and the response is `completed` (or
    /// `incomplete` when it reached its token limit). The last event, and the response.
    pub fn finish(&mut self, reason: &str, usage: Usage) -> (Vec<Event>, ResponsesResponse) {
        let mut events = Vec::new();
        self.cut = reason == "length";
        self.close_all(&mut events);
        self.response.output = (0..self.items.len())
            .map(|at| self.output_item(at, self.items[at].done.unwrap_or("completed")))
            .collect();
        self.response.usage = Some(ResponsesUsage::Modern(ResponseUsage {
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
            total_tokens: usage.total_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage
                    .prompt_tokens_details
                    .as_ref()
                    .map_or(0, |d| d.cached_tokens),
            },
            output_tokens_details: OutputTokensDetails::default(),
        }));
        let name = if self.cut {
            self.response.status = ResponseStatus::Incomplete;
            self.response.incomplete_details = Some(IncompleteDetails {
                reason: IncompleteReason::MaxOutputTokens,
            });
            "response.incomplete"
        } else {
            self.response.status = ResponseStatus::Completed;
            self.response.completed_at = Some(crate::http::unix_now() as i64);
            "response.completed"
        };
        let data = json!({"response": self.response});
        events.push(self.event(name, data));
        (events, self.response.clone())
    }

    /// The answer failed midway: `response.failed`, with the error.
    pub fn fail(&mut self, error: &ApiError) -> Event {
        self.response.status = ResponseStatus::Failed;
        self.response.output = (0..self.items.len())
            .map(|at| self.output_item(at, "incomplete"))
            .collect();
        self.response.error = Some(json!({
            "code": error.code.unwrap_or("server_error"),
            "message": error.message,
        }));
        let data = json!({"response": self.response});
        self.event("response.failed", data)
    }

    /// The answer as an assistant message of the conversation (its text and calls), for a
    /// follow-up's history.
    pub fn assistant_message(&self) -> Value {
        let content: String = self
            .items
            .iter()
            .filter(|i| matches!(i.kind, Kind::Message))
            .map(|i| i.text.as_str())
            .collect();
        let calls: Vec<Value> = self
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                Kind::Call { call_id, name } => {
                    // A call cut short or malformed is kept with no arguments, so that the
                    // conversation can go on (the template takes JSON arguments only).
                    let arguments = match serde_json::from_str::<Value>(&i.text) {
                        Ok(_) => i.text.clone(),
                        Err(_) => "{}".to_string(),
                    };
                    Some(json!({"id": call_id, "type": "function",
                        "function": {"name": name, "arguments": arguments}}))
                }
                _ => None,
            })
            .collect();
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            if content.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = Value::Array(calls);
        }
        message
    }
}

/// A new id with a prefix (`resp`, `msg`, `fc`, ...): 24 random bytes in hex, unique
/// across frontends.
pub fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}_{:032x}{:016x}",
        rand::random::<u128>(),
        rand::random::<u64>()
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::openai::tools::{FunctionDelta, ToolCallDelta};
    use crate::tools::output::aggregate;

    fn builder() -> ResponseBuilder {
        ResponseBuilder::new(ResponsesResponse::builder("resp_1", "m").build())
    }

    fn call(index: u32, first: bool, arguments: &str) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: first.then(|| format!("call_{index}")),
            kind: first.then_some("function"),
            function: FunctionDelta {
                name: first.then(|| format!("f{index}")),
                arguments: Some(arguments.to_string()),
            },
        }
    }

    /// Answers as parsers stream them: reasoning, content and calls in any order, each
    /// call's first delta with its id and name, later ones adding arguments.
    fn answers() -> impl Strategy<Value = Vec<Part>> {
        let piece = prop_oneof![
            "[a-z ]{0,4}".prop_map(Part::Reasoning),
            "[a-z ]{0,4}".prop_map(Part::Content),
            (0..3usize, "[{}:a-z]{0,4}")
                .prop_map(|(n, a)| Part::Calls(vec![call(n as u32, false, &a)])),
        ];
        proptest::collection::vec(piece, 0..24).prop_map(|pieces| {
            // Calls numbered in order of their first delta, as parsers number them.
            let mut calls = 0u32;
            pieces
                .into_iter()
                .map(|part| match part {
                    Part::Calls(mut deltas) => {
                        let n = deltas[0].index;
                        if n >= calls {
                            deltas[0] = call(
                                calls,
                                true,
                                deltas[0].function.arguments.as_deref().unwrap_or(""),
                            );
                            calls += 1;
                        }
                        Part::Calls(deltas)
                    }
                    other => other,
                })
                .collect()
        })
    }

    proptest! {
        /// The output items say what `aggregate` (the chat answer) says, and each item's
        /// streamed deltas add up to its text; events are numbered in order and each item
        /// added is done once.
        #[test]
        fn the_response_and_its_events_say_what_the_answer_says(parts in answers()) {
            let answer = aggregate(parts.clone());
            let mut b = builder();
            let mut events = b.opening();
            for part in parts {
                events.extend(b.push(part));
            }
            let (end, response) = b.finish("stop", Usage::new(3, 4, None));
            events.extend(end);
            for (i, (_, data)) in events.iter().enumerate() {
                prop_assert_eq!(data["sequence_number"].as_u64(), Some(i as u64));
            }
            let output = serde_json::to_value(&response.output).unwrap();
            let output = output.as_array().unwrap();
            let mut content = String::new();
            let mut reasoning = String::new();
            let mut calls = Vec::new();
            for (at, item) in output.iter().enumerate() {
                let deltas: String = events
                    .iter()
                    .filter(|(kind, data)| kind.ends_with(".delta") && data["output_index"] == at)
                    .map(|(_, data)| data["delta"].as_str().unwrap().to_string())
                    .collect();
                let text = match item["type"].as_str().unwrap() {
                    "message" => item["content"][0]["text"].as_str().unwrap().to_string(),
                    "reasoning" => item["content"][0]["text"].as_str().unwrap().to_string(),
                    _ => item["arguments"].as_str().unwrap().to_string(),
                };
                prop_assert_eq!(&deltas, &text);
                match item["type"].as_str().unwrap() {
                    "message" => content.push_str(&text),
                    "reasoning" => reasoning.push_str(&text),
                    _ => calls.push((item["call_id"].clone(), item["name"].clone(), text)),
                }
                let added = events.iter().filter(|(k, d)| *k == "response.output_item.added" && d["output_index"] == at).count();
                let done = events.iter().filter(|(k, d)| *k == "response.output_item.done" && d["output_index"] == at).count();
                prop_assert_eq!((added, done), (1, 1));
            }
            prop_assert_eq!(content, answer.content);
            prop_assert_eq!(Some(reasoning).filter(|r| !r.is_empty()), answer.reasoning.filter(|r| !r.is_empty()));
            let expected: Vec<_> = answer
                .calls
                .iter()
                .map(|c| (json!(c.id), json!(c.function.name), c.function.arguments.clone()))
                .collect();
            prop_assert_eq!(calls, expected);
            prop_assert_eq!(events.last().map(|e| e.0), Some("response.completed"));
        }
    }

    #[test]
    fn an_answer_cut_at_its_limit_is_incomplete_and_a_failure_says_why() {
        let mut b = builder();
        b.push(Part::Content("Hel".into()));
        let (events, response) = b.finish("length", Usage::new(3, 4, Some(2)));
        assert_eq!(events.last().unwrap().0, "response.incomplete");
        assert_eq!(response.status, ResponseStatus::Incomplete);
        let value = serde_json::to_value(&response).unwrap();
        assert_eq!(value["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(value["output"][0]["status"], "incomplete");
        assert_eq!(value["usage"]["input_tokens_details"]["cached_tokens"], 2);
        assert_eq!(value["usage"]["total_tokens"], 7);
        let mut b = builder();
        b.push(Part::Content("Hel".into()));
        let (kind, data) = b.fail(&ApiError::internal("worker lost"));
        assert_eq!(kind, "response.failed");
        assert_eq!(data["response"]["status"], "failed");
        assert_eq!(data["response"]["error"]["message"], "worker lost");
    }

    #[test]
    fn only_the_items_a_limit_cut_are_incomplete_and_a_broken_call_is_kept_without_arguments() {
        let mut b = builder();
        b.push(Part::Content("Looking.".into()));
        b.push(Part::Calls(vec![call(0, true, "{\"city\": \"Par")]));
        let (_, response) = b.finish("length", Usage::new(3, 4, None));
        let value = serde_json::to_value(&response).unwrap();
        assert_eq!(value["output"][0]["status"], "completed");
        assert_eq!(value["output"][1]["status"], "incomplete");
        assert_eq!(
            b.assistant_message()["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
    }

    #[test]
    fn the_assistant_message_carries_the_text_and_the_calls() {
        let mut b = builder();
        b.push(Part::Content("Let me look.".into()));
        b.push(Part::Calls(vec![call(0, true, "{\"city\":")]));
        b.push(Part::Calls(vec![call(0, false, "\"Paris\"}")]));
        let message = b.assistant_message();
        assert_eq!(message["content"], "Let me look.");
        assert_eq!(message["tool_calls"][0]["id"], "call_0");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        let mut b = builder();
        b.push(Part::Calls(vec![call(0, true, "{}")]));
        assert!(b.assistant_message()["content"].is_null());
    }
}
