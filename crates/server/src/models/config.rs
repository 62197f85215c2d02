//! `--models-config FILE`: models a server may load with settings of their own (TOML).
//!
//! ```toml
//! [models.coder]                      # the name requests use
//! model = "qwen2.5-coder-0.5b"        # a store name, or a GGUF file's path
//! ctx = 8192                          # --ctx
//! parallel = 2                        # --parallel
//! kv_size = 16384                     # --kv-size
//! kv_type = "q8_0"                    # --kv-type
//! cache_type_v = "q4_0"               # -ctv (and cache_type_k, -ctk): over kv_type
//! pooling = "mean"                    # --pooling
//! chat_template_file = "coder.jinja"  # --chat-template-file
//! draft_model = "draft.gguf"          # --draft-model (with draft_max, --draft-max)
//! lora = ["style.gguf"]               # --lora
//! keep_alive = "30m"                  # --keep-alive
//! ```
//!
//! Every key is checked when the server starts: an unknown key, a wrong type or a value
//! the flag would refuse ends it with an error naming the model and the key. Relative
//! paths are read from the file's folder. A setting left out is the server's flag.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use frink_models::{CacheType, KvType, Pooling};
use serde::Deserialize;

use super::KeepAlive;

/// A table's `kv_type`, `cache_type_k` and `cache_type_v` as the keys' and values' types.
fn cache_types(t: &Table) -> Result<(Option<CacheType>, Option<CacheType>)> {
    let both = t
        .kv_type
        .as_ref()
        .map(|s| {
            s.parse::<KvType>()
                .map_err(|e| anyhow::anyhow!("kv_type = {s:?}: {e}"))
        })
        .transpose()?;
    let one = |key: &str, v: &Option<String>| {
        v.as_ref()
            .map(|s| {
                s.parse::<CacheType>()
                    .map_err(|e| anyhow::anyhow!("{key} = {s:?}: {e}"))
            })
            .transpose()
    };
    Ok((
        one("cache_type_k", &t.cache_type_k)?.or(both.map(|b| b.k)),
        one("cache_type_v", &t.cache_type_v)?.or(both.map(|b| b.v)),
    ))
}

/// The most slots a configured model may ask for.
const MAX_PARALLEL: usize = 4096;

/// One `[models.NAME]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    model: String,
    ctx: Option<usize>,
    parallel: Option<usize>,
    kv_size: Option<usize>,
    kv_type: Option<String>,
    cache_type_k: Option<String>,
    cache_type_v: Option<String>,
    pooling: Option<String>,
    chat_template_file: Option<PathBuf>,
    draft_model: Option<PathBuf>,
    draft_max: Option<usize>,
    lora: Option<Vec<PathBuf>>,
    keep_alive: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    models: BTreeMap<String, Table>,
}

/// A model of `--models-config` with its settings, checked.
#[derive(Clone, Debug)]
pub struct ModelSettings {
    /// The name requests use.
    pub name: String,
    /// The model file.
    pub path: PathBuf,
    pub ctx: Option<usize>,
    pub parallel: Option<usize>,
    pub kv_size: Option<usize>,
    /// The keys' and the values' cache types (`kv_type` sets both, `cache_type_k` /
    /// `cache_type_v` each over it); `None`: the server's.
    pub cache_types: (Option<CacheType>, Option<CacheType>),
    pub pooling: Option<Pooling>,
    /// The template's text (read from `chat_template_file`).
    pub chat_template: Option<String>,
    pub draft_model: Option<PathBuf>,
    pub draft_max: Option<usize>,
    /// Adapters applied at scale 1.
    pub lora: Vec<PathBuf>,
    pub keep_alive: Option<KeepAlive>,
}

/// Reads `path`; `resolve` turns a `model` value into its file (a store name or a path).
///
/// # Errors
/// An unreadable file, TOML that does not parse or holds an unknown key, a model name
/// that is not a model name, or a value out of range, each naming the model and key.
pub fn read(path: &Path, resolve: &dyn Fn(&str) -> Result<PathBuf>) -> Result<Vec<ModelSettings>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--models-config {}", path.display()))?;
    let file: File =
        toml::from_str(&text).with_context(|| format!("--models-config {}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    file.models
        .into_iter()
        .map(|(name, t)| {
            settings(&name, t, dir, resolve)
                .with_context(|| format!("--models-config {}: [models.{name}]", path.display()))
        })
        .collect()
}

fn settings(
    name: &str,
    t: Table,
    dir: &Path,
    resolve: &dyn Fn(&str) -> Result<PathBuf>,
) -> Result<ModelSettings> {
    if let Err(e) = super::registry::check_name(name, "model") {
        bail!("{}", e.message);
    }
    let at = |p: PathBuf| if p.is_absolute() { p } else { dir.join(p) };
    // The flags' own bounds (--ctx and --kv-size: 2 to 2^31 - 1 positions).
    let positive = |key: &str, v: Option<usize>, least: usize| -> Result<Option<usize>> {
        const MOST: usize = (1 << 31) - 1;
        match v {
            Some(n) if !(least..=MOST).contains(&n) => {
                bail!("{key} must be between {least} and {MOST}, got {n}")
            }
            _ => Ok(v),
        }
    };
    let model_path = {
        let p = PathBuf::from(&t.model);
        if p.is_relative() && dir.join(&p).is_file() {
            dir.join(p)
        } else {
            resolve(&t.model).with_context(|| format!("model = {:?}", t.model))?
        }
    };
    let cache_types = cache_types(&t)?;
    let chat_template = t
        .chat_template_file
        .map(|p| {
            let p = at(p);
            std::fs::read_to_string(&p)
                .with_context(|| format!("chat_template_file = {}", p.display()))
        })
        .transpose()?;
    let keep_alive = t
        .keep_alive
        .map(|v| {
            let json = match v {
                toml::Value::String(s) => serde_json::Value::String(s),
                toml::Value::Integer(n) => serde_json::json!(n),
                toml::Value::Float(f) => serde_json::json!(f),
                other => serde_json::Value::String(other.to_string()),
            };
            KeepAlive::parse(&json)
                .map_err(|e| anyhow::anyhow!(e.replace("'keep_alive'", "keep_alive")))
        })
        .transpose()?;
    Ok(ModelSettings {
        name: name.to_string(),
        path: model_path,
        ctx: positive("ctx", t.ctx, 2)?,
        parallel: match t.parallel {
            Some(n) if !(1..=MAX_PARALLEL).contains(&n) => {
                bail!("parallel must be between 1 and {MAX_PARALLEL}, got {n}")
            }
            p => p,
        },
        kv_size: positive("kv_size", t.kv_size, 2)?,
        cache_types,
        pooling: t
            .pooling
            .map(|s| match Pooling::from_name(&s) {
                Some(p @ (Pooling::Mean | Pooling::Cls | Pooling::Last)) => Ok(p),
                _ => Err(anyhow::anyhow!("pooling = {s:?}: not mean, cls or last")),
            })
            .transpose()?,
        chat_template,
        draft_model: t.draft_model.map(at),
        draft_max: t.draft_max,
        lora: t.lora.unwrap_or_default().into_iter().map(at).collect(),
        keep_alive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile_dir::Dir, PathBuf) {
        let d = tempfile_dir::Dir::new();
        let p = d.0.join("models.toml");
        std::fs::write(&p, text).unwrap();
        std::fs::write(d.0.join("m.gguf"), b"GGUF").unwrap();
        (d, p)
    }

    /// A scratch folder removed on drop (the server crate has no tempfile dependency).
    mod tempfile_dir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "frink-models-config-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn no_store(name: &str) -> Result<PathBuf> {
        bail!("{name} is not in the store")
    }

    #[test]
    fn settings_are_read_and_checked_by_key() {
        let (_d, p) = write(
            "[models.coder]\nmodel = \"m.gguf\"\nctx = 512\nparallel = 2\nkv_type = \"q8_0\"\nkeep_alive = \"30m\"\n",
        );
        let s = read(&p, &no_store).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].name.as_str(), s[0].ctx, s[0].parallel),
            ("coder", Some(512), Some(2))
        );
        assert!(s[0].path.ends_with("m.gguf"));
        assert_eq!(
            s[0].keep_alive,
            Some(KeepAlive::For(std::time::Duration::from_secs(1800)))
        );
        for (bad, named) in [
            ("[models.a]\nmodel = \"m.gguf\"\nctxx = 5\n", "ctxx"),
            ("[models.a]\nmodel = \"m.gguf\"\nctx = 1\n", "ctx"),
            (
                "[models.a]\nmodel = \"m.gguf\"\nkv_type = \"q3\"\n",
                "kv_type",
            ),
            ("[models.a]\nmodel = \"nothing-here\"\n", "nothing-here"),
            ("[models.\"../x\"]\nmodel = \"m.gguf\"\n", "path"),
            (
                "[models.a]\nmodel = \"m.gguf\"\nkeep_alive = \"soon\"\n",
                "keep_alive",
            ),
        ] {
            let (_d, p) = write(bad);
            let e = format!("{:#}", read(&p, &no_store).unwrap_err());
            assert!(e.contains(named), "{bad}: {e}");
        }
    }
}
