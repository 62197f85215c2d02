//! Saved sequence states: a slot's KV cache (and recurrent state) on disk, for the
//! server's `POST /slots/{id}?action=save|restore` (llama.cpp's `--slot-save-path`) and
//! `frink run --prompt-cache` (llama-cli's).
//!
//! A file is: the magic `FRINKKV\0`, the format version (u32 LE), the header's length
//! (u32 LE) and the header (JSON: what the state is valid for), the tokens (u32 LE each),
//! the payload ([`frink_models::state_io`]) and the SHA-256 of everything before it. A
//! state is restored only into the model it was saved with (a fingerprint of its tensors
//! and of its configuration as read, overrides included), with the same KV type and the
//! same adapters at the same scales; anything else is refused naming the difference. A
//! truncated or damaged file is an error before anything is allocated for it.

use sha2::{Digest, Sha256};

use frink_models::state_io::Extent;
use frink_models::Model;

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"FRINKKV\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// The longest header read (a header is about 300 bytes).
const MAX_HEADER: usize = 64 << 10;

/// Why a state file cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StateError {
    #[error("not a frink state file (its first bytes are not FRINKKV)")]
    NotAState,
    #[error("state file format version {0}; this build reads version {VERSION}")]
    Version(u32),
    #[error("the state file is truncated ({0})")]
    Truncated(&'static str),
    #[error("the state file is damaged (its checksum does not match its contents)")]
    Damaged,
    #[error("the state file's header is invalid: {0}")]
    Header(String),
    /// The saved keys and values do not fit the model they claim to be of (their size),
    /// or hold values no model makes.
    #[error("the state file's contents are invalid: {0}")]
    Payload(String),
    #[error("the state was saved with {what} {saved}, not {here}")]
    Mismatch {
        what: &'static str,
        saved: String,
        here: String,
    },
    #[error("the state holds {n} tokens, more than the context of {n_ctx}")]
    TooLong { n: usize, n_ctx: usize },
}

/// What a saved state is valid for, and its size.
#[derive(Clone, Debug, PartialEq)]
pub struct StateHeader {
    /// [`model_fingerprint`] of the model it was saved with.
    pub model: String,
    /// `general.architecture`, for the error message.
    pub arch: String,
    /// The KV cache element type (`f16`, `q8_0`, …).
    pub kv_type: String,
    /// Adapters applied (file name, scale), in the model's order; scale-0 ones left out.
    pub lora: Vec<(String, f32)>,
    /// The positions saved, and where the window group's layers start.
    pub extent: Extent,
}

impl StateHeader {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "arch": self.arch,
            "kv_type": self.kv_type,
            "lora": self.lora.iter().map(|(f, s)| serde_json::json!([f, s])).collect::<Vec<_>>(),
            "n_tokens": self.extent.n,
            "window_held_from": self.extent.held_from,
        })
    }

    fn from_json(v: &serde_json::Value) -> Result<StateHeader, StateError> {
        let bad = |what: &str| StateError::Header(format!("'{what}' missing or of the wrong type"));
        // Short plain strings (a fingerprint is 64 hex digits; names are echoed in errors).
        let s = |k: &str| {
            v[k].as_str()
                .filter(|s| s.len() <= 256 && s.chars().all(|c| c.is_ascii_graphic()))
                .map(str::to_string)
                .ok_or_else(|| bad(k))
        };
        let n = |k: &str| {
            v[k].as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .ok_or_else(|| bad(k))
        };
        let lora = v["lora"]
            .as_array()
            .filter(|a| a.len() <= 64)
            .ok_or_else(|| bad("lora"))?
            .iter()
            .map(|e| match (e[0].as_str(), e[1].as_f64()) {
                (Some(f), Some(x)) if f.len() <= 256 && (x as f32).is_finite() => {
                    Ok((f.to_string(), x as f32))
                }
                _ => Err(bad("lora")),
            })
            .collect::<Result<_, _>>()?;
        let model = s("model")?;
        if model.len() != 64 || !model.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(StateError::Header("'model' is not a fingerprint".into()));
        }
        Ok(StateHeader {
            model,
            arch: s("arch")?,
            kv_type: s("kv_type")?,
            lora,
            extent: Extent {
                n: n("n_tokens")?,
                held_from: n("window_held_from")?,
            },
        })
    }

    /// Refuses a state saved for something else than `here` (model, KV type, adapters),
    /// naming the first difference.
    pub fn check(&self, here: &StateHeader) -> Result<(), StateError> {
        let mismatch =
            |what, saved: String, here: String| Err(StateError::Mismatch { what, saved, here });
        if self.model != here.model {
            return mismatch(
                "another model",
                format!("({} {})", self.arch, short(&self.model)),
                format!("this one ({} {})", here.arch, short(&here.model)),
            );
        }
        if self.kv_type != here.kv_type {
            return mismatch("KV cache type", self.kv_type.clone(), here.kv_type.clone());
        }
        if self.lora != here.lora {
            let show = |l: &[(String, f32)]| match l.is_empty() {
                true => "no adapters".to_string(),
                false => l
                    .iter()
                    .map(|(f, s)| format!("{f} at {s}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            return mismatch("LoRA adapters", show(&self.lora), show(&here.lora));
        }
        Ok(())
    }
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

/// A fingerprint of what makes a model's keys and values what they are: its tensor table
/// (names, types, shapes, offsets), the first 256 bytes of every tensor's data, the
/// file's length and its configuration as read (so a `--override-kv` or RoPE flag that
/// changes the model changes it too). SHA-256, hex. Reading the whole file would take
/// seconds for a large model; a fine-tune of the same shapes differs in every tensor's
/// first bytes.
pub fn model_fingerprint(model: &Model) -> String {
    let mut h = Sha256::new();
    h.update(model.file.file_len().to_le_bytes());
    for t in model.file.tensors() {
        let info = &t.info;
        h.update(format!(
            "{}:{:?}:{:?}:{};",
            info.name, info.ggml_type, info.shape, info.offset
        ));
        h.update(&t.data[..t.data.len().min(256)]);
    }
    h.update(format!("{:?}", model.config));
    format!("{:x}", h.finalize())
}

/// The bytes of a state file.
pub fn encode(header: &StateHeader, tokens: &[u32], payload: &[u8]) -> Vec<u8> {
    let json = header.to_json().to_string();
    let mut out = Vec::with_capacity(16 + json.len() + 4 * tokens.len() + payload.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(payload);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

/// A state file's parts: its header, tokens and payload (checked against the checksum,
/// `n_tokens` tokens present).
pub fn decode(bytes: &[u8]) -> Result<(StateHeader, Vec<u32>, &[u8]), StateError> {
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(StateError::NotAState);
    }
    if bytes.len() < 16 + 32 {
        return Err(StateError::Truncated("no header"));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(StateError::Version(version));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err(StateError::Damaged);
    }
    let hlen = u32::from_le_bytes(body[12..16].try_into().expect("4 bytes")) as usize;
    if hlen > MAX_HEADER || 16 + hlen > body.len() {
        return Err(StateError::Truncated("the header"));
    }
    let json: serde_json::Value = serde_json::from_slice(&body[16..16 + hlen])
        .map_err(|e| StateError::Header(e.to_string()))?;
    let header = StateHeader::from_json(&json)?;
    let rest = &body[16 + hlen..];
    let n = header.extent.n;
    if n.checked_mul(4).is_none_or(|b| b > rest.len()) {
        return Err(StateError::Truncated("the tokens"));
    }
    let tokens = rest[..4 * n]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok((header, tokens, &rest[4 * n..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> StateHeader {
        StateHeader {
            model: "ab".repeat(32),
            arch: "llama".into(),
            kv_type: "f16".into(),
            lora: vec![("a.gguf".into(), 0.5)],
            extent: Extent { n: 3, held_from: 0 },
        }
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let bytes = encode(&header(), &[1, 2, 3], &[9; 10]);
        let (h, t, p) = decode(&bytes).unwrap();
        assert_eq!((h, t, p), (header(), vec![1, 2, 3], &[9u8; 10][..]));
        assert_eq!(decode(&bytes[..bytes.len() - 1]), Err(StateError::Damaged));
        assert_eq!(
            decode(&bytes[..10]),
            Err(StateError::Truncated("no header"))
        );
        assert_eq!(decode(b"GGUF...."), Err(StateError::NotAState));
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert_eq!(decode(&flipped), Err(StateError::Damaged));
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert_eq!(decode(&v2), Err(StateError::Version(2)));
        // Only a fingerprint of 64 hex digits is a model (a multi-byte character where the
        // error shortens it panicked once).
        for model in [
            "a".to_string() + &"€".repeat(10),
            "ab".repeat(31),
            "zz".repeat(32),
        ] {
            let h = StateHeader { model, ..header() };
            let bytes = encode(&h, &[1, 2, 3], &[9; 10]);
            let r = decode(&bytes);
            assert!(matches!(r, Err(StateError::Header(_))), "{r:?}");
        }
    }

    #[test]
    fn names_the_difference() {
        let here = header();
        let mut other = header();
        other.kv_type = "q8_0".into();
        let e = other.check(&here).unwrap_err().to_string();
        assert!(e.contains("KV cache type q8_0, not f16"), "{e}");
        other = header();
        other.lora.clear();
        let e = other.check(&here).unwrap_err().to_string();
        assert!(
            e.contains("LoRA adapters no adapters, not a.gguf at 0.5"),
            "{e}"
        );
        other = header();
        other.model = "cd".repeat(32);
        let e = other.check(&here).unwrap_err().to_string();
        assert!(e.contains("another model"), "{e}");
        assert!(header().check(&here).is_ok());
    }
}
