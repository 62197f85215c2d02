//! Models from the Hugging Face hub: `hf:ORG/REPO[/FILE.gguf][:QUANT]`.
//!
//! The repository's files are listed with the hub's tree API
//! (`GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true`, whose entries carry
//! `lfs.oid`, the sha256 of each large file); a file is downloaded from its resolve URL
//! (`GET {endpoint}/{repo}/resolve/{revision}/{path}`, which redirects to a CDN), resumed
//! with a `Range` request when an earlier download was cut, hashed, and moved into
//! `$FRINK_HOME/models/hf/ORG/REPO/` only when its sha256 matches. `HF_ENDPOINT` replaces
//! the hub's address and `HF_TOKEN` is sent as a bearer token (to the hub, not to the CDN
//! it redirects to). Without a file name, the repository's `Q4_K_M` GGUF is taken (as
//! Ollama's and llama.cpp's `-hf` do), or the one `:QUANT` names; a split model's shards
//! (`-00001-of-00003.gguf`) are fetched together.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use tracing::{debug, info};

use crate::error::{IoContext, Result, StoreError};

/// The longest a hub request may go without a byte arriving.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The largest listing read from the tree API (a real repository's is kilobytes).
const MAX_LISTING: u64 = 16 << 20;

/// The hub's address unless `HF_ENDPOINT` says otherwise.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A parsed `hf:` name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubName {
    /// `ORG/REPO`.
    pub repo: String,
    /// A file path in the repository, if named.
    pub file: Option<String>,
    /// A quantization to pick (`Q8_0`), if named instead of a file.
    pub quant: Option<String>,
}

impl HubName {
    /// Parses `hf:ORG/REPO`, `hf:ORG/REPO/FILE.gguf` (the file may sit in a folder) or
    /// `hf:ORG/REPO:QUANT`; `None` for a name without the `hf:` prefix.
    ///
    /// Errors: [`StoreError::BadHubName`] for a malformed one.
    pub fn parse(s: &str) -> Option<Result<HubName>> {
        let rest = s.strip_prefix("hf:")?;
        let bad = || Err(StoreError::BadHubName(s.to_string()));
        let (path, quant) = match rest.rsplit_once(':') {
            Some((p, q)) if !q.contains('/') && !q.is_empty() => (p, Some(q.to_string())),
            _ => (rest, None),
        };
        let mut parts = path.splitn(3, '/');
        let (Some(org), Some(repo)) = (parts.next(), parts.next()) else {
            return Some(bad());
        };
        let ok = |x: &str| {
            !x.is_empty()
                && x != "."
                && x != ".."
                && x.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !ok(org) || !ok(repo) {
            return Some(bad());
        }
        let file = parts.next().map(str::to_string);
        if let Some(f) = &file {
            if !f.ends_with(".gguf") || f.split('/').any(|c| !ok(c)) || quant.is_some() {
                return Some(bad());
            }
        }
        Some(Ok(HubName {
            repo: format!("{org}/{repo}"),
            file,
            quant,
        }))
    }
}

/// A file of a repository as the tree API lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    /// Its path in the repository.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The sha256 the hub publishes (`lfs.oid`), if any.
    pub sha256: Option<String>,
}

/// The hub (or a server with its URL layout).
#[derive(Clone, Debug)]
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    revision: String,
}

/// `-00001-of-00003.gguf`: (shard number, count) of a split model's file name.
pub(crate) fn shard_of(path: &str) -> Option<(usize, usize)> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (_, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    Some((no.parse().ok()?, count.parse().ok()?))
}

/// The files of the model whose (first) file is `first`: all shards in order for the first
/// shard of a split model (`…-00001-of-00003.gguf`, llama.cpp's `gguf-split` names), else
/// `first` alone.
pub(crate) fn shards(first: &str) -> Vec<String> {
    match shard_of(first) {
        Some((1, n)) => {
            let stem = first.trim_end_matches(&format!("-00001-of-{n:05}.gguf"));
            (1..=n)
                .map(|k| format!("{stem}-{k:05}-of-{n:05}.gguf"))
                .collect()
        }
        _ => vec![first.to_string()],
    }
}

impl Hub {
    /// The hub at `endpoint` (`https://huggingface.co` or a server with its URL layout),
    /// sending `token` as a bearer token.
    pub fn new(endpoint: &str, token: Option<&str>) -> Hub {
        Hub {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: token.map(str::to_string),
            revision: "main".into(),
        }
    }

    /// The hub of `HF_ENDPOINT` (default [`DEFAULT_ENDPOINT`]) with `HF_TOKEN`, if set.
    pub fn from_env() -> Hub {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Hub {
            endpoint: env("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            token: env("HF_TOKEN"),
            revision: "main".into(),
        }
    }

    fn get(&self, url: &str, range_from: u64) -> Result<ureq::Response> {
        // A hub that stops sending (or never answers) fails the read after a minute instead
        // of holding the download's thread for ever.
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(std::time::Duration::from_secs(30))
            .timeout_read(READ_TIMEOUT)
            .redirects(8)
            .build();
        let mut req = agent.get(url);
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.set("Range", &format!("bytes={range_from}-"));
        }
        match req.call() {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(401 | 403, _)) => Err(StoreError::Hub(format!(
                "{url}: access refused (401/403){}",
                if self.token.is_some() {
                    ": HF_TOKEN does not grant access to this repository"
                } else {
                    ": a gated or private repository needs HF_TOKEN"
                }
            ))),
            Err(ureq::Error::Status(404, _)) => {
                Err(StoreError::Hub(format!("{url}: not found (404)")))
            }
            Err(ureq::Error::Status(code, _)) => {
                Err(StoreError::Hub(format!("{url}: HTTP {code}")))
            }
            // (ureq's transport errors name the URL themselves.)
            Err(e) => Err(StoreError::Hub(e.to_string())),
        }
    }

    /// The files of `repo`.
    ///
    /// Errors: [`StoreError::Hub`] (unreachable, 401 without a token, 404, a listing that
    /// is not the tree API's JSON).
    pub fn list(&self, repo: &str) -> Result<Vec<HubFile>> {
        let url = format!(
            "{}/api/models/{repo}/tree/{}?recursive=true",
            self.endpoint, self.revision
        );
        let mut body = String::new();
        self.get(&url, 0)?
            .into_reader()
            .take(MAX_LISTING)
            .read_to_string(&mut body)
            .map_err(|e| StoreError::Hub(format!("{url}: {e}")))?;
        let entries: Vec<serde_json::Value> = serde_json::from_str(&body)
            .map_err(|e| StoreError::Hub(format!("{url}: not a file listing ({e})")))?;
        Ok(entries
            .iter()
            .filter(|e| e["type"] == "file")
            .filter_map(|e| {
                Some(HubFile {
                    path: e["path"].as_str()?.to_string(),
                    size: e["size"].as_u64().unwrap_or(0),
                    sha256: e["lfs"]["oid"].as_str().map(str::to_ascii_lowercase),
                })
            })
            .collect())
    }

    /// The files `name` means among `files`: the named file, or the `:QUANT` one, or the
    /// `Q4_K_M` one (projector files `mmproj*` left out), with all shards of a split model
    /// in order.
    ///
    /// Errors: [`StoreError::Hub`] naming the GGUF files there are when none or several fit.
    pub fn pick(name: &HubName, files: &[HubFile]) -> Result<Vec<HubFile>> {
        let ggufs: Vec<&HubFile> = files
            .iter()
            .filter(|f| f.path.ends_with(".gguf") && !is_projector(&f.path))
            .collect();
        let listing = || {
            ggufs
                .iter()
                .map(|f| f.path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let chosen: Vec<&HubFile> = match &name.file {
            Some(path) => ggufs.iter().copied().filter(|f| &f.path == path).collect(),
            None => {
                let want = name
                    .quant
                    .as_deref()
                    .unwrap_or("Q4_K_M")
                    .to_ascii_uppercase();
                let matches: Vec<&HubFile> = ggufs
                    .iter()
                    .copied()
                    .filter(|f| {
                        let n = f.path.to_ascii_uppercase();
                        n.contains(&format!("{want}.")) || n.contains(&format!("{want}-"))
                    })
                    .collect();
                // No Q4_K_M file and the repository holds one model (one file, or one
                // split model's shards): that model.
                let models = ggufs
                    .iter()
                    .filter(|f| shard_of(&f.path).is_none_or(|(no, _)| no == 1))
                    .count();
                match matches.len() {
                    0 if name.quant.is_none() && models == 1 => ggufs.clone(),
                    _ => matches,
                }
            }
        };
        // A split model: its first shard stands for it.
        let first = chosen
            .iter()
            .find(|f| shard_of(&f.path).is_none_or(|(no, _)| no == 1));
        let (Some(first), true) = (first, !chosen.is_empty()) else {
            return Err(StoreError::Hub(format!(
                "{}: no GGUF file fits {} (files: {})",
                name.repo,
                name.file
                    .clone()
                    .or(name.quant.clone())
                    .unwrap_or_else(|| "Q4_K_M".into()),
                listing()
            )));
        };
        let singles = chosen
            .iter()
            .filter(|f| shard_of(&f.path).is_none())
            .count();
        if name.file.is_none() && singles > 1 {
            return Err(StoreError::Hub(format!(
                "{}: several files fit; name one as hf:{}/FILE.gguf (files: {})",
                name.repo,
                name.repo,
                listing()
            )));
        }
        shards(&first.path)
            .into_iter()
            .map(|p| {
                files
                    .iter()
                    .find(|f| f.path == p)
                    .cloned()
                    .ok_or_else(|| StoreError::Hub(format!("{}: shard {p} is missing", name.repo)))
            })
            .collect()
    }

    /// Downloads `file` of `repo` to `dest` (created atomically): into `dest.partial`
    /// (continued with a `Range` request if an earlier download left one), hashed, and
    /// renamed only if the sha256 is the one the hub publishes. `on_bytes` is told the
    /// file's bytes on disk so far, after every read.
    ///
    /// Errors: [`StoreError::Hub`] for a refused request, a file the hub publishes no
    /// sha256 for, or a short download; [`StoreError::Sha256Mismatch`] (the partial file
    /// is removed); [`StoreError::Io`].
    pub fn download(
        &self,
        repo: &str,
        file: &HubFile,
        dest: &Path,
        on_bytes: &dyn Fn(u64),
    ) -> Result<()> {
        let Some(expected) = &file.sha256 else {
            return Err(StoreError::Hub(format!(
                "{repo}: the hub publishes no sha256 for {}; refusing an unverifiable file",
                file.path
            )));
        };
        let partial = dest.with_file_name(format!(
            "{}.partial",
            dest.file_name().and_then(|n| n.to_str()).unwrap_or("model")
        ));
        let mut have = fs::metadata(&partial).map_or(0, |m| m.len());
        if have > file.size {
            have = 0;
        }
        let url = format!(
            "{}/{repo}/resolve/{}/{}",
            self.endpoint, self.revision, file.path
        );
        let mut hasher = Sha256::new();
        let resp = self.get(&url, have)?;
        let resumed = have > 0 && resp.status() == 206;
        let mut out = if resumed {
            // Hash what is already there, then append.
            let mut f = File::open(&partial).ctx(|| format!("reading {}", partial.display()))?;
            io::copy(&mut (&mut f).take(have), &mut HashWriter(&mut hasher))
                .ctx(|| format!("reading {}", partial.display()))?;
            info!("resuming {} at byte {have}", file.path);
            OpenOptions::new()
                .append(true)
                .open(&partial)
                .ctx(|| format!("opening {}", partial.display()))?
        } else {
            have = 0;
            File::create(&partial).ctx(|| format!("creating {}", partial.display()))?
        };
        on_bytes(have);
        let mut reader = resp.into_reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = have;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    // What arrived stays in the partial file for the next attempt.
                    return Err(StoreError::Hub(format!(
                        "{url}: download cut at byte {got} of {} ({e}); run it again to resume",
                        file.size
                    )));
                }
            };
            got += n as u64;
            if got > file.size {
                // Never more than the listing promised on disk (a hostile hub could fill it).
                drop(out);
                let _ = fs::remove_file(&partial);
                return Err(StoreError::Hub(format!(
                    "{url}: the hub sends more than the {} bytes it lists; refusing the file",
                    file.size
                )));
            }
            out.write_all(&buf[..n])
                .ctx(|| format!("writing {}", partial.display()))?;
            hasher.update(&buf[..n]);
            on_bytes(got);
        }
        out.sync_all()
            .ctx(|| format!("syncing {}", partial.display()))?;
        drop(out);
        if got != file.size {
            return Err(StoreError::Hub(format!(
                "{url}: {got} bytes arrived, the hub lists {}; run it again to resume",
                file.size
            )));
        }
        let actual = format!("{:x}", hasher.finalize());
        if &actual != expected {
            let _ = fs::remove_file(&partial);
            return Err(StoreError::Sha256Mismatch {
                model: format!("hf:{repo}"),
                file: file.path.clone(),
                expected: expected.clone(),
                actual,
            });
        }
        fs::rename(&partial, dest).ctx(|| format!("moving {} into place", dest.display()))?;
        Ok(())
    }
}

/// Feeds written bytes to a hasher.
struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.update(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where the files of `repo` live in a store rooted at `root`.
pub fn repo_dir(root: &Path, repo: &str) -> PathBuf {
    root.join("hf").join(repo)
}

/// `dir` joined with `listed`, a file path from a hub's listing, when that path stays
/// inside `dir`: relative, every component a plain name (no `..`, no leading `/` or `./`,
/// no backslash or NUL, which other systems read as separators or ends). A hostile or
/// mirrored hub (`HF_ENDPOINT`) could otherwise list `../../x` or `/tmp/x` and, with a
/// matching sha256, have the file written there.
///
/// Errors: [`StoreError::Hub`] naming the path.
pub fn contained(dir: &Path, listed: &str) -> Result<PathBuf> {
    let plain = !listed.is_empty()
        && !listed.contains(['\\', '\0'])
        && Path::new(listed)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    if plain {
        Ok(dir.join(listed))
    } else {
        Err(StoreError::Hub(format!(
            "the hub lists a file path that leaves the store, {listed:?}; refusing it"
        )))
    }
}

/// Creates the folder of `dest` and checks, with links resolved, that it lies inside
/// `root` (a link placed in the store must not lead a download out of it).
///
/// Errors: [`StoreError::Hub`] for a folder outside `root`; [`StoreError::Io`].
fn make_parent_inside(root: &Path, dest: &Path) -> Result<()> {
    let Some(parent) = dest.parent() else {
        return Ok(());
    };
    fs::create_dir_all(parent).ctx(|| format!("creating {}", parent.display()))?;
    let real = fs::canonicalize(parent).ctx(|| format!("resolving {}", parent.display()))?;
    let real_root = fs::canonicalize(root).ctx(|| format!("resolving {}", root.display()))?;
    if real.starts_with(&real_root) {
        Ok(())
    } else {
        Err(StoreError::Hub(format!(
            "{} resolves to {}, outside the store {}; refusing to write there",
            parent.display(),
            real.display(),
            real_root.display()
        )))
    }
}

/// Makes sure the model `name` is in the store under `root` and returns the path of its
/// (first) file: already-present files (all shards) are used as they are; otherwise the
/// repository is listed and the missing files downloaded. Every listed path is checked to
/// stay inside the store ([`contained`]) before anything is requested or written.
///
/// Errors: those of [`Hub::list`], [`Hub::pick`], [`contained`] and [`Hub::download`].
pub fn pull(hub: &Hub, root: &Path, name: &HubName) -> Result<PathBuf> {
    pull_with(hub, root, name, &crate::NoProgress)
}

/// [`pull`], reporting the bytes of every file it fetches (the shards together, those
/// already present counted as done) to `progress`.
pub fn pull_with(
    hub: &Hub,
    root: &Path,
    name: &HubName,
    progress: &dyn crate::Progress,
) -> Result<PathBuf> {
    let dir = repo_dir(root, &name.repo);
    // A named file already complete (a split one with all its shards) needs no listing.
    if let Some(f) = &name.file {
        let p = contained(&dir, f)?;
        if shards(f).iter().all(|s| dir.join(s).is_file()) {
            return Ok(p);
        }
    }
    let files = hub.list(&name.repo)?;
    let chosen = Hub::pick(name, &files)?;
    let dests = chosen
        .iter()
        .map(|f| contained(&dir, &f.path))
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = dests.first().cloned() else {
        return Err(StoreError::Hub(format!(
            "hf:{}: the listing names no file to fetch",
            name.repo
        )));
    };
    fetch(hub, root, &name.repo, &chosen, &dests, progress)?;
    Ok(first)
}

/// Downloads each of `files` of `repo` to its `dests` (inside `root`) unless present, one
/// download of a file at a time across processes, reporting the bytes of all of them
/// together to `progress`.
///
/// Errors: those of [`Hub::download`], the store's locks and folders.
fn fetch(
    hub: &Hub,
    root: &Path,
    repo: &str,
    files: &[HubFile],
    dests: &[PathBuf],
    progress: &dyn crate::Progress,
) -> Result<()> {
    // Sizes come from the hub: a hostile listing must not overflow the sum.
    let total = files.iter().fold(0u64, |t, f| t.saturating_add(f.size));
    let mut done = 0u64;
    for (f, dest) in files.iter().zip(dests) {
        if !dest.is_file() {
            make_parent_inside(root, dest)?;
            // One download of a file at a time, whatever name asked for it (`hf:o/r` and
            // `hf:o/r:Q4_K_M` are the same file), in this process or another.
            let rel = dest.strip_prefix(root).unwrap_or(dest).to_string_lossy();
            let _lock = crate::lock_exclusive(root, &rel, &format!("hf:{repo}"))?;
            if !dest.is_file() {
                debug!("fetching {} from hf:{repo}", f.path);
                let on_bytes = |n: u64| {
                    progress.event(crate::PullEvent::Downloading {
                        completed: done.saturating_add(n),
                        total,
                    })
                };
                hub.download(repo, f, dest, &on_bytes)?;
            }
        }
        done = done.saturating_add(f.size);
    }
    progress.event(crate::PullEvent::Verifying);
    Ok(())
}

/// Whether `path` names a projector file (`mmproj*.gguf`, as llama.cpp's converter and
/// the published vision repositories name them).
pub fn is_projector(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or("");
    base.starts_with("mmproj") && base.ends_with(".gguf")
}

/// The projector file to take among `paths` (projector files): F16 first (what
/// llama.cpp's converter writes by default and vision repositories publish beside their
/// quantized models), then BF16, then Q8_0, then the first by name.
pub fn best_projector<'a>(paths: &[&'a str]) -> Option<&'a str> {
    let rank = |p: &str| {
        let u = p.to_ascii_uppercase();
        let has = |t: &str| u.contains(&format!("-{t}.")) || u.contains(&format!("_{t}."));
        if has("F16") {
            0
        } else if has("BF16") {
            1
        } else if has("Q8_0") {
            2
        } else {
            3
        }
    };
    paths
        .iter()
        .copied()
        .min_by(|a, b| (rank(a), *a).cmp(&(rank(b), *b)))
}

/// The projector file of `name`'s repository (llama.cpp's `-hf` fetches it beside the
/// model): one already in the store is taken without asking the hub; else the listing's
/// best ([`best_projector`]) is downloaded as [`pull_with`] downloads models. `None` when
/// the repository has none.
///
/// Errors: those of [`Hub::list`], [`contained`] and [`Hub::download`].
pub fn pull_projector(
    hub: &Hub,
    root: &Path,
    name: &HubName,
    progress: &dyn crate::Progress,
) -> Result<Option<PathBuf>> {
    let dir = repo_dir(root, &name.repo);
    let local: Vec<String> = fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| is_projector(n))
                .collect()
        })
        .unwrap_or_default();
    let local_refs: Vec<&str> = local.iter().map(String::as_str).collect();
    if let Some(best) = best_projector(&local_refs) {
        return Ok(Some(dir.join(best)));
    }
    let files = hub.list(&name.repo)?;
    let paths: Vec<&str> = files
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| is_projector(p))
        .collect();
    let Some(best) = best_projector(&paths) else {
        return Ok(None);
    };
    let Some(file) = files.iter().find(|f| f.path == best).cloned() else {
        return Ok(None);
    };
    let dest = contained(&dir, &file.path)?;
    fetch(
        hub,
        root,
        &name.repo,
        std::slice::from_ref(&file),
        std::slice::from_ref(&dest),
        progress,
    )?;
    Ok(Some(dest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_f16_projector_is_preferred() {
        let ps = [
            "mmproj-model-Q8_0.gguf",
            "mmproj-model-f16.gguf",
            "mmproj-model-bf16.gguf",
        ];
        assert_eq!(best_projector(&ps), Some("mmproj-model-f16.gguf"));
        assert_eq!(best_projector(&ps[..1]), Some("mmproj-model-Q8_0.gguf"));
        assert_eq!(
            best_projector(&["mmproj-b.gguf", "mmproj-a.gguf"]),
            Some("mmproj-a.gguf")
        );
        assert_eq!(best_projector(&[]), None);
        assert!(is_projector("sub/mmproj-x.gguf") && !is_projector("model-mmproj.gguf"));
        assert!(!is_projector("mmproj-x.bin"));
    }

    #[test]
    fn names_parse() {
        let p = |s: &str| HubName::parse(s).map(|r| r.ok());
        assert_eq!(p("smollm2-135m"), None);
        assert_eq!(
            p("hf:Qwen/Qwen2.5-1.5B-Instruct-GGUF"),
            Some(Some(HubName {
                repo: "Qwen/Qwen2.5-1.5B-Instruct-GGUF".into(),
                file: None,
                quant: None
            }))
        );
        assert_eq!(
            p("hf:org/repo/sub/model-Q8_0.gguf")
                .unwrap()
                .unwrap()
                .file
                .as_deref(),
            Some("sub/model-Q8_0.gguf")
        );
        assert_eq!(
            p("hf:org/repo:Q8_0").unwrap().unwrap().quant.as_deref(),
            Some("Q8_0")
        );
        for bad in [
            "hf:",
            "hf:org",
            "hf:org/",
            "hf:../x",
            "hf:org/repo/x.bin",
            "hf:org/repo/../../x.gguf",
        ] {
            assert_eq!(p(bad), Some(None), "{bad}");
        }
        assert_eq!(shard_of("a/m-Q4_K_M-00002-of-00003.gguf"), Some((2, 3)));
        assert_eq!(shard_of("m-Q4_K_M.gguf"), None);
    }

    #[test]
    fn the_q4_k_m_file_or_the_named_quant_is_picked_with_its_shards() {
        let f = |p: &str| HubFile {
            path: p.into(),
            size: 1,
            sha256: Some("0".into()),
        };
        let files = vec![
            f("README.md"),
            f("m-Q8_0.gguf"),
            f("m-Q4_K_M.gguf"),
            f("mmproj-m-Q4_K_M.gguf"),
            f("big/m-Q4_0-00002-of-00002.gguf"),
            f("big/m-Q4_0-00001-of-00002.gguf"),
        ];
        let name = |s: &str| HubName::parse(s).unwrap().unwrap();
        let paths = |v: Vec<HubFile>| v.into_iter().map(|f| f.path).collect::<Vec<_>>();
        assert_eq!(
            paths(Hub::pick(&name("hf:o/r"), &files).unwrap()),
            ["m-Q4_K_M.gguf"]
        );
        assert_eq!(
            paths(Hub::pick(&name("hf:o/r:q8_0"), &files).unwrap()),
            ["m-Q8_0.gguf"]
        );
        assert_eq!(
            paths(Hub::pick(&name("hf:o/r:Q4_0"), &files).unwrap()),
            [
                "big/m-Q4_0-00001-of-00002.gguf",
                "big/m-Q4_0-00002-of-00002.gguf"
            ]
        );
        let e = Hub::pick(&name("hf:o/r:IQ2_XS"), &files)
            .unwrap_err()
            .to_string();
        assert!(e.contains("m-Q8_0.gguf") && !e.contains("mmproj"), "{e}");
    }
}
