//! The typed requests: each endpoint family's JSON body read once, field by field, into a
//! struct ([`ChatRequest`], [`CompletionRequest`], [`InfillRequest`]) that the rest of the
//! server works from. Reading refuses what [`super::FIELDS`] refuses and names the field
//! at fault; what needs the model (the template, the tokenizer) is checked when the
//! request is prepared ([`crate::requests`]). Ollama's, Anthropic's and the Responses
//! API's bodies are translated into the OpenAI chat or completion fields first, then read
//! here, so a rule about a field lives in one place.

use frink_engine::constraint::Grammar;
use frink_engine::image::IMAGE_MARKER;
use frink_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use super::GenOptions;
use super::{field, gen_options, grammar, opt_bool, opt_i64, opt_str, ApiError, Endpoint};

/// What reading a request checks against the loaded model and the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Tokens of the model's vocabulary (`logit_bias` keys, prompt ids).
    pub n_vocab: usize,
    /// Choices one request may ask for (`n`; `--parallel`).
    pub max_choices: usize,
}

/// A chat request: OpenAI's `/v1/chat/completions` fields with llama.cpp's extensions.
pub struct ChatRequest {
    /// `model` (informational once routed), when given and not empty.
    pub model: Option<String>,
    /// `messages`, each with every field a template may read.
    pub messages: Vec<ChatMessage>,
    /// Sampling, length, stops, streaming, choices.
    pub opts: GenOptions,
    /// `logprobs` with `top_logprobs` or `n_probs`: alternatives per token (0..=20).
    pub logprobs: Option<usize>,
    /// The grammar the answer must match and the field it came from.
    pub grammar: Option<(&'static str, Grammar)>,
    /// `tools` with a `tool_choice` that can call them; `None` without tools.
    pub tools: Option<ToolsAsked>,
    /// `chat_template_kwargs`: template variables added to the server's.
    pub template_kwargs: Option<Map<String, Value>>,
    /// OpenAI's `reasoning_effort` (a template variable of that name).
    pub reasoning_effort: Option<String>,
    /// `reasoning_format`: whether reasoning goes to its own field (`None`: the server's
    /// `--reasoning-format`).
    pub split_reasoning: Option<bool>,
    /// OpenAI's predicted output (`prediction.content`).
    pub prediction: Option<String>,
    /// The start of the answer, which the model continues (Anthropic's final assistant
    /// message; not an OpenAI field).
    pub prefill: Option<String>,
    /// The images of `image_url` parts, in order (each message's content holds
    /// [`frink_engine::image::IMAGE_MARKER`] where one was): a `data:` URI or a URL.
    pub images: Vec<ImageSource>,
}

/// Where an image of a request comes from, and the field that gave it (for errors).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageSource {
    /// A `data:` URI, an `http(s)` URL, or (Ollama, llama.cpp) bare base64.
    pub url: String,
    /// `messages[i].content[j].image_url` and the like.
    pub param: String,
}

/// A request's `tools` (checked, at least one) and what its `tool_choice` makes of them.
pub struct ToolsAsked {
    /// The tools, as the template sees them.
    pub tools: Vec<Value>,
    /// Indices into `tools` of those the answer may call (none for `"none"`).
    pub usable: Vec<usize>,
    /// A call is required (`"required"` or a named function).
    pub required: bool,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
    /// llama.cpp's `parse_tool_calls` (default true; false: calls stay in the text).
    pub parse_calls: bool,
}

impl ToolsAsked {
    /// The tools the answer may call.
    pub fn usable(&self) -> Vec<&Value> {
        self.usable.iter().map(|&i| &self.tools[i]).collect()
    }
}

impl ChatRequest {
    /// Reads a chat request's body.
    ///
    /// Errors: a 400 naming the first field at fault (`messages`, then the options, then
    /// `logprobs`, the grammar, the tools, the template's variables, `reasoning_format`,
    /// `prediction`).
    pub fn read(obj: &Map<String, Value>, limits: Limits) -> Result<ChatRequest, ApiError> {
        let (messages, images) = messages(obj)?;
        let opts = gen_options(obj, Endpoint::Chat, limits)?;
        let logprobs = chat_logprobs(obj)?;
        let grammar = grammar(obj)?;
        let tools = tools(obj)?;
        Ok(ChatRequest {
            model: model(obj),
            messages,
            opts,
            logprobs,
            grammar,
            tools,
            template_kwargs: template_kwargs(obj)?,
            reasoning_effort: reasoning_effort(obj)?,
            split_reasoning: split_reasoning(obj)?,
            prediction: super::prediction(obj)?,
            prefill: None,
            images,
        })
    }
}

/// What every plain-text request (`/v1/completions`, `/completion`, `/infill`) has beside
/// its prompt.
pub struct TextOptions {
    /// `model`, when given and not empty.
    pub model: Option<String>,
    /// Sampling, length, stops, streaming, choices.
    pub opts: GenOptions,
    /// OpenAI's integer `logprobs`, else llama.cpp's `n_probs` (0: none): alternatives per
    /// token.
    pub logprobs: Option<usize>,
    /// The grammar the answer must match and the field it came from.
    pub grammar: Option<(&'static str, Grammar)>,
}

impl TextOptions {
    /// Reads the options of a plain-text request (after its prompt's fields).
    fn read(obj: &Map<String, Value>, limits: Limits) -> Result<TextOptions, ApiError> {
        let opts = gen_options(obj, Endpoint::Completions, limits)?;
        let logprobs = completion_logprobs(obj)?;
        Ok(TextOptions {
            model: model(obj),
            opts,
            logprobs,
            grammar: grammar(obj)?,
        })
    }
}

/// A text completion request: OpenAI's `/v1/completions` (and llama.cpp's `/completion`).
pub struct CompletionRequest {
    /// `prompt`: text or token ids (checked against the vocabulary).
    pub prompt: Prompt,
    /// `suffix`: fill-in-the-middle, the prompt the text before the gap.
    pub suffix: Option<String>,
    /// The rest.
    pub text: TextOptions,
}

impl CompletionRequest {
    /// Reads a completion request's body.
    ///
    /// Errors: a 400 naming the field at fault (a token id outside the vocabulary is one
    /// on `prompt`; a `suffix` beside token ids one on `suffix`).
    pub fn read(obj: &Map<String, Value>, limits: Limits) -> Result<CompletionRequest, ApiError> {
        let prompt = prompt(obj)?;
        let text = TextOptions::read(obj, limits)?;
        let suffix = opt_str(obj, "suffix")?
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        match &prompt {
            Prompt::Ids(_) if suffix.is_some() => {
                return Err(ApiError::invalid(
                    Some("suffix"),
                    "'suffix' needs the prompt as text (the text before the gap)",
                ))
            }
            Prompt::Ids(ids) => {
                let n_vocab = limits.n_vocab;
                if let Some(t) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                    return Err(ApiError::invalid(
                        Some("prompt"),
                        format!("token id {t} is outside the vocabulary of {n_vocab}"),
                    ));
                }
            }
            Prompt::Multimodal(..) if suffix.is_some() => {
                return Err(ApiError::invalid(
                    Some("suffix"),
                    "'suffix' (fill-in-the-middle) takes no images",
                ))
            }
            Prompt::Text(_) | Prompt::Multimodal(..) => {}
        }
        Ok(CompletionRequest {
            prompt,
            suffix,
            text,
        })
    }
}

/// llama.cpp's `POST /infill`: the text before and after the gap, the middle's start, other
/// files of the repository.
pub struct InfillRequest {
    /// `input_prefix`: the text before the gap.
    pub prefix: String,
    /// `input_suffix`: the text after it.
    pub suffix: String,
    /// `prompt`: the start of the middle.
    pub middle: String,
    /// `input_extra`: (file name, text) of other files (a name defaults to `tmp`, as
    /// llama.cpp's).
    pub extra: Vec<(String, String)>,
    /// The rest (`n_probs` included).
    pub text: TextOptions,
}

impl InfillRequest {
    /// Reads an `/infill` body.
    ///
    /// Errors: a 400 naming the field at fault.
    pub fn read(obj: &Map<String, Value>, limits: Limits) -> Result<InfillRequest, ApiError> {
        let text = TextOptions::read(obj, limits)?;
        let field = |name: &'static str| -> Result<String, ApiError> {
            Ok(opt_str(obj, name)?.unwrap_or("").to_string())
        };
        Ok(InfillRequest {
            prefix: field("input_prefix")?,
            suffix: field("input_suffix")?,
            middle: field("prompt")?,
            extra: input_extra(obj)?,
            text,
        })
    }
}

/// A request's `model`, when it is a string that is not empty.
pub fn model(obj: &Map<String, Value>) -> Option<String> {
    obj.get("model")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `input_extra`: `[{"filename", "text"}]`.
fn input_extra(obj: &Map<String, Value>) -> Result<Vec<(String, String)>, ApiError> {
    let bad = || {
        ApiError::invalid(
            Some("input_extra"),
            "'input_extra' must be an array of {\"filename\": string, \"text\": string}",
        )
    };
    match obj.get("input_extra") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                let o = item.as_object().ok_or_else(bad)?;
                let text = o.get("text").and_then(Value::as_str).ok_or_else(bad)?;
                let name = match o.get("filename") {
                    None | Some(Value::Null) => "tmp",
                    Some(v) => v.as_str().ok_or_else(bad)?,
                };
                Ok((name.to_string(), text.to_string()))
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// `tools` and `tool_choice` (with `parallel_tool_calls`, `parse_tool_calls` when there
/// are tools). A required or named call needs tools to call (an empty `tools` is none).
///
/// Errors: a 400 on `tools` or `tool_choice`.
fn tools(obj: &Map<String, Value>) -> Result<Option<ToolsAsked>, ApiError> {
    let choice = obj.get("tool_choice");
    let choice_needs_tools = choice.is_some_and(|c| !c.is_null() && c != "none" && c != "auto");
    let no_tools = || ApiError::invalid(Some("tool_choice"), "'tool_choice' requires 'tools'");
    let bad = |p: &str, m: String| ApiError::invalid(Some(p), m);
    let Some(tv) = obj.get("tools").filter(|v| !v.is_null()) else {
        return if choice_needs_tools {
            Err(no_tools())
        } else {
            Ok(None)
        };
    };
    let tools = crate::tools::check_tools(tv).map_err(|m| bad("tools", m))?;
    if tools.is_empty() {
        return if choice_needs_tools {
            Err(no_tools())
        } else {
            Ok(None)
        };
    }
    let (usable, required) = {
        let (usable, required) =
            crate::tools::choice(&tools, choice).map_err(|m| bad("tool_choice", m))?;
        let index = |u: &Value| tools.iter().position(|t| std::ptr::eq(t, u));
        (usable.into_iter().filter_map(index).collect(), required)
    };
    Ok(Some(ToolsAsked {
        tools,
        usable,
        required,
        parallel: opt_bool(obj, "parallel_tool_calls")?.unwrap_or(true),
        parse_calls: opt_bool(obj, "parse_tool_calls")?.unwrap_or(true),
    }))
}

/// An integer field of at most 20 alternatives per token (`top_logprobs`, `n_probs`,
/// a completion's `logprobs`), checked whenever it is given.
fn alternatives(obj: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
    let v = opt_i64(obj, name)?;
    match v {
        Some(n) if !(0..=20).contains(&n) => Err(ApiError::invalid(
            Some(name),
            format!("'{name}' must be between 0 and 20, got {n}"),
        )),
        _ => Ok(v),
    }
}

/// `logprobs` with `top_logprobs` (OpenAI's) or `n_probs` (llama.cpp's; > 0 asks by
/// itself): how many alternatives per token, at most 20, or `None`. A `top_logprobs`
/// above 0 without `logprobs: true` is a 400, as OpenAI answers it (it would be ignored).
fn chat_logprobs(obj: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let top = alternatives(obj, "top_logprobs")?;
    let n_probs = alternatives(obj, "n_probs")?;
    let logprobs = match opt_bool(obj, "logprobs")? {
        Some(true) => Some(top.or(n_probs).unwrap_or(0)),
        _ if top.is_some_and(|n| n > 0) => {
            return Err(ApiError::invalid(
                Some("top_logprobs"),
                "'top_logprobs' needs 'logprobs': true",
            ))
        }
        // llama.cpp's n_probs > 0 asks for the probabilities by itself.
        None => n_probs.filter(|&n| n > 0),
        Some(false) => None,
    };
    Ok(logprobs.map(|n| n as usize))
}

/// A text completion's alternatives per token: OpenAI's integer `logprobs`, else
/// llama.cpp's `n_probs` (0: none); each checked when given.
fn completion_logprobs(obj: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let logprobs = alternatives(obj, "logprobs")?;
    let n_probs = alternatives(obj, "n_probs")?;
    Ok(logprobs.or(n_probs.filter(|&n| n != 0)).map(|n| n as usize))
}

/// Variables the server sets in the template's context itself (the request has fields
/// for them); `chat_template_kwargs` may not replace them.
const RESERVED_KWARGS: [&str; 6] = [
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// `chat_template_kwargs`: an object, none of whose names is one the server sets
/// ([`RESERVED_KWARGS`]).
fn template_kwargs(obj: &Map<String, Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => match m.keys().find(|k| RESERVED_KWARGS.contains(&k.as_str())) {
            Some(k) => Err(ApiError::invalid(
                Some("chat_template_kwargs"),
                format!("'chat_template_kwargs': {k:?} is set by the server from the request"),
            )),
            None => Ok(Some(m.clone())),
        },
        Some(_) => Err(ApiError::invalid(
            Some("chat_template_kwargs"),
            "'chat_template_kwargs' must be an object",
        )),
    }
}

/// `reasoning_effort`: a string (whether the template reads it is checked when the
/// request is prepared).
fn reasoning_effort(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    match obj.get("reasoning_effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) => Ok(Some(e.clone())),
        Some(_) => Err(ApiError::invalid(
            Some("reasoning_effort"),
            "'reasoning_effort' must be a string",
        )),
    }
}

/// `reasoning_format`: `"none"` keeps `<think>` reasoning in the text, `"auto"` and
/// `"deepseek"` split it out; `None` when absent.
fn split_reasoning(obj: &Map<String, Value>) -> Result<Option<bool>, ApiError> {
    Ok(match opt_str(obj, "reasoning_format")? {
        None => None,
        Some("none") => Some(false),
        Some("auto" | "deepseek") => Some(true),
        Some(other) => {
            return Err(ApiError::invalid(
                Some("reasoning_format"),
                format!(
                    "'reasoning_format' must be \"none\", \"auto\" or \"deepseek\", got {other:?}"
                ),
            ))
        }
    })
}

/// The roles a chat message may have: OpenAI's (`developer` is its newer `system`,
/// `function` the legacy `tool`), which Ollama's are a subset of; any other is a 400, as
/// OpenAI answers it.
const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// `messages` of a chat request: role, text (a string, null, or an array of
/// `{"type": "text", "text": …}` parts) and every other field the template may read
/// (`tool_calls` with their `arguments` parsed into objects, `tool_call_id`, `name`).
fn messages(obj: &Map<String, Value>) -> Result<(Vec<ChatMessage>, Vec<ImageSource>), ApiError> {
    let bad = |m: &str| ApiError::invalid(Some("messages"), m.to_string());
    let list = match field(obj, "messages") {
        None => return Err(bad("'messages' is required")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("'messages' must be an array")),
    };
    if list.is_empty() {
        return Err(bad("'messages' must not be empty"));
    }
    let mut images = Vec::new();
    let messages = list
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let m = m
                .as_object()
                .ok_or_else(|| bad(&format!("messages[{i}] must be an object")))?;
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&format!("messages[{i}].role must be a string")))?;
            if !ROLES.contains(&role) {
                return Err(bad(&format!(
                    "messages[{i}].role {role:?} is not one of {}",
                    ROLES.join(", ")
                )));
            }
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => content_parts(i, parts, &mut images)?,
                Some(_) => {
                    return Err(bad(&format!(
                        "messages[{i}].content must be a string or an array of parts"
                    )))
                }
            };
            if m.get("tool_calls")
                .is_some_and(|c| !c.is_null() && !c.is_array())
            {
                return Err(bad(&format!("messages[{i}].tool_calls must be an array")));
            }
            Ok(ChatMessage {
                role: role.to_string(),
                content,
                extra: crate::tools::message_extra(m),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    // Beside images, a string content's marker would take an image's place (text parts
    // are refused it above).
    if !images.is_empty() {
        let marked = list.iter().position(|m| {
            m.get("content")
                .and_then(Value::as_str)
                .is_some_and(|c| c.contains(IMAGE_MARKER))
        });
        if let Some(i) = marked {
            return Err(ApiError::invalid(
                Some(&format!("messages[{i}].content")),
                format!(
                    "messages[{i}].content holds {IMAGE_MARKER}, the text that marks an \
                     image's place, beside images"
                ),
            ));
        }
    }
    Ok((messages, images))
}

/// The text of message `i`'s content `parts`: its text parts in order, with
/// [`IMAGE_MARKER`] for each `image_url` part, whose URL goes to `images`.
fn content_parts(
    i: usize,
    parts: &[Value],
    images: &mut Vec<ImageSource>,
) -> Result<String, ApiError> {
    let mut s = String::new();
    for (j, part) in parts.iter().enumerate() {
        let param = format!("messages[{i}].content[{j}]");
        let bad = |m: String| ApiError::invalid(Some(&param), m);
        // By its type (a part without one is read by its text, as before).
        let ty = part.get("type").and_then(Value::as_str);
        if matches!(ty, None | Some("text")) {
            let Some(t) = part.get("text").and_then(Value::as_str) else {
                return Err(bad(format!("{param}.text must be a string")));
            };
            if t.contains(IMAGE_MARKER) {
                return Err(bad(format!(
                    "{param}.text holds {IMAGE_MARKER}, the text that marks an image's place"
                )));
            }
            s.push_str(t);
            continue;
        }
        if ty != Some("image_url") {
            return Err(bad(format!(
                "{param} must be a text part or an image_url part, not {ty:?}"
            )));
        }
        // `{"url": …, "detail": …}`, or the URL alone.
        let url = match part.get("image_url") {
            Some(Value::String(u)) => u,
            Some(Value::Object(o)) => match o.get("url") {
                Some(Value::String(u)) => u,
                _ => return Err(bad(format!("{param}.image_url.url must be a string"))),
            },
            _ => {
                return Err(bad(format!(
                    "{param}.image_url must be an object with a url"
                )))
            }
        };
        s.push_str(IMAGE_MARKER);
        images.push(ImageSource {
            url: url.clone(),
            param: format!("{param}.image_url"),
        });
    }
    Ok(s)
}

/// The `prompt` of a completion request: a string (or an array holding one), or token ids.
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
    /// llama.cpp's multimodal prompt `{"prompt_string": …, "multimodal_data": [base64…]}`:
    /// text with one [`IMAGE_MARKER`] per image.
    Multimodal(String, Vec<ImageSource>),
}

/// Reads `prompt`.
fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let bad = |m: &str| ApiError::invalid(Some("prompt"), m.to_string());
    match field(obj, "prompt") {
        None => Err(bad("'prompt' is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string()))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => Ok(Prompt::Ids(
            a.iter()
                .map(|v| v.as_u64().unwrap_or_default().min(u32::MAX as u64) as u32)
                .collect(),
        )),
        Some(Value::Array(a)) if a.len() > 1 && a.iter().all(Value::is_string) => {
            Err(bad("only one prompt per request is supported"))
        }
        Some(Value::Object(o)) => {
            let text = match o.get("prompt_string") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(bad("'prompt.prompt_string' must be a string")),
            };
            let data = match o.get("multimodal_data") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a.clone(),
                Some(_) => {
                    return Err(bad(
                        "'prompt.multimodal_data' must be an array of base64 strings",
                    ))
                }
            };
            if let Some(k) = o
                .keys()
                .find(|k| *k != "prompt_string" && *k != "multimodal_data")
            {
                return Err(bad(&format!("'prompt.{k}' is not supported")));
            }
            let images = data
                .iter()
                .enumerate()
                .map(|(k, d)| match d {
                    Value::String(s) => Ok(ImageSource {
                        url: s.clone(),
                        param: format!("prompt.multimodal_data[{k}]"),
                    }),
                    _ => Err(bad(&format!(
                        "'prompt.multimodal_data[{k}]' must be a base64 string"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(match images.is_empty() {
                true => Prompt::Text(text),
                false => Prompt::Multimodal(text, images),
            })
        }
        Some(_) => Err(bad(
            "'prompt' must be a string, an array of one string, an array of token ids, or \
             {\"prompt_string\", \"multimodal_data\"}",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: Limits = Limits {
        n_vocab: 100,
        max_choices: 4,
    };

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    fn chat(v: Value) -> Result<ChatRequest, ApiError> {
        ChatRequest::read(&obj(v), LIMITS)
    }

    fn param(r: Result<impl Sized, ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    #[test]
    fn a_chat_request_is_read_into_its_fields() {
        let r = chat(json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "logprobs": true, "top_logprobs": 3, "n": 2,
            "tools": [{"type": "function", "function": {"name": "a"}},
                      {"type": "function", "function": {"name": "b"}}],
            "tool_choice": {"type": "function", "function": {"name": "b"}},
            "parallel_tool_calls": false,
            "chat_template_kwargs": {"enable_thinking": false},
            "reasoning_effort": "low", "reasoning_format": "none",
            "prediction": {"type": "content", "content": "x"},
        }))
        .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(r.messages.len(), 1);
        assert_eq!((r.logprobs, r.opts.n), (Some(3), 2));
        let t = r.tools.expect("tools");
        assert_eq!(
            (t.usable.clone(), t.required, t.parallel),
            (vec![1], true, false)
        );
        assert_eq!(t.usable()[0]["function"]["name"], "b");
        assert_eq!(r.template_kwargs.map(|m| m.len()), Some(1));
        assert_eq!(r.reasoning_effort.as_deref(), Some("low"));
        assert_eq!(r.split_reasoning, Some(false));
        assert_eq!(r.prediction.as_deref(), Some("x"));
    }

    #[test]
    fn each_chat_field_at_fault_is_named() {
        let m = json!([{"role": "user", "content": "hi"}]);
        for (body, field) in [
            (json!({}), "messages"),
            (json!({"messages": m, "n": 5}), "n"),
            (
                json!({"messages": m, "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"messages": m, "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": m, "tools": [], "tool_choice": "required"}),
                "tool_choice",
            ),
            (json!({"messages": m, "tools": [{"type": "x"}]}), "tools"),
            (
                json!({"messages": m, "chat_template_kwargs": 1}),
                "chat_template_kwargs",
            ),
            (
                json!({"messages": m, "reasoning_effort": 1}),
                "reasoning_effort",
            ),
            (
                json!({"messages": m, "reasoning_format": "x"}),
                "reasoning_format",
            ),
            // The field whose value is out of range is named, whichever asked.
            (
                json!({"messages": m, "top_logprobs": 3, "n_probs": 25}),
                "n_probs",
            ),
            (
                json!({"messages": m, "logprobs": true, "n_probs": 21}),
                "n_probs",
            ),
            // Without `logprobs: true` a `top_logprobs` would be ignored.
            (json!({"messages": m, "top_logprobs": 5}), "top_logprobs"),
            (
                json!({"messages": m, "logprobs": false, "top_logprobs": 5}),
                "top_logprobs",
            ),
            // The server's own template variables are not the request's to replace.
            (
                json!({"messages": m, "chat_template_kwargs": {"messages": 1}}),
                "chat_template_kwargs",
            ),
            (
                json!({"messages": m, "chat_template_kwargs": {"add_generation_prompt": false}}),
                "chat_template_kwargs",
            ),
            (
                json!({"messages": m, "tools": [{"type": "function", "function": {"name": ""}}]}),
                "tools",
            ),
            (
                json!({"messages": m, "tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}),
                "tools",
            ),
        ] {
            assert_eq!(param(chat(body.clone())).as_deref(), Some(field), "{body}");
        }
        // No tools: `tool_choice` "auto" or "none" asks nothing, and the tool fields are
        // not read.
        let r = chat(json!({"messages": m, "tool_choice": "auto", "parallel_tool_calls": 1}));
        assert!(r.is_ok_and(|r| r.tools.is_none()));
    }

    #[test]
    fn a_completion_request_checks_its_prompt() {
        let read = |v: Value| CompletionRequest::read(&obj(v), LIMITS);
        let r = read(json!({"prompt": "a", "suffix": "b", "n_probs": 2}));
        let r = r.unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!((r.suffix.as_deref(), r.text.logprobs), (Some("b"), Some(2)));
        assert_eq!(
            param(read(json!({"prompt": [1, 100]}))).as_deref(),
            Some("prompt")
        );
        assert_eq!(
            param(read(json!({"prompt": [1], "suffix": "b"}))).as_deref(),
            Some("suffix")
        );
        assert_eq!(
            param(read(json!({"prompt": "a", "logprobs": 21}))).as_deref(),
            Some("logprobs")
        );
        assert!(read(json!({"prompt": [1, 99]})).is_ok());
        // Each of the two is checked when given, the one not used too.
        assert_eq!(
            param(read(json!({"prompt": "a", "logprobs": 0, "n_probs": 25}))).as_deref(),
            Some("n_probs")
        );
        let r = read(json!({"prompt": "a", "logprobs": 0, "n_probs": 5}));
        assert_eq!(r.map(|r| r.text.logprobs).ok(), Some(Some(0)));
    }

    #[test]
    fn an_infill_request_reads_its_files() {
        let read = |v: Value| InfillRequest::read(&obj(v), LIMITS);
        let r = read(json!({"input_prefix": "a", "input_extra": [{"text": "t"}]}));
        let r = r.unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!((r.prefix.as_str(), r.suffix.as_str()), ("a", ""));
        assert_eq!(r.extra, vec![("tmp".to_string(), "t".to_string())]);
        assert_eq!(r.text.logprobs, None);
        let r = read(json!({"input_prefix": "a", "n_probs": 2}));
        assert_eq!(r.map(|r| r.text.logprobs).ok(), Some(Some(2)));
        assert_eq!(
            param(read(json!({"n_probs": 99}))).as_deref(),
            Some("n_probs")
        );
        assert_eq!(
            param(read(json!({"input_extra": [1]}))).as_deref(),
            Some("input_extra")
        );
    }
}
