//! What a server may serve, by name: the `-m` model, every model in the store (catalog
//! names, `hf:` names pulled, GGUF files placed in the store's folder:
//! [`frink_store::Store::list`]) and the models created through the API (`/api/create`,
//! `/api/copy`: a stored model with defaults, kept in `$FRINK_HOME/aliases.json`).
//!
//! A name from a request is only ever looked up in these lists, never joined to a path:
//! names that look like paths (`..`, a leading `/`, a backslash, a NUL) are refused before
//! any lookup ([`check_name`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use serde_json::{json, Map, Value};

use super::config::ModelSettings;
use crate::api::ApiError;

/// The longest model name accepted (Ollama's names are far shorter).
const MAX_NAME: usize = 256;

/// Created models kept, at most, and their bytes in all (`aliases.json`).
const MAX_CREATED: usize = 1024;
const MAX_CREATED_BYTES: usize = 16 << 20;

/// The created models in `path` (`{"models": {name: {...}}}`); a missing, unreadable or
/// oversized file is none.
fn read_aliases(path: Option<&Path>) -> Map<String, Value> {
    path.filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() <= 2 * MAX_CREATED_BYTES as u64))
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v.get("models").and_then(Value::as_object).cloned())
        .unwrap_or_default()
}

/// Defaults a created model applies to the requests that name it (Ollama's `/api/create`
/// fields): a system prompt where the request has none, conversation messages before the
/// request's, sampling parameters the request does not set.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Defaults {
    /// `system`: the system message of requests without one.
    pub system: Option<String>,
    /// `parameters`: Ollama's option names (`temperature`, `num_predict`, `stop`, …).
    pub parameters: Map<String, Value>,
    /// `messages`: turns put before a chat request's own.
    pub messages: Vec<Value>,
    /// `license`: texts `/api/show` reports.
    pub license: Vec<String>,
}

impl Defaults {
    fn is_empty(&self) -> bool {
        *self == Defaults::default()
    }

    fn to_json(&self) -> Value {
        json!({
            "system": self.system,
            "parameters": self.parameters,
            "messages": self.messages,
            "license": self.license,
        })
    }

    fn from_json(v: &Value) -> Defaults {
        Defaults {
            system: v["system"].as_str().map(str::to_string),
            parameters: v["parameters"].as_object().cloned().unwrap_or_default(),
            messages: v["messages"].as_array().cloned().unwrap_or_default(),
            license: v["license"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// `self`'s values over `base`'s (a model created from a created model keeps what it
    /// does not set anew).
    pub fn over(mut self, base: &Defaults) -> Defaults {
        if self.system.is_none() {
            self.system = base.system.clone();
        }
        for (k, v) in &base.parameters {
            self.parameters
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
        if self.messages.is_empty() {
            self.messages = base.messages.clone();
        }
        if self.license.is_empty() {
            self.license = base.license.clone();
        }
        self
    }
}

/// Where a name leads.
#[derive(Clone, Debug)]
pub(crate) struct Source {
    /// The name it is served under (what answers and `/api/ps` report).
    pub name: String,
    /// The model file.
    pub path: PathBuf,
    /// A created model's defaults (none for a stored model).
    pub defaults: Option<Arc<Defaults>>,
    /// For a created model, the model it was created from.
    pub from: Option<String>,
    /// The `-m` model (served for names that name nothing else).
    pub is_cli: bool,
    /// A `--models-config` model's own settings.
    pub settings: Option<Arc<ModelSettings>>,
}

impl Source {
    fn plain(name: &str, path: &Path, is_cli: bool) -> Source {
        Source {
            name: name.to_string(),
            path: path.to_path_buf(),
            defaults: None,
            from: None,
            is_cli,
            settings: None,
        }
    }

    /// Its engine: one per file and settings (a created model shares its source's).
    pub fn key(&self) -> String {
        match &self.settings {
            Some(s) => format!("{}\n[models.{}]", self.path.display(), s.name),
            None => self.path.display().to_string(),
        }
    }
}

/// A model the registry lists (`/v1/models`, `/api/tags`).
#[derive(Clone, Debug)]
pub(crate) struct Listed {
    pub source: Source,
    /// Bytes of the file.
    pub bytes: u64,
    /// The published sha256 of a catalog file (lowercase hex), else empty.
    pub sha256: String,
}

/// The registry: the `-m` model, the store and the created models.
pub(crate) struct Registry {
    /// The `-m` value and its file, if the server was started with one.
    cli: Option<(String, PathBuf)>,
    /// `--models-config`'s models.
    configured: Vec<Arc<ModelSettings>>,
    store: Option<frink_store::Store>,
    /// `$FRINK_HOME/aliases.json`; `None` without a home (nothing can be created).
    aliases_file: Option<PathBuf>,
    /// The created models (name → `{from, system, …}`), read at start and written through.
    aliases: Mutex<Map<String, Value>>,
}

/// A 404 naming a model no list holds.
pub(crate) fn not_found(name: &str) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "model '{}' not found; GET /v1/models (or /api/tags) lists the models this server has",
            truncated(name)
        ),
    )
    .with_code("model_not_found");
    e.param = Some("model".into());
    e
}

/// Refuses a name that is not a model name: empty, too long, a control character, or
/// anything path-like (`..`, a leading `/` or `~`, a backslash).
///
/// Errors: a 400 naming `field` and the rule broken.
pub(crate) fn check_name(name: &str, field: &'static str) -> Result<(), ApiError> {
    let why = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_NAME {
        "is longer than 256 bytes"
    } else if name.chars().any(char::is_control) {
        "holds a control character"
    } else if name.contains("..")
        || name.starts_with('/')
        || name.starts_with('~')
        || name.contains('\\')
    {
        "looks like a path (models are named, never addressed by path)"
    } else {
        return Ok(());
    };
    Err(ApiError::invalid(
        Some(field),
        format!("'{field}': the model name {} {why}", json!(truncated(name))),
    ))
}

/// At most 80 characters of `s`, for error messages.
fn truncated(s: &str) -> String {
    s.chars().take(80).collect()
}

/// `name` without Ollama's default tag (`smollm2-135m:latest` is `smollm2-135m`).
fn untagged(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

impl Registry {
    /// A registry of `cli` (the `-m` value and its file), the store (`None`: no home) and
    /// the created models in `aliases_file`.
    pub fn new(
        cli: Option<(String, PathBuf)>,
        configured: Vec<ModelSettings>,
        store: Option<frink_store::Store>,
        aliases_file: Option<PathBuf>,
    ) -> Registry {
        Registry {
            cli,
            configured: configured.into_iter().map(Arc::new).collect(),
            store,
            aliases: Mutex::new(read_aliases(aliases_file.as_deref())),
            aliases_file,
        }
    }

    /// The store's models (catalog, hub, placed).
    fn stored(&self) -> Vec<frink_store::ListedModel> {
        self.store.as_ref().map(|s| s.list()).unwrap_or_default()
    }

    /// The created models (a copy).
    fn aliases(&self) -> Map<String, Value> {
        self.lock_aliases().clone()
    }

    fn lock_aliases(&self) -> std::sync::MutexGuard<'_, Map<String, Value>> {
        self.aliases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `-m` model, if the server was started with one.
    pub fn cli_source(&self) -> Option<Source> {
        self.cli.as_ref().map(|(n, p)| Source::plain(n, p, true))
    }

    /// The models that are not created ones, in the order a name is looked up (the `-m`
    /// model, `--models-config`'s, the store's), each name once.
    fn bases(&self) -> Vec<Source> {
        let mut out: Vec<Source> = Vec::new();
        let configured = self.configured.iter().map(|c| Source {
            settings: Some(Arc::clone(c)),
            ..Source::plain(&c.name, &c.path, false)
        });
        let stored = self
            .stored()
            .into_iter()
            .map(|m| Source::plain(&m.name, &m.path, false));
        for s in self
            .cli_source()
            .into_iter()
            .chain(configured)
            .chain(stored)
        {
            if !out.iter().any(|o| o.name == s.name) {
                out.push(s);
            }
        }
        out
    }

    /// The model listed as exactly `name` (one of [`Registry::bases`], else a created
    /// one); `Err(from)` for a created model whose source is gone.
    fn lookup(&self, name: &str) -> Option<Result<Source, String>> {
        let bases = self.bases();
        if let Some(s) = bases.iter().find(|s| s.name == name) {
            return Some(Ok(s.clone()));
        }
        let def = self.lock_aliases().get(name).cloned()?;
        Some(created(name, &def, &bases))
    }

    /// [`Registry::lookup`] of `name`, then of it without `:latest`.
    fn lookup_tagged(&self, name: &str) -> Option<Result<Source, String>> {
        self.lookup(name).or_else(|| self.lookup(untagged(name)))
    }

    /// Every model: [`Registry::bases`], then the created ones whose source still exists.
    pub fn list(&self) -> Vec<Listed> {
        let listed = |source: Source| Listed {
            bytes: std::fs::metadata(&source.path).map_or(0, |m| m.len()),
            sha256: catalog_sha256(&source.path),
            source,
        };
        let bases = self.bases();
        let mut out: Vec<Listed> = bases.iter().cloned().map(listed).collect();
        for (name, def) in self.aliases() {
            if out.iter().any(|l| l.source.name == name) {
                continue;
            }
            if let Ok(s) = created(&name, &def, &bases) {
                out.push(listed(s));
            }
        }
        out
    }

    /// The model a request's `model` names: a listed name (`:latest` or not), else, on a
    /// server started with `-m`, the `-m` model (clients send placeholder names).
    ///
    /// Errors: 400 for a missing name without `-m`, or a path-like name; 404 for a name
    /// nothing lists without `-m`, or a created model whose source is gone.
    pub fn resolve(&self, name: Option<&str>) -> Result<Source, ApiError> {
        let cli = || self.cli_source();
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return cli().ok_or_else(|| {
                ApiError::invalid(
                    Some("model"),
                    "'model' is required (and not empty): this server was started without -m and serves the model a request names",
                )
            });
        };
        // The -m value itself may be a path (`-m ./model.gguf`): it names the -m model.
        if let Some(s) = cli().filter(|s| s.name == name) {
            return Ok(s);
        }
        check_name(name, "model")?;
        match self.lookup_tagged(name) {
            Some(Ok(s)) => Ok(s),
            Some(Err(from)) => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!(
                    "model '{name}' was created from '{from}', which this server no longer has"
                ),
            )
            .with_code("model_not_found")),
            None => cli().ok_or_else(|| not_found(name)),
        }
    }

    /// The listed model named exactly `name` (`:latest` or not), without the `-m` fallback.
    ///
    /// Errors: 400 for a path-like name, 404 for one nothing lists.
    pub fn find(&self, name: &str, field: &'static str) -> Result<Listed, ApiError> {
        check_name(name, field)?;
        let source = match self.lookup_tagged(name) {
            Some(Ok(s)) => s,
            _ => return Err(not_found(name)),
        };
        Ok(Listed {
            bytes: std::fs::metadata(&source.path).map_or(0, |m| m.len()),
            sha256: catalog_sha256(&source.path),
            source,
        })
    }

    /// Creates (or replaces) the created model `name`: `from` (a listed name) with
    /// `defaults` over the source's own.
    ///
    /// Errors: 400 for a bad name, a name that a stored or `-m` model has, or no home to
    /// keep it in; 404 for an unknown `from`; 500 if the file cannot be written.
    pub fn create(&self, name: &str, from: &str, defaults: Defaults) -> Result<(), ApiError> {
        check_name(name, "model")?;
        let name = untagged(name);
        if name.is_empty() || name.ends_with(":latest") || name.starts_with(':') {
            return Err(ApiError::invalid(
                Some("model"),
                format!("'model': {} is not a model name", json!(truncated(name))),
            ));
        }
        if name.starts_with("hf:") {
            return Err(ApiError::invalid(
                Some("model"),
                "'model': names starting with 'hf:' are the hub's; choose another name",
            ));
        }
        let base = self.find(from, "from")?;
        let taken = self
            .lookup_tagged(name)
            .is_some_and(|l| l.is_ok_and(|s| s.defaults.is_none()));
        let mut aliases = self.lock_aliases();
        if taken {
            return Err(ApiError::invalid(
                Some("model"),
                format!(
                    "'model': '{name}' is a stored model; a created model needs a name of its own"
                ),
            ));
        }
        let (from, defaults) = match &base.source.defaults {
            Some(d) => (
                base.source.from.clone().unwrap_or_default(),
                defaults.over(d),
            ),
            None => (base.source.name.clone(), defaults),
        };
        let mut entry = defaults.to_json();
        entry["from"] = json!(from);
        if defaults.is_empty() {
            entry = json!({"from": from});
        }
        let mut next = aliases.clone();
        next.insert(name.to_string(), entry);
        let bytes = serde_json::to_vec(&next).map_or(usize::MAX, |v| v.len());
        if next.len() > MAX_CREATED || bytes > MAX_CREATED_BYTES {
            return Err(ApiError::invalid(
                Some("model"),
                format!("this server keeps at most {MAX_CREATED} created models in {} MiB; delete some first", MAX_CREATED_BYTES >> 20),
            ));
        }
        self.write_aliases(&next)?;
        *aliases = next;
        Ok(())
    }

    /// Removes the created model `name`; `Ok(false)` if there is none of that name.
    ///
    /// Errors: 500 if the file cannot be written.
    pub fn remove_alias(&self, name: &str) -> Result<bool, ApiError> {
        let mut aliases = self.lock_aliases();
        let mut next = aliases.clone();
        if next
            .remove(name)
            .or_else(|| next.remove(untagged(name)))
            .is_none()
        {
            return Ok(false);
        }
        self.write_aliases(&next)?;
        *aliases = next;
        Ok(true)
    }

    /// Removes a stored model's files ([`frink_store::Store::remove`]).
    ///
    /// Errors: 400 for the `-m` model (given on the command line, not the store's), 404
    /// for a name the store does not hold, 500 for the disk.
    pub fn remove_stored(&self, name: &str) -> Result<(), ApiError> {
        let listed = self.find(name, "model")?;
        let stored = self
            .stored()
            .into_iter()
            .find(|m| m.path == listed.source.path);
        let (Some(store), Some(stored)) = (&self.store, stored) else {
            return Err(if listed.source.is_cli {
                ApiError::invalid(
                    Some("model"),
                    format!("'{name}' was given with -m, not pulled into the store; it is not deleted through the API"),
                )
            } else {
                not_found(name)
            });
        };
        store.remove(&stored.name).map(|_| ()).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            )
        })
    }

    fn write_aliases(&self, aliases: &Map<String, Value>) -> Result<(), ApiError> {
        let path = self.aliases_file.as_deref().ok_or_else(|| {
            ApiError::invalid(
                Some("model"),
                "no FRINK_HOME or HOME is set: there is nowhere to keep created models",
            )
        })?;
        write_atomic(path, &json!({"version": 1, "models": aliases})).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("cannot write {}: {e}", path.display()),
            )
        })
    }
}

/// The created model `name` of definition `def` (`{from, system, …}`) over `bases`;
/// `Err(from)` when its source is not among them.
fn created(name: &str, def: &Value, bases: &[Source]) -> Result<Source, String> {
    let from = def["from"].as_str().unwrap_or_default();
    bases
        .iter()
        .find(|b| b.name == from)
        .map(|b| Source {
            name: name.to_string(),
            defaults: Some(Arc::new(Defaults::from_json(def))),
            from: Some(from.to_string()),
            is_cli: false,
            ..b.clone()
        })
        .ok_or_else(|| from.to_string())
}

/// Writes `v` to `path` through a temporary file renamed over it.
fn write_atomic(path: &Path, v: &Value) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(v).unwrap_or_default())?;
    std::fs::rename(&tmp, path)
}

/// The catalog's published sha256 of the file at `path`, if it is a catalog file.
pub(crate) fn catalog_sha256(path: &Path) -> String {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    frink_store::catalog()
        .into_iter()
        .find(|e| e.file == file)
        .map(|e| e.sha256.to_ascii_lowercase())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_like_names_are_refused_and_model_names_pass() {
        for bad in [
            "../x",
            "a/../../b",
            "/etc/passwd",
            "~/m",
            "a\\b",
            "a\0b",
            "",
        ] {
            assert!(check_name(bad, "model").is_err(), "{bad:?}");
        }
        for good in [
            "smollm2-135m",
            "smollm2-135m:latest",
            "hf:org/repo/f.gguf",
            "me/my-model:7b",
        ] {
            assert!(check_name(good, "model").is_ok(), "{good}");
        }
    }

    #[test]
    fn created_models_keep_their_source_and_layer_defaults() {
        let dir = std::env::temp_dir().join(format!("frink-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("models")).unwrap();
        std::fs::write(dir.join("models/tiny.gguf"), b"GGUF").unwrap();
        let reg = Registry::new(
            None,
            Vec::new(),
            Some(frink_store::Store::new(dir.join("models"))),
            Some(dir.join("aliases.json")),
        );
        assert_eq!(reg.resolve(Some("tiny")).unwrap().name, "tiny");
        assert_eq!(reg.resolve(Some("tiny:latest")).unwrap().name, "tiny");
        assert_eq!(reg.resolve(Some("nope")).unwrap_err().status.as_u16(), 404);
        assert_eq!(reg.resolve(None).unwrap_err().status.as_u16(), 400);
        let sys = Defaults {
            system: Some("be brief".into()),
            ..Defaults::default()
        };
        reg.create("brief", "tiny", sys).unwrap();
        let mut temp = Map::new();
        temp.insert("temperature".into(), json!(0));
        let cold = Defaults {
            parameters: temp,
            ..Defaults::default()
        };
        reg.create("brief-cold", "brief", cold).unwrap();
        let s = reg.resolve(Some("brief-cold")).unwrap();
        assert_eq!(s.from.as_deref(), Some("tiny"));
        let d = s.defaults.unwrap();
        assert_eq!(d.system.as_deref(), Some("be brief"));
        assert_eq!(d.parameters["temperature"], 0);
        assert_eq!(
            reg.create("tiny", "brief", Defaults::default())
                .unwrap_err()
                .status
                .as_u16(),
            400
        );
        assert!(reg.remove_alias("brief").unwrap());
        assert!(!reg.remove_alias("brief").unwrap());
        reg.remove_stored("tiny").unwrap();
        assert!(!dir.join("models/tiny.gguf").exists());
        // Its created model now names a source that is gone.
        assert_eq!(
            reg.resolve(Some("brief-cold")).unwrap_err().status.as_u16(),
            404
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
