//! `frink tokenize` and `frink detokenize` (CONTRACT.md): the model's tokenizer from the
//! command line, for debugging and scripts.

use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};

use anyhow::{Context, Result};
use clap::{ArgAction, Args};
use frink_store::Store;
use frink_tokenizer::Tokenizer;

/// Flags of `frink tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Catalog name (fetched on first use) or path to a .gguf file.
    #[arg(short = 'm', long = "model", env = "FRINK_MODEL", default_value = frink_store::default_model_name())]
    pub model: String,
    /// Add BOS/EOS where the model's metadata says to (`--add-special=false`: never).
    #[arg(long = "add-special", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = true)]
    pub add_special: bool,
    /// Turn the text of control tokens (e.g. `<|im_start|>`) into those tokens.
    #[arg(long = "parse-special", num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub parse_special: bool,
    /// Print one JSON array of ids instead of one `id piece` line per token.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
    /// The text, or `-` to read standard input byte for byte (nothing is stripped).
    #[arg(allow_hyphen_values = true)]
    pub text: OsString,
}

/// Flags of `frink detokenize`.
#[derive(Args, Debug)]
pub struct DetokenizeArgs {
    /// Catalog name (fetched on first use) or path to a .gguf file.
    #[arg(short = 'm', long = "model", env = "FRINK_MODEL", default_value = frink_store::default_model_name())]
    pub model: String,
    /// Print `{"text": …}` instead of the text itself.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub json: bool,
    /// Token ids (separate arguments, or comma-separated).
    #[arg(required = true, num_args = 1..)]
    pub ids: Vec<String>,
}

fn load(model: &str) -> Result<Tokenizer> {
    let path = Store::from_env()?.resolve(model)?;
    Tokenizer::from_path(&path)
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))
}

/// The input bytes: the argument as given, or all of standard input for `-`.
fn input_bytes(text: &OsString) -> Result<Vec<u8>> {
    if text == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("cannot read standard input")?;
        return Ok(buf);
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(text.as_bytes().to_vec())
    }
    #[cfg(not(unix))]
    {
        Ok(text.to_string_lossy().into_owned().into_bytes())
    }
}

/// `frink tokenize`: prints the ids of the text (llama.cpp's `llama_tokenize` with the given
/// flags), from the bytes as given (UTF-8 or not, see `Tokenizer::encode_bytes`).
pub fn tokenize(args: &TokenizeArgs) -> Result<()> {
    let bytes = input_bytes(&args.text)?;
    let tok = load(&args.model)?;
    let ids = tok.encode_bytes(&bytes, args.add_special, args.parse_special)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&ids)?)?;
    } else {
        for &id in &ids {
            let piece = String::from_utf8_lossy(tok.token_to_piece(id, true)?).into_owned();
            writeln!(out, "{id:>7} {piece:?}")?;
        }
    }
    Ok(())
}

/// `frink detokenize`: prints the text of the ids (`llama_detokenize`, special tokens
/// rendered). Without `--json` the exact bytes are written, followed by a newline only on a
/// terminal.
pub fn detokenize(args: &DetokenizeArgs) -> Result<()> {
    let ids = crate::common::parse_ids(&args.ids.join(","))?;
    let tok = load(&args.model)?;
    let bytes = tok.decode_bytes(&ids, true)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let text = String::from_utf8_lossy(&bytes);
        writeln!(out, "{}", serde_json::json!({ "text": text }))?;
    } else {
        out.write_all(&bytes)?;
        if out.is_terminal() {
            writeln!(out)?;
        }
    }
    Ok(())
}
