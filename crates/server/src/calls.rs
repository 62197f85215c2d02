//! The pieces an answer is read into: a tool call, the tools a request may call, an item
//! of parsed output, a part of a split answer. The leaf the tool-call formats, the
//! reasoning splitter and harmony's parser share (it imports none of them).

use serde_json::Value;

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as a JSON text (OpenAI's `function.arguments` is a string).
    pub arguments: String,
}

/// What a piece of output turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// Text for `content`.
    Text(String),
    /// A complete call.
    Call(ToolCall),
}

/// The tools a request may call: each one's name and parameters' schema (the XML format
/// reads a value as a string or as JSON by its property's type; the JSON fallback accepts
/// only these names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolSet {
    tools: Vec<(String, Value)>,
}

impl ToolSet {
    /// From OpenAI `tools` entries (`{"type": "function", "function": {"name", "parameters"}}`).
    pub fn new(tools: &[&Value]) -> ToolSet {
        ToolSet {
            tools: tools
                .iter()
                .filter_map(|t| {
                    let f = &t["function"];
                    Some((f["name"].as_str()?.to_string(), f["parameters"].clone()))
                })
                .collect(),
        }
    }

    /// Whether a tool is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.tools.iter().any(|(n, _)| n == name)
    }

    /// The schema of parameter `param` of tool `name`, if declared.
    pub(crate) fn param(&self, name: &str, param: &str) -> Option<&Value> {
        let (_, p) = self.tools.iter().find(|(n, _)| n == name)?;
        p.get("properties")?.get(param)
    }
}

/// A call from a name and a JSON text of its arguments (which must be an object).
pub fn call_from(name: &str, args: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(args.trim()).ok()?;
    (v.is_object() && !name.is_empty()).then(|| ToolCall {
        name: name.to_string(),
        arguments: v.to_string(),
    })
}

/// A piece of the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Thinking, for `reasoning_content`.
    Reasoning(String),
    /// The answer, for `content`.
    Content(String),
    /// A tool call (harmony answers carry them in their own channel).
    Call(ToolCall),
}
