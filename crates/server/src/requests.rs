//! Completion requests: the OpenAI chat and text endpoints' handlers, each request parsed,
//! rendered and tokenized into a [`Prepared`] (what Ollama's endpoints share), checked
//! against the server's limits and queued as one scheduler request per choice.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::api::{self, ApiError};
use std::sync::atomic::Ordering;

use frink_engine::constraint::Constraint;
use frink_engine::scheduler::{Event, EventSink, Request, SubmitError};
use frink_tokenizer::{Infill, InfillLimits, TemplateInputs};

use crate::api::request::{
    ChatRequest, CompletionRequest, Limits, Prompt, TextOptions, ToolsAsked,
};
use crate::api::GenOptions;
use crate::respond::{shutting_down, stream_response, whole_response, Formatter, Kind};
use crate::{answer, reasoning, tools, unix_now, AppState, Engine, St};

/// A parsed, tokenized completion request, ready to queue.
pub(crate) struct Prepared {
    pub(crate) prompt: Vec<u32>,
    pub(crate) opts: GenOptions,
    /// `Some(n)`: report log-probabilities with `n` alternatives.
    pub(crate) logprobs: Option<usize>,
    /// The grammar every choice must match, compiled once (each choice gets a clone: its
    /// own grammar state).
    pub(crate) constraint: Option<Constraint>,
    /// The field the grammar came from (a grammar the answer cannot follow is a 400 naming
    /// it).
    pub(crate) grammar_param: Option<&'static str>,
    /// What to read out of a chat answer (reasoning, tool calls).
    pub(crate) answer: answer::AnswerFormat,
    /// Control tokens the answer shows as text (a tool-call format's markers).
    pub(crate) shown_tokens: Vec<u32>,
    /// OpenAI's predicted output, tokenized (proposed for speculative verification).
    pub(crate) prediction: Option<Vec<u32>>,
    pub(crate) model: String,
    /// The prompt's images ([`frink_engine::image`]).
    pub(crate) images: Vec<frink_engine::image::PromptImage>,
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(st): St,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    body: Bytes,
) -> Response {
    handle(st, body, Kind::Chat, prepare_chat, log.map(|l| l.0)).await
}

/// A completion request: its body parsed and `prepare`d off the HTTP threads, then
/// queued and answered as `kind`.
async fn handle(
    st: Arc<AppState>,
    body: Bytes,
    kind: Kind,
    prepare: fn(&AppState, &Map<String, Value>) -> Result<Prepared, ApiError>,
    log: Option<crate::log::RequestLog>,
) -> Response {
    let r = st
        .offload(move |st| prepare(st, &api::parse_object(&body)?))
        .await;
    match r {
        Ok(p) => complete(&st, kind, p, log.unwrap_or_default()).await,
        Err(e) => e.into_response(),
    }
}

/// The limits a request is read against on this server's model ([`api::request::Limits`]).
pub(crate) fn limits(st: &AppState, eng: &Engine) -> Limits {
    Limits {
        n_vocab: eng.tok.n_vocab(),
        max_choices: st.parallel,
    }
}

/// The prompt tokens a context shift keeps: llama.cpp's `n_keep` after the BOS the
/// prompt starts with (`update_slots`: `n_keep + add_bos_token`), -1 the whole prompt.
fn n_keep(eng: &Engine, prompt: &[u32], n_keep: Option<i64>) -> usize {
    let bos = usize::from(prompt.first().is_some_and(|&t| Some(t) == eng.tok.bos_id()));
    match n_keep {
        Some(-1) => prompt.len(),
        Some(n) => usize::try_from(n).unwrap_or(0).saturating_add(bos),
        None => bos,
    }
    .min(prompt.len())
}

/// The engine of a model that generates text.
///
/// Errors: a 400 naming the model when it is an encoder (it embeds and reranks only),
/// or the model's loading error.
pub(crate) fn generative(st: &AppState) -> Result<&Engine, ApiError> {
    let eng = st.engine()?;
    if eng.encoder {
        return Err(ApiError::invalid(
            Some("model"),
            format!(
                "model '{}' is an encoder ({}): it serves embeddings{}, not text generation",
                st.model_name,
                eng.arch,
                if eng.reranker { " and reranking" } else { "" }
            ),
        )
        .with_code("model_not_supported"));
    }
    Ok(eng)
}

/// A chat request (OpenAI's fields, llama.cpp's extensions) read ([`ChatRequest::read`]),
/// rendered through the template and tokenized: everything `/v1/chat/completions` and
/// Ollama's `/api/chat` share.
///
/// Errors: a 400 naming the field at fault.
pub(crate) fn prepare_chat(st: &AppState, obj: &Map<String, Value>) -> Result<Prepared, ApiError> {
    prepare_chat_with(st, obj, None)
}

/// [`prepare_chat`] with `prefill`: the start of the answer, which the model continues
/// (after the template's generation prompt), as Anthropic's final assistant message is.
pub(crate) fn prepare_chat_with(
    st: &AppState,
    obj: &Map<String, Value>,
    prefill: Option<&str>,
) -> Result<Prepared, ApiError> {
    let eng = generative(st)?;
    let mut req = ChatRequest::read(obj, limits(st, eng))?;
    req.prefill = prefill.map(str::to_string);
    chat_prepared(st, eng, req)
}

/// A chat request rendered, constrained and tokenized for `eng`'s model.
///
/// Errors: a 400 naming the field at fault (tools the template teaches no format for, a
/// `reasoning_effort` it does not read, messages it cannot render).
fn chat_prepared(st: &AppState, eng: &Engine, req: ChatRequest) -> Result<Prepared, ApiError> {
    let ChatRequest {
        model,
        messages,
        opts,
        logprobs,
        mut grammar,
        tools: tools_asked,
        template_kwargs: request_kwargs,
        reasoning_effort,
        split_reasoning,
        prediction,
        prefill,
        images: image_sources,
    } = req;
    let template = st.template(eng);
    let ChatTools {
        format: tool_format,
        trigger,
        mut answer,
        mut markers,
        for_template: tools_for_template,
    } = chat_tools(eng, tools_asked, template, &mut grammar)?;
    let inputs = TemplateInputs {
        add_generation_prompt: true,
        tools: tools_for_template,
        kwargs: template_kwargs(st, request_kwargs, reasoning_effort, template)?,
        ..TemplateInputs::default()
    };
    let gemma4 = tool_format == Some(tools::ToolFormat::Gemma4);
    let messages = if tools::wants_tool_responses(tool_format, template.unwrap_or("")) {
        tools::gemma4_tool_responses(messages)
    } else {
        messages
    };
    let mut rendered = eng
        .tok
        .apply_template_with(st.chat_template.as_deref(), &messages, &inputs)
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    if gemma4 && rendered.text.ends_with("<turn|>\n") {
        // A history that ends with a closed model turn (results and an answer) gets no
        // new one from Gemma 4's template: open it, as llama.cpp does.
        rendered.text.push_str("<|turn>model\n");
    }
    if let Some(text) = prefill {
        rendered.text.push_str(&text);
    }
    let model = model.unwrap_or_else(|| st.model_name.clone());
    let (prompt, images) = if image_sources.is_empty() {
        let prompt = eng
            .tok
            .encode_chat(&rendered)
            .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
        (prompt, Vec::new())
    } else {
        let special = rendered.template_ranges();
        crate::images::prompt(
            eng,
            &model,
            &rendered.text,
            &special,
            &image_sources,
            st.images,
            st.n_ctx,
            "messages",
        )?
    };
    let split = split_reasoning.unwrap_or(st.split_reasoning);
    answer.reasoning = reasoning::Mode::detect(template.unwrap_or(""), &rendered.text, split);
    match answer.reasoning {
        Some(reasoning::Mode::Harmony { .. }) => markers.extend(crate::harmony::MARKERS),
        // Tags that are control tokens (Gemma 4's channel) must show for the split.
        Some(reasoning::Mode::Think { tags, .. }) => markers.extend(tags.tokens),
        None => {}
    }
    markers.sort_unstable();
    markers.dedup();
    let shown_tokens = markers
        .iter()
        .filter_map(|m| eng.tok.control_token(m))
        .collect();
    let grammar_param = grammar.as_ref().map(|g| g.0);
    let constraint = eng.constraint(grammar, trigger).map_err(|e| {
        // A tool's schema that does not compile is named, not the grammar built of them.
        match (grammar_param, inputs.tools.as_ref()) {
            (Some("tools" | "tool_choice"), Some(tools)) => {
                tool_schema_error(eng, tools).unwrap_or(e)
            }
            _ => e,
        }
    })?;
    let prediction = prediction
        .map(|text| eng.tok.encode(&text, false, false))
        .transpose()
        .map_err(|e| ApiError::invalid(Some("prediction"), e.to_string()))?;
    Ok(Prepared {
        prompt,
        opts,
        logprobs,
        constraint,
        grammar_param,
        answer,
        shown_tokens,
        prediction,
        model,
        images,
    })
}

/// What a chat request's `tools` and `tool_choice` make of it ([`chat_tools`]).
struct ChatTools {
    /// The call format the template teaches, if frink parses one.
    format: Option<tools::ToolFormat>,
    /// A lazy grammar's trigger (`tool_choice: "auto"`: a call, once begun, is enforced).
    trigger: Option<Vec<frink_engine::constraint::Trigger>>,
    /// How the answer is read (its tool format and tools; the reasoning is set later).
    answer: answer::AnswerFormat,
    /// The markers whose control tokens the answer must show.
    markers: Vec<&'static str>,
    /// The tools handed to the template.
    for_template: Option<Value>,
}

/// Tools ([`ToolsAsked`]): rendered by the template; calls parsed from the answer in the
/// format the template teaches; a required call enforced by a grammar (set into `grammar`,
/// which must then be free), `auto` by a lazy one.
///
/// Errors: a 400 on `tools` for a template that teaches no format frink parses, or on the
/// grammar's field beside a call.
fn chat_tools(
    eng: &Engine,
    asked: Option<ToolsAsked>,
    template: Option<&str>,
    grammar: &mut Option<(&'static str, frink_engine::constraint::Grammar)>,
) -> Result<ChatTools, ApiError> {
    // A lazy grammar's trigger (tool_choice "auto": a call, once begun, is enforced).
    let mut trigger = None;
    let mut answer = answer::AnswerFormat::default();
    // The markers whose control tokens the answer must show.
    let mut markers: Vec<&str> = Vec::new();
    let mut tools_for_template = None;
    let tool_format = tools::ToolFormat::detect(template.unwrap_or(""));
    if let Some(asked) = asked {
        let bad = |p: &str, m: String| ApiError::invalid(Some(p), m);
        let usable = asked.usable();
        let format = tool_format.ok_or_else(|| {
            bad(
                "tools",
                "this model's chat template teaches no tool-call format frink parses \
                 (see `frink inspect` and docs/server.md's list of formats)"
                    .into(),
            )
            .with_code("unsupported_field")
        })?;
        let parallel = asked.parallel;
        if asked.required {
            if let Some((param, _)) = &*grammar {
                return Err(bad(
                    param,
                    format!("'{param}' and a required tool call both constrain the answer"),
                ));
            }
            let lark = format.call_grammar(&usable, parallel, &|m| eng.tok.control_token(m));
            *grammar = Some(("tool_choice", frink_engine::constraint::Grammar::Lark(lark)));
        } else if !usable.is_empty() {
            *grammar = auto_grammar(eng, format, &usable, parallel, grammar.take(), &mut trigger)?;
        }
        // llama.cpp's `parse_tool_calls: false`: the calls stay in the text.
        if !usable.is_empty() && asked.parse_calls {
            // Harmony's calls come out of its channels (the reasoning splitter).
            answer.tool_format = Some(format).filter(|&f| f != tools::ToolFormat::Harmony);
            answer.tools = tools::ToolSet::new(&usable);
            markers.extend(format.markers());
        }
        tools_for_template = Some(Value::Array(asked.tools.clone()));
    }
    Ok(ChatTools {
        format: tool_format,
        trigger,
        answer,
        markers,
        for_template: tools_for_template,
    })
}

/// The grammar of `tool_choice: "auto"` with `usable` tools: alone, free text with a call
/// held to the grammar once it begins (a lazy grammar, its `trigger` set); beside a JSON
/// schema or `json_object` (`asked`), a call or one JSON value of that shape, from the
/// first token ([`tools::ToolFormat::call_or_json_grammar`]).
///
/// Errors: a 400 for another grammar beside the tools (a call and the grammar's text
/// cannot both be the answer).
fn auto_grammar(
    eng: &Engine,
    format: tools::ToolFormat,
    usable: &[&Value],
    parallel: bool,
    asked: Option<(&'static str, frink_engine::constraint::Grammar)>,
    trigger: &mut Option<Vec<frink_engine::constraint::Trigger>>,
) -> Result<Option<(&'static str, frink_engine::constraint::Grammar)>, ApiError> {
    use frink_engine::constraint::Grammar;
    let token = |m: &str| eng.tok.control_token(m);
    let (param, schema) = match asked {
        None => {
            let lark = format.auto_grammar(usable, parallel, &token);
            *trigger = Some(format.triggers(&token));
            return Ok(Some(("tools", Grammar::Lark(lark))));
        }
        // (Harmony's answer lives in its channels: a bare JSON answer is not its shape.)
        Some((param, Grammar::JsonSchema(s))) if format != tools::ToolFormat::Harmony => (param, s),
        Some((param, Grammar::JsonObject)) if format != tools::ToolFormat::Harmony => {
            (param, serde_json::json!({"type": "object"}))
        }
        Some((param, _)) => {
            return Err(ApiError::invalid(
                Some(param),
                format!(
                    "'{param}' beside tools under tool_choice \"auto\": the answer cannot both \
                     follow the grammar and call a tool; set tool_choice \"none\" (the \
                     grammar alone) or \"required\" (a call)"
                ),
            )
            .with_code("unsupported_field"))
        }
    };
    let lark = format.call_or_json_grammar(usable, parallel, &token, &schema);
    Ok(Some((param, Grammar::Lark(lark))))
}

/// The first of `tools` whose `parameters` schema does not compile as a grammar of its
/// own: a 400 on `tools` naming it and why (the grammar of calls built from every tool
/// says only that it failed).
fn tool_schema_error(eng: &Engine, tools: &Value) -> Option<ApiError> {
    let tools = tools.as_array()?;
    tools.iter().enumerate().find_map(|(i, t)| {
        let schema = t
            .pointer("/function/parameters")
            .filter(|p| p.is_object())?;
        let g = frink_engine::constraint::Grammar::JsonSchema(schema.clone());
        eng.constraint(Some(("tools", g)), None).err().map(|e| {
            ApiError::invalid(
                Some("tools"),
                e.message
                    .replacen("'tools'", &format!("'tools[{i}].function.parameters'"), 1),
            )
            .with_code("invalid_grammar")
        })
    })
}

/// The template's variables: the server's `--chat-template-kwargs`, extended and
/// overridden by the request's `chat_template_kwargs`, then OpenAI's `reasoning_effort`
/// as the template variable of that name (gpt-oss's templates read it; Anthropic's
/// `output_config.effort` and the Responses API's `reasoning.effort` arrive here as it).
///
/// Errors: a 400 for a `reasoning_effort` on a template that reads no such variable.
fn template_kwargs(
    st: &AppState,
    asked: Option<Map<String, Value>>,
    reasoning_effort: Option<String>,
    template: Option<&str>,
) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = st.chat_template_kwargs.clone();
    let asked = asked.unwrap_or_default();
    // The two switches of thinking are refused where the template has none, as the
    // other APIs' switches are (Ollama's `think`, Anthropic's `thinking`).
    let source = template.unwrap_or("");
    let unread =
        if asked.get("enable_thinking") == Some(&Value::Bool(true)) && !reasoning::thinks(source) {
            Some("enable_thinking")
        } else {
            Some("reasoning_effort")
                .filter(|k| asked.get(*k).is_some_and(|v| !v.is_null()) && !source.contains(k))
        };
    if let Some(k) = unread {
        return Err(ApiError::invalid(
            Some("chat_template_kwargs"),
            format!("'chat_template_kwargs': {k:?}: this model's chat template has no such switch"),
        )
        .with_code("unsupported_field"));
    }
    kwargs.extend(asked);
    if let Some(e) = reasoning_effort {
        if !template.is_some_and(|t| t.contains("reasoning_effort")) {
            return Err(ApiError::invalid(
                Some("reasoning_effort"),
                "'reasoning_effort': this model's chat template reads no reasoning effort",
            )
            .with_code("unsupported_field"));
        }
        kwargs.insert("reasoning_effort".into(), Value::String(e));
    }
    Ok(kwargs)
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(st): St,
    log: Option<axum::Extension<crate::log::RequestLog>>,
    body: Bytes,
) -> Response {
    handle(st, body, Kind::Text, prepare_completion, log.map(|l| l.0)).await
}

/// A completion request (`prompt` as text or token ids) read ([`CompletionRequest::read`])
/// and tokenized: what `/v1/completions` and Ollama's raw `/api/generate` share.
///
/// Errors: a 400 naming the field at fault.
pub(crate) fn prepare_completion(
    st: &AppState,
    obj: &Map<String, Value>,
) -> Result<Prepared, ApiError> {
    let eng = generative(st)?;
    let req = CompletionRequest::read(obj, limits(st, eng))?;
    let mut images = Vec::new();
    let prompt = match (req.prompt, &req.suffix) {
        // (`read` refused images beside a suffix.)
        (Prompt::Multimodal(text, sources), _) => {
            let model = req
                .text
                .model
                .clone()
                .unwrap_or_else(|| st.model_name.clone());
            // llama.cpp parses special tokens in a completion's prompt.
            let special = std::slice::from_ref(&(0..text.len())).to_vec();
            let (prompt, placed) = crate::images::prompt(
                eng, &model, &text, &special, &sources, st.images, st.n_ctx, "prompt",
            )?;
            images = placed;
            prompt
        }
        // Fill-in-the-middle: the prompt is the text before the gap.
        (Prompt::Text(t), Some(suffix)) => {
            let infill = Infill {
                prefix: &t,
                suffix,
                ..Default::default()
            };
            infill_ids(st, eng, &infill, req.text.opts.max_tokens, "suffix")?
        }
        (Prompt::Text(t), None) => eng
            .tok
            .encode(&t, true, true)
            .map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))?,
        // (`read` refused ids outside the vocabulary and ids beside a suffix.)
        (Prompt::Ids(ids), _) => ids,
    };
    let mut p = text_prepared(st, eng, prompt, req.text)?;
    p.images = images;
    Ok(p)
}

/// llama-server's default batch, which its infill rule sizes the prefix and suffix by.
const N_BATCH: usize = 2048;

/// The infill prompt of `infill` for `eng`'s model: a 400 naming `field` for a model
/// without FIM tokens.
pub(crate) fn infill_ids(
    st: &AppState,
    eng: &Engine,
    infill: &Infill<'_>,
    max_tokens: Option<usize>,
    field: &'static str,
) -> Result<Vec<u32>, ApiError> {
    let limits = InfillLimits {
        n_ctx: st.n_ctx,
        n_batch: N_BATCH,
        n_predict: max_tokens,
    };
    eng.tok
        .infill_prompt(infill, limits)
        .map_err(|e| ApiError::invalid(Some(field), e.to_string()))
}

/// A prepared request of plain text: `prompt` with the request's grammar compiled, no
/// chat parsing of the answer.
pub(crate) fn text_prepared(
    st: &AppState,
    eng: &Engine,
    prompt: Vec<u32>,
    req: TextOptions,
) -> Result<Prepared, ApiError> {
    let grammar_param = req.grammar.as_ref().map(|g| g.0);
    let constraint = eng.constraint(req.grammar, None)?;
    Ok(Prepared {
        prompt,
        opts: req.opts,
        logprobs: req.logprobs,
        constraint,
        grammar_param,
        answer: answer::AnswerFormat::default(),
        shown_tokens: Vec::new(),
        prediction: None,
        model: req.model.unwrap_or_else(|| st.model_name.clone()),
        images: Vec::new(),
    })
}

/// The `model` of a request (informational) or the loaded model's name.
pub(crate) fn model_field(st: &AppState, obj: &Map<String, Value>) -> String {
    crate::api::request::model(obj).unwrap_or_else(|| st.model_name.clone())
}

/// Forwards one choice's scheduler events, tagged with the choice's index.
pub(crate) struct ChannelSink(
    pub(crate) mpsc::UnboundedSender<(usize, Event)>,
    pub(crate) usize,
);

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        self.0.send((self.1, event)).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// The answer to a request the scheduler would not queue.
pub(crate) fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_overloaded",
            "the request queue is full; retry later",
        )
        .with_code("queue_full"),
        SubmitError::Stopped => shutting_down("the server is shutting down".into()),
    }
}

/// Queues a prepared request and answers it, streamed or whole.
pub(crate) async fn complete(
    st: &AppState,
    kind: Kind,
    mut p: Prepared,
    log: crate::log::RequestLog,
) -> Response {
    let prompt_field = if kind == Kind::Chat {
        "messages"
    } else {
        "prompt"
    };
    let rx = match queue(st, &mut p, prompt_field) {
        Ok(rx) => rx,
        Err(e) => return e.into_response(),
    };
    let Ok(eng) = st.engine() else {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "no model",
        )
        .into_response();
    };
    log.set_prompt(&eng.tok, &p.prompt);
    let fmt = Formatter {
        kind,
        id: st.next_id(if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: unix_now(),
        model: std::mem::take(&mut p.model),
        tok: Arc::clone(&eng.tok),
        logprobs: p.logprobs.is_some(),
        include_usage: p.opts.include_usage,
        n: p.opts.n,
        answer: std::mem::take(&mut p.answer),
        prediction: p.prediction.is_some(),
        grammar_param: p.grammar_param,
        log,
    };
    if p.opts.stream {
        stream_response(fmt, rx).await
    } else {
        whole_response(fmt, rx).await
    }
}

/// A 400 on `field` when `what` ("the prompt", "an input") of `n` tokens cannot run: the
/// scheduler's one rule ([`frink_engine::scheduler::PromptLimit`]); `context_length_exceeded`
/// when it passes the context or the pool.
pub(crate) fn check_length(
    eng: &Engine,
    field: &'static str,
    what: &str,
    n: usize,
) -> Result<(), ApiError> {
    use frink_engine::scheduler::PromptError;
    // An encoder's inputs are bounded by its positions (`prompt_limit.n_ctx` is one past).
    let max = eng.prompt_limit.n_ctx.saturating_sub(1);
    if eng.encoder && n > max {
        return Err(ApiError::invalid(
            Some(field),
            format!(
                "{what} is {n} tokens, longer than the {max} positions the model takes \
                 ({}.context_length)",
                eng.arch
            ),
        )
        .with_code("context_length_exceeded"));
    }
    eng.prompt_limit.check(n).map_err(|e| {
        let said = e.to_string().replacen("the prompt", what, 1);
        let err = ApiError::invalid(Some(field), said);
        match e {
            PromptError::Empty => err,
            PromptError::Context { .. } | PromptError::Pool { .. } => {
                err.with_code("context_length_exceeded")
            }
        }
    })
}

/// Checks a prepared request against the server's limits and queues its choices (each a
/// request of its own, with its own seed stream: the seed plus its index; several share
/// one evaluation of the prompt). Returns the receiver of their events, tagged with the
/// choice index. `prompt_field` names the field a too-long prompt came from.
///
/// Errors: a 400 for an empty or too-long prompt; 503 for a full queue or a server shutting
/// down.
pub(crate) fn queue(
    st: &AppState,
    p: &mut Prepared,
    prompt_field: &'static str,
) -> Result<mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    let eng = generative(st)?;
    check_length(eng, prompt_field, "the prompt", p.prompt.len())?;
    // (`n` was checked against --parallel when the request was parsed: api::gen_options.)
    let n = p.opts.n;
    let lora = eng.lora_set(p.opts.lora.as_ref())?;
    let group = st.shared.next_group.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut sampling = p.opts.sampling.clone();
    if let Some(chain) = &mut sampling.chain {
        if chain
            .stages
            .contains(&frink_engine::sampling::Stage::Infill)
        {
            chain.infill = Some(eng.infill_vocab());
        }
    }
    let seed = sampling.seed;
    let constraint = p.constraint.take();
    for i in 0..n {
        sampling.seed = seed.wrapping_add(i as u64);
        let req = Request {
            prompt: p.prompt.clone(),
            sampling: sampling.clone(),
            max_tokens: p.opts.max_tokens,
            stop: p.opts.stop.clone(),
            ignore_eos: p.opts.ignore_eos,
            top_logprobs: p.logprobs,
            constraint: constraint.clone(),
            prefix_group: (n > 1).then_some(group),
            follows_prefix: i > 0,
            shown_tokens: p.shown_tokens.clone(),
            embed: None,
            lora: lora.clone(),
            prediction: p.prediction.clone(),
            images: p.images.clone(),
            n_ctx: p.opts.n_ctx,
            n_keep: n_keep(eng, &p.prompt, p.opts.n_keep),
            sink: if p.opts.limits.any() {
                Box::new(crate::api::llamacpp::Watch::new(
                    ChannelSink(tx.clone(), i),
                    p.opts.limits,
                ))
            } else {
                Box::new(ChannelSink(tx.clone(), i))
            },
        };
        // On an error the choices already queued see their channel close and are dropped.
        eng.sched.submit(req).map_err(submit_error)?;
    }
    Ok(rx)
}
