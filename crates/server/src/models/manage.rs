//! The endpoints about models rather than answers: what the server has
//! (`GET /v1/models`, `/models`, `/api/tags`), what is loaded (`/api/ps`), one model's
//! details (`/api/show`), Ollama's `/api/create`, `/api/copy`, `/api/delete`, and
//! llama-server's router endpoints `POST /models/load` and `/models/unload`.
//!
//! None of them loads a model but `/models/load`; names are checked and looked up in the
//! registry ([`super::registry`]), never used as paths.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::registry::{Defaults, Listed};
use crate::api::{self, json_response, ApiError};
use crate::gate::error_for_path;
use crate::ollama::{rfc3339, ModelInfo};
use crate::Server;

type Srv = State<Arc<Server>>;

fn answer(path: &str, r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error_for_path(path, e),
    }
}

/// What Ollama reports of a listed model, read from its file (not loaded).
fn info_of(srv: &Server, l: &Listed) -> Result<Arc<ModelInfo>, ApiError> {
    // Read once per file version: many names (created models) share a file.
    let modified = std::fs::metadata(&l.source.path)
        .and_then(|m| m.modified())
        .ok();
    let mut cache = srv.infos.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((when, info)) = cache.get(&l.source.path) {
        if Some(*when) == modified {
            return Ok(Arc::clone(info));
        }
    }
    let info = Arc::new(read_info(srv, l)?);
    if let Some(m) = modified {
        if cache.len() >= 4096 {
            cache.clear();
        }
        cache.insert(l.source.path.clone(), (m, Arc::clone(&info)));
    }
    Ok(info)
}

/// [`info_of`] read from the file.
fn read_info(srv: &Server, l: &Listed) -> Result<ModelInfo, ApiError> {
    let f = frink_gguf::GgufFile::open(&l.source.path).map_err(|e| {
        super::server_error(format!(
            "cannot read model '{}' ({}): {e}",
            l.source.name,
            l.source.path.display()
        ))
    })?;
    let embedding = frink_models::ModelConfig::from_gguf(&f).is_ok_and(|c| c.pooling.is_some());
    Ok(ModelInfo::read_file(
        &f,
        embedding,
        &l.source.path.to_string_lossy(),
        srv.chat_template.as_deref(),
    ))
}

/// One model's entry of `/api/tags` (and the base of `/api/ps`'s).
fn tag_entry(l: &Listed, info: Option<&ModelInfo>) -> Value {
    let digest = if l.sha256.is_empty() {
        info.and_then(|i| i.digest.clone()).unwrap_or_default()
    } else {
        l.sha256.clone()
    };
    let mut v = json!({
        "name": l.source.name,
        "model": l.source.name,
        "size": l.bytes,
        "digest": digest,
    });
    if let Some(i) = info {
        v["modified_at"] = json!(i.modified_at);
        let mut details = i.details();
        if let Some(from) = &l.source.from {
            details["parent_model"] = json!(from);
        }
        v["details"] = details;
    }
    v
}

/// `GET /api/tags`: every model the server has.
pub(crate) async fn tags(State(srv): Srv) -> Response {
    let srv2 = Arc::clone(&srv);
    let models = tokio::task::spawn_blocking(move || {
        srv2.registry
            .list()
            .iter()
            .map(|l| tag_entry(l, info_of(&srv2, l).ok().as_deref()))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    json_response(StatusCode::OK, &json!({ "models": models }))
}

/// `GET /v1/models` and `GET /models`: every model the server has, in OpenAI's list
/// shape, with llama-server's router `status` (`loaded` or `unloaded`).
pub(crate) async fn list(State(srv): Srv) -> Response {
    let data: Vec<Value> = srv
        .registry
        .list()
        .into_iter()
        .map(|l| model_object(&srv, &l))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// One model in OpenAI's shape, with llama-server's router `status`.
fn model_object(srv: &Server, l: &Listed) -> Value {
    let loaded = srv.models.is_loaded(&l.source.key());
    let mut v = json!({
        "id": l.source.name,
        "object": "model",
        "created": srv.created,
        "owned_by": "frink",
        "status": {"value": if loaded { "loaded" } else { "unloaded" }},
    });
    // What a loaded model can do (Ollama's capability words: `vision` with a projector).
    if let Some(c) = srv.models.capabilities(&l.source.key()) {
        v["capabilities"] = json!(c);
    }
    v
}

/// `GET /v1/models/{id}` (OpenAI's `models.retrieve`): one model, or a 404 naming it.
pub(crate) async fn retrieve(
    State(srv): Srv,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let r = srv
        .registry
        .find(&id, "model")
        .map(|l| model_object(&srv, &l));
    answer("/v1/models", r)
}

/// `GET /api/ps`: the loaded models, their sizes (no GPU memory: `size_vram` 0) and when
/// each unloads if it stays idle.
pub(crate) async fn ps(State(srv): Srv) -> Response {
    let srv2 = Arc::clone(&srv);
    let models = tokio::task::spawn_blocking(move || {
        let listed = srv2.registry.list();
        srv2.models
            .resident()
            .into_iter()
            .map(|r| {
                let l = listed
                    .iter()
                    .find(|l| l.source.name == r.name)
                    .or_else(|| listed.iter().find(|l| l.source.path == r.path));
                let mut v = match l {
                    Some(l) => tag_entry(l, r.app.engine().ok().map(|e| &e.info)),
                    None => json!({"name": r.name, "model": r.name}),
                };
                v["size"] = json!(r.bytes);
                v["size_vram"] = json!(0);
                v["context_length"] = json!(r.app.n_ctx);
                // Ollama's "never": far in the future (and no later, for any keep-alive).
                let never = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(10_957_000_000);
                let expires = r.expires.map_or(never, |e| e.min(never));
                v["expires_at"] = json!(rfc3339(expires));
                v
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    json_response(StatusCode::OK, &json!({ "models": models }))
}

/// The `model` (or older `name`) field of a management request.
fn model_name(obj: &Map<String, Value>) -> Result<String, ApiError> {
    api::opt_str(obj, "model")?
        .or(api::opt_str(obj, "name")?)
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid(Some("model"), "'model' is required"))
}

/// `POST /api/show`: a model's details, metadata, template and capabilities, and a
/// created model's system prompt, parameters and license; nothing is loaded.
pub(crate) async fn show(State(srv): Srv, body: Bytes) -> Response {
    let srv2 = Arc::clone(&srv);
    let r = tokio::task::spawn_blocking(move || {
        let obj = api::parse_object(&body)?;
        let name = model_name(&obj)?;
        let l = srv2.registry.find(&name, "model")?;
        let mut v = info_of(&srv2, &l)?.show();
        // The -m model takes images when it is served with its projector file.
        if l.source.is_cli && srv2.cli_vision {
            if let Some(c) = v["capabilities"].as_array_mut() {
                c.push(json!("vision"));
            }
        }
        if let Some(d) = &l.source.defaults {
            show_defaults(&mut v, d, l.source.from.as_deref().unwrap_or(""));
        }
        Ok(v)
    })
    .await
    .unwrap_or_else(|e| Err(super::server_error(e.to_string())));
    answer("/api/show", r)
}

/// A created model's defaults in `/api/show`'s fields (`system`, `parameters` as
/// Modelfile lines, `license`, the `modelfile`).
fn show_defaults(v: &mut Value, d: &Defaults, from: &str) {
    let mut params = String::new();
    let mut modelfile = format!("# created through frink's /api/create\nFROM {from}\n");
    for (k, val) in &d.parameters {
        let vals: Vec<Value> = match val {
            Value::Array(a) => a.clone(),
            v => vec![v.clone()],
        };
        for x in vals {
            let text = x
                .as_str()
                .map_or_else(|| x.to_string(), |s| format!("{s:?}"));
            params.push_str(&format!("{k} {text}\n"));
            modelfile.push_str(&format!("PARAMETER {k} {text}\n"));
        }
    }
    if let Some(s) = &d.system {
        v["system"] = json!(s);
        modelfile.push_str(&format!("SYSTEM {s:?}\n"));
    }
    if !params.is_empty() {
        v["parameters"] = json!(params.trim_end());
    }
    if !d.license.is_empty() {
        v["license"] = json!(d.license.join("\n"));
    }
    if !d.messages.is_empty() {
        v["messages"] = json!(d.messages);
    }
    v["modelfile"] = json!(modelfile);
    v["details"]["parent_model"] = json!(from);
}

/// `DELETE /api/delete`: a created model is forgotten; a stored model's files are
/// removed (unloaded first; a 409 while it answers requests).
pub(crate) async fn delete(State(srv): Srv, body: Bytes) -> Response {
    let srv2 = Arc::clone(&srv);
    let r = tokio::task::spawn_blocking(move || {
        let obj = api::parse_object(&body)?;
        let name = model_name(&obj)?;
        let l = srv2.registry.find(&name, "model")?;
        if l.source.defaults.is_some() {
            srv2.registry.remove_alias(&l.source.name)?;
            return Ok(json!({}));
        }
        srv2.models.unload_now(&l.source.key(), false)?;
        srv2.registry.remove_stored(&l.source.name)?;
        Ok(json!({}))
    })
    .await
    .unwrap_or_else(|e| Err(super::server_error(e.to_string())));
    answer("/api/delete", r)
}

/// `POST /api/copy` `{source, destination}`: a created model of the new name with the
/// source's file and defaults.
pub(crate) async fn copy(State(srv): Srv, body: Bytes) -> Response {
    let srv2 = Arc::clone(&srv);
    let r = tokio::task::spawn_blocking(move || {
        let obj = api::parse_object(&body)?;
        let field = |n: &'static str| {
            api::opt_str(&obj, n)?
                .map(str::to_string)
                .ok_or_else(|| ApiError::invalid(Some(n), format!("'{n}' is required")))
        };
        let (source, destination) = (field("source")?, field("destination")?);
        srv2.registry
            .create(&destination, &source, Defaults::default())?;
        Ok(json!({}))
    })
    .await
    .unwrap_or_else(|e| Err(super::server_error(e.to_string())));
    answer("/api/copy", r)
}

/// Ollama's `/api/create` fields frink cannot honour, and why.
const CREATE_REFUSED: &[(&str, &str)] = &[
    ("files", "uploading model files is not supported; place the GGUF file in the store's folder ($FRINK_HOME/models) and create from its name"),
    ("adapters", "LoRA adapters on a created model are not supported; start the server with --lora"),
    ("quantize", "quantizing is not supported"),
    ("template", "Ollama's Go templates are not supported; frink renders the model file's Jinja chat template (or --chat-template)"),
];

/// `POST /api/create`: a new model `model` from a listed model (`from`), with a `system`
/// prompt, `parameters` (Ollama's option names, checked as a request's `options` are),
/// `messages` and `license`; Ollama's status lines (`stream`, default true) or one
/// `{"status": "success"}`.
pub(crate) async fn create(State(srv): Srv, body: Bytes) -> Response {
    let srv2 = Arc::clone(&srv);
    let r = tokio::task::spawn_blocking(move || {
        let obj = api::parse_object(&body)?;
        let name = model_name(&obj)?;
        for (field, why) in CREATE_REFUSED {
            let given = obj.get(*field).is_some_and(|v| match v {
                Value::Null => false,
                Value::String(s) => !s.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) => !o.is_empty(),
                _ => true,
            });
            if given {
                return Err(ApiError::invalid(Some(field), format!("'{field}': {why}")));
            }
        }
        let from = api::opt_str(&obj, "from")?
            .ok_or_else(|| {
                ApiError::invalid(
                    Some("from"),
                    "'from' (the model to create from) is required",
                )
            })?
            .to_string();
        let defaults = create_defaults(&obj)?;
        let stream = api::opt_bool(&obj, "stream")?.unwrap_or(true);
        srv2.registry.create(&name, &from, defaults)?;
        Ok(stream)
    })
    .await
    .unwrap_or_else(|e| Err(super::server_error(e.to_string())));
    match r {
        Ok(true) => crate::ollama::ndjson(futures_util::stream::iter(
            [
                "reading model metadata",
                "creating model layer",
                "writing manifest",
                "success",
            ]
            .map(|s| json!({ "status": s })),
        )),
        Ok(false) => json_response(StatusCode::OK, &json!({"status": "success"})),
        Err(e) => error_for_path("/api/create", e),
    }
}

/// The defaults of an `/api/create` request, each checked.
fn create_defaults(obj: &Map<String, Value>) -> Result<Defaults, ApiError> {
    let system = api::opt_str(obj, "system")?.map(str::to_string);
    let parameters = match obj.get("parameters") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(v) => {
            return Err(ApiError::invalid(
                Some("parameters"),
                format!("'parameters' must be an object of Ollama's option names, got {v}"),
            ))
        }
    };
    // Each a known option of the right type, then checked as a request's `options` are,
    // so a created model cannot hold what its requests would refuse.
    for (k, v) in &parameters {
        crate::ollama::check_option(k, v, "parameters")?;
    }
    let mut wrapped = Map::new();
    wrapped.insert("options".into(), Value::Object(parameters.clone()));
    let mut fields = Map::new();
    let as_parameters = |e: ApiError| {
        ApiError::invalid(
            Some("parameters"),
            format!(
                "'parameters': {}",
                e.message.replace("options.", "parameters.")
            ),
        )
    };
    crate::ollama::options(&wrapped, &mut fields).map_err(as_parameters)?;
    // And as the sampling fields they become, read as a chat request reads them.
    crate::api::gen_options(
        &fields,
        crate::api::Endpoint::Chat,
        crate::api::request::Limits {
            n_vocab: usize::MAX,
            max_choices: 1,
        },
    )
    .map_err(as_parameters)?;
    let messages = match obj.get("messages") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            for m in a {
                let role = m["role"].as_str().unwrap_or("");
                if !matches!(role, "system" | "user" | "assistant") || !m["content"].is_string() {
                    return Err(ApiError::invalid(
                        Some("messages"),
                        "'messages': each needs a role (system, user or assistant) and a string content",
                    ));
                }
            }
            a.clone()
        }
        Some(_) => {
            return Err(ApiError::invalid(
                Some("messages"),
                "'messages' must be an array",
            ))
        }
    };
    let license = match obj.get("license") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        Some(_) => {
            return Err(ApiError::invalid(
                Some("license"),
                "'license' must be a string or strings",
            ))
        }
    };
    Ok(Defaults {
        system,
        parameters,
        messages,
        license,
    })
}

/// llama-server's router `POST /models/load` `{"model"}`: loads it (waiting until it is
/// ready) and keeps it as a request would.
pub(crate) async fn load(State(srv): Srv, body: Bytes) -> Response {
    let r = async {
        let obj = api::parse_object(&body)?;
        let name = model_name(&obj)?;
        let l = srv.registry.find(&name, "model")?;
        drop(srv.models.acquire(&l.source, None).await?);
        Ok(json!({"success": true}))
    };
    answer("/models/load", r.await)
}

/// llama-server's router `POST /models/unload` `{"model"}`: unloads it now (a 409 while
/// it answers requests; it then goes when they end).
pub(crate) async fn unload(State(srv): Srv, body: Bytes) -> Response {
    let r = (|| {
        let obj = api::parse_object(&body)?;
        let name = model_name(&obj)?;
        let l = srv.registry.find(&name, "model")?;
        srv.models.unload_now(&l.source.key(), true)?;
        Ok(json!({"success": true}))
    })();
    answer("/models/unload", r)
}
