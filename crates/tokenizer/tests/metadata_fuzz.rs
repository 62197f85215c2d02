//! Hostile tokenizer metadata on the catalog models' vocabularies: every integer and
//! boolean `tokenizer.ggml.*` key set to edge values (token ids 0, the last id, one past
//! it, 2^31 − 1; both booleans), and the parallel arrays cut short by one: each variant
//! builds a tokenizer that encodes, decodes and renders the chat template without panic,
//! or is refused with an error (typed, naming what is wrong).

use std::panic::{catch_unwind, AssertUnwindSafe};

use frink_gguf::{GgufFile, MetaArray, MetaValue};
use frink_tokenizer::{ChatMessage, Tokenizer};

fn exercise(file: &GgufFile) -> Result<(), String> {
    let tok = Tokenizer::from_gguf(file).map_err(|e| e.to_string())?;
    let ids = tok
        .encode("Hello, wörld! <|im_start|> 12345", true, true)
        .map_err(|e| e.to_string())?;
    if let Some(id) = ids.iter().find(|&&id| id as usize >= tok.n_vocab()) {
        return Err(format!(
            "BAD: encoded id {id} outside the vocabulary of {}",
            tok.n_vocab()
        ));
    }
    tok.decode(&ids, true).map_err(|e| e.to_string())?;
    let _ = tok.apply_template(None, &[ChatMessage::new("user", "hi")], true);
    Ok(())
}

#[test]
fn hostile_tokenizer_metadata_is_refused_or_harmless() {
    let store = frink_store::Store::from_env().unwrap();
    let (mut cases, mut refused) = (0, 0);
    let mut bad = Vec::new();
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        let path = store.resolve(name).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let n_vocab = match file.get("tokenizer.ggml.tokens") {
            Some(MetaValue::Array(MetaArray::String(t))) => t.len() as u64,
            _ => panic!("{name}: no token list"),
        };
        let mut variants: Vec<(String, MetaValue)> = Vec::new();
        for (k, v) in file.metadata() {
            if !k.starts_with("tokenizer.ggml.") {
                continue;
            }
            match v {
                MetaValue::U32(_) | MetaValue::I32(_) | MetaValue::U64(_) => {
                    for x in [0u64, n_vocab - 1, n_vocab, (1 << 31) - 1] {
                        let value = match v {
                            MetaValue::U32(_) => MetaValue::U32(x as u32),
                            MetaValue::I32(_) => MetaValue::I32(x as i32),
                            _ => MetaValue::U64(x),
                        };
                        variants.push((k.clone(), value));
                    }
                    if let MetaValue::I32(_) = v {
                        variants.push((k.clone(), MetaValue::I32(-1)));
                    }
                }
                MetaValue::Bool(b) => variants.push((k.clone(), MetaValue::Bool(!b))),
                // A parallel array one short (or a string list with one unknown merge).
                MetaValue::Array(MetaArray::I32(a)) if a.len() > 1 => variants.push((
                    k.clone(),
                    MetaValue::Array(MetaArray::I32(a[..a.len() - 1].to_vec())),
                )),
                MetaValue::Array(MetaArray::F32(a)) if a.len() > 1 => variants.push((
                    k.clone(),
                    MetaValue::Array(MetaArray::F32(a[..a.len() - 1].to_vec())),
                )),
                MetaValue::Array(MetaArray::String(a))
                    if k.ends_with(".merges") && !a.is_empty() =>
                {
                    let mut m = a.clone();
                    m.push("zzzunknown qqqunknown".into());
                    variants.push((k.clone(), MetaValue::Array(MetaArray::String(m))));
                }
                _ => {}
            }
        }
        for (key, value) in variants {
            cases += 1;
            let mut f = GgufFile::open(&path).unwrap();
            f.set_metadata(&key, value.clone());
            match catch_unwind(AssertUnwindSafe(|| exercise(&f))) {
                Err(_) => bad.push(format!("{name}: {key} = {value}: panic")),
                Ok(Err(e)) if e.starts_with("BAD") => {
                    bad.push(format!("{name}: {key} = {value}: {e}"))
                }
                Ok(Err(_)) => refused += 1,
                Ok(Ok(())) => {}
            }
        }
    }
    eprintln!(
        "{cases} tokenizer variants: {refused} refused, {} bad",
        bad.len()
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
