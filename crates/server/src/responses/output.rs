//! The Responses API's answer: output items (`reasoning`, `message` with `output_text`,
//! `function_call`) built from the parts of the answer, whole or as the `response.*`
//! events of a stream (OpenAI's API reference, "Streaming events"), and the chat
//! messages the answer adds to a stored conversation.

use serde_json::{json, Value};

use crate::reasoning::Part;
use crate::tools::ToolCall;

/// A fresh id with `prefix` (`msg`, `fc`, `call`, `rs`, `resp`): 24 random hex digits.
pub(crate) fn new_id(prefix: &str) -> String {
    let a = frink_engine::sampling::random_seed();
    let b = frink_engine::sampling::random_seed();
    format!("{prefix}_{a:016x}{:08x}", b as u32)
}

/// The output items of an answer, in order, and the events that announce them.
pub(crate) struct Items {
    /// Finished items.
    pub(crate) done: Vec<Value>,
    /// The item being written (a message or reasoning) and its text so far.
    open: Option<(Value, String)>,
    /// Stream events (`(type, payload)`), when streaming.
    pub(crate) events: Option<Vec<(String, Value)>>,
    /// Give reasoning items `encrypted_content` (the text itself).
    encrypted: bool,
}

impl Items {
    /// Items for an answer; `stream`: record the events too.
    pub(crate) fn new(stream: bool, encrypted: bool) -> Items {
        Items {
            done: Vec::new(),
            open: None,
            events: stream.then(Vec::new),
            encrypted,
        }
    }

    fn event(&mut self, ty: &str, payload: Value) {
        if let Some(ev) = &mut self.events {
            ev.push((ty.to_string(), payload));
        }
    }

    /// The text kind of an item: (item type, part type, delta event, done event).
    fn kinds(item: &Value) -> (&'static str, &'static str, &'static str) {
        if item["type"] == "reasoning" {
            (
                "reasoning_text",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
            )
        } else {
            (
                "output_text",
                "response.output_text.delta",
                "response.output_text.done",
            )
        }
    }

    /// Finishes the open item, if any.
    pub(crate) fn close(&mut self) {
        let Some((mut item, text)) = self.open.take() else {
            return;
        };
        let index = self.done.len();
        let id = item["id"].clone();
        let (part_type, _, done_event) = Self::kinds(&item);
        let part = if part_type == "output_text" {
            json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
        } else {
            json!({"type": "reasoning_text", "text": text})
        };
        self.event(
            done_event,
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
        );
        self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        item["content"] = json!([part]);
        if item["type"] == "message" {
            item["status"] = json!("completed");
        } else if self.encrypted {
            item["encrypted_content"] = json!(text);
        }
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.done.push(item);
    }

    /// Text of the kind `reasoning` says, into the open item of that kind or a new one.
    fn text(&mut self, reasoning: bool, t: &str) {
        if t.is_empty() {
            return;
        }
        let want = if reasoning { "reasoning" } else { "message" };
        if self
            .open
            .as_ref()
            .is_none_or(|(item, _)| item["type"] != want)
        {
            self.close();
            let item = if reasoning {
                json!({"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []})
            } else {
                json!({"type": "message", "id": new_id("msg"), "status": "in_progress",
                       "role": "assistant", "content": []})
            };
            let index = self.done.len();
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            let part = if reasoning {
                json!({"type": "reasoning_text", "text": ""})
            } else {
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            };
            self.event(
                "response.content_part.added",
                json!({"item_id": item["id"], "output_index": index, "content_index": 0, "part": part}),
            );
            self.open = Some((item, String::new()));
        }
        let index = self.done.len();
        let (item, text) = self.open.as_mut().expect("opened above");
        text.push_str(t);
        let id = item["id"].clone();
        let (_, delta_event, _) = Self::kinds(item);
        let mut payload =
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t});
        if !reasoning {
            payload["logprobs"] = json!([]);
        }
        self.event(delta_event, payload);
    }

    /// A complete function call.
    fn call(&mut self, c: &ToolCall) {
        self.close();
        let index = self.done.len();
        let id = new_id("fc");
        let mut item = json!({"type": "function_call", "id": id, "call_id": new_id("call"),
                              "name": c.name, "arguments": "", "status": "in_progress"});
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": c.arguments}),
        );
        self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": c.arguments, "name": c.name}),
        );
        item["arguments"] = json!(c.arguments);
        item["status"] = json!("completed");
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.done.push(item);
    }

    /// Adds parts of the answer.
    pub(crate) fn parts(&mut self, parts: Vec<Part>) {
        for p in parts {
            match p {
                Part::Reasoning(t) => self.text(true, &t),
                Part::Content(t) => self.text(false, &t),
                Part::Call(c) => self.call(&c),
            }
        }
    }

    /// The stream events recorded since the last call.
    pub(crate) fn take_events(&mut self) -> Vec<(String, Value)> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

/// The chat messages an answer's items add to a conversation: one assistant message with
/// its text, reasoning and calls (the calls' ids the items' `call_id`s).
pub(crate) fn as_messages(items: &[Value]) -> Vec<Value> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for it in items {
        match it["type"].as_str() {
            Some("message") => {
                for p in it["content"].as_array().into_iter().flatten() {
                    text.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            Some("reasoning") => {
                for p in it["content"].as_array().into_iter().flatten() {
                    reasoning.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            Some("function_call") => calls.push(json!({
                "id": it["call_id"], "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]},
            })),
            _ => {}
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    if !reasoning.is_empty() {
        m["reasoning_content"] = json!(reasoning);
    }
    vec![m]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reasoning, text and a call: three items, each added, filled and done in order,
    /// the events' indexes those of the items; the whole list equals the one built without
    /// events.
    #[test]
    fn parts_become_items_and_events() {
        let parts = || {
            vec![
                Part::Reasoning("Think".into()),
                Part::Reasoning(" more.".into()),
                Part::Content("Calling.".into()),
                Part::Call(ToolCall {
                    name: "f".into(),
                    arguments: "{}".into(),
                }),
            ]
        };
        let mut streamed = Items::new(true, false);
        streamed.parts(parts());
        streamed.close();
        let names: Vec<String> = streamed
            .take_events()
            .into_iter()
            .map(|(n, v)| format!("{n}@{}", v["output_index"]))
            .collect();
        assert_eq!(
            names,
            [
                "response.output_item.added@0",
                "response.content_part.added@0",
                "response.reasoning_text.delta@0",
                "response.reasoning_text.delta@0",
                "response.reasoning_text.done@0",
                "response.content_part.done@0",
                "response.output_item.done@0",
                "response.output_item.added@1",
                "response.content_part.added@1",
                "response.output_text.delta@1",
                "response.output_text.done@1",
                "response.content_part.done@1",
                "response.output_item.done@1",
                "response.output_item.added@2",
                "response.function_call_arguments.delta@2",
                "response.function_call_arguments.done@2",
                "response.output_item.done@2",
            ]
        );
        let mut whole = Items::new(false, false);
        whole.parts(parts());
        whole.close();
        let strip = |items: &[Value]| -> Vec<Value> {
            items
                .iter()
                .map(|i| {
                    let mut i = i.clone();
                    i["id"] = Value::Null;
                    if i.get("call_id").is_some() {
                        i["call_id"] = Value::Null;
                    }
                    i
                })
                .collect()
        };
        assert_eq!(strip(&whole.done), strip(&streamed.done));
        assert_eq!(whole.done[0]["content"][0]["text"], "Think more.");
        let m = as_messages(&whole.done);
        assert_eq!(m[0]["content"], "Calling.");
        assert_eq!(m[0]["reasoning_content"], "Think more.");
        assert_eq!(m[0]["tool_calls"][0]["id"], whole.done[2]["call_id"]);
    }
}
