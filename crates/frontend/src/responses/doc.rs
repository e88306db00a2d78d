//! The Responses API as `/openapi.json` describes it: the parameters served (the request is
//! parsed with `openai-protocol`'s types, which take more, each honoured, a documented
//! no-op or refused: docs/api-parameters.md), a response, and a streamed event.

#![allow(dead_code)]

use std::collections::HashMap;

/// A Responses request.
#[derive(Debug, utoipa::ToSchema)]
pub struct ResponsesRequest {
    pub model: String,
    pub input: ResponsesInput,
    /// A system message before the conversation (not carried to a follow-up).
    pub instructions: Option<String>,
    pub tools: Option<Vec<ResponsesFunctionTool>>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<ResponsesTextConfig>,
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<u32>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f32>,
    #[schema(exclusive_minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    pub stream: Option<bool>,
    /// Kept for `previous_response_id` and `GET /v1/responses/{id}` (default true).
    pub store: Option<bool>,
    /// Continues a stored response: its conversation, then this input.
    pub previous_response_id: Option<String>,
    /// Documented no-ops.
    pub metadata: Option<HashMap<String, String>>,
    pub user: Option<String>,
}

/// Text, or input items.
#[derive(Debug, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ResponsesInput {
    Text(String),
    Items(Vec<ResponsesItem>),
}

/// A message, a function call of an earlier answer, or a call's output.
#[derive(Debug, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ResponsesItem {
    Message {
        role: ResponsesRole,
        #[schema(min_length = 1)]
        content: String,
    },
    FunctionCall {
        #[schema(value_type = String, pattern = "^function_call$")]
        r#type: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    FunctionCallOutput {
        #[schema(value_type = String, pattern = "^function_call_output$")]
        r#type: String,
        call_id: String,
        output: String,
    },
}

#[derive(Debug, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResponsesRole {
    User,
    System,
    Developer,
    Assistant,
}

/// A function the model may call.
#[derive(Debug, utoipa::ToSchema)]
pub struct ResponsesFunctionTool {
    #[schema(value_type = String, pattern = "^function$")]
    pub r#type: String,
    pub name: String,
    pub description: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<serde_json::Value>,
    pub strict: Option<bool>,
}

/// `format`: `{"type": "text"}`, `{"type": "json_object"}`, or `{"type": "json_schema",
/// "name", "schema", "strict"}`.
#[derive(Debug, utoipa::ToSchema)]
pub struct ResponsesTextConfig {
    #[schema(value_type = Option<Object>)]
    pub format: Option<serde_json::Value>,
}

/// A response: its output items (reasoning, a message, function calls), status and usage.
#[derive(Debug, utoipa::ToSchema)]
pub struct ResponseObject {
    pub id: String,
    pub object: String,
    pub created_at: i64,
    pub status: String,
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub output: Vec<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub usage: Option<serde_json::Value>,
}

/// One streamed event: `event` is its type, `data` a JSON object with that `type` and a
/// `sequence_number` (`response.created`, `response.output_text.delta`, ...,
/// `response.completed`).
#[derive(Debug, utoipa::ToSchema)]
pub struct ResponseEvent {
    pub event: String,
    pub data: String,
}
