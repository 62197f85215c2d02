//! Which metadata keys frink reads, and proof that the others change nothing.
//!
//! Every reference file (the tiny fixtures of `../shared/fixtures/tiny` and the three
//! catalog models) is loaded as `frink run` loads it: the model, then its tokenizer and
//! chat template. [`GgufFile::keys_looked_up`] then says which keys were asked for. From
//! that:
//! * docs/architectures.md's "Metadata keys" table is generated and must match it (so it cannot
//!   drift from the code; `FRINK_BLESS=1` rewrites it): per architecture the `{arch}.*` keys read, the `general.*` and
//!   `tokenizer.*` keys read, and the keys the files hold that nothing reads.
//! * Each key a fixture holds and frink does not read is rewritten (numbers to 0, 7 and
//!   2^31 − 1, strings to another string, bools flipped; arrays are left) and the
//!   logits and tokenization must stay bit-identical: a reader that bypassed
//!   [`GgufFile::get`] would break this. Measured: all identical (the changed values
//!   reach no computation); the test fails if, say, the tokenizer read `general.name`
//!   without the lookup being seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use frink_gguf::{GgufFile, GgufWriter, MetaValue};
use frink_models::{KvType, Logits, Model, SeqState};
use frink_tokenizer::Tokenizer;

/// What a run of the reference file at `path` computes: first logits of `ids` and the
/// tokens of a sample text; `None` for an architecture frink refuses.
fn run(file: GgufFile, ids: &[u32]) -> Option<(Vec<f32>, Vec<u32>, BTreeSet<String>)> {
    let model = Model::from_gguf(file).ok()?;
    let tok = Tokenizer::from_gguf(&model.file).expect("the reference files have tokenizers");
    let text = tok
        .encode("Hello, world! 123 <|im_start|> ünïcödé", true, true)
        .unwrap();
    let mut state = SeqState::new(&model.config, 8, KvType::F32);
    let logits = model.forward(&mut state, ids, Logits::All).unwrap();
    Some((logits, text, model.file.keys_looked_up()))
}

/// The reference files: (name, path, input ids, whether it is a tiny fixture).
fn references() -> Vec<(String, PathBuf, Vec<u32>, bool)> {
    let mut out = Vec::new();
    if let Some(root) = frink_testdata::require("fixtures/tiny", "metadata key accounting") {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        dirs.sort();
        for dir in dirs {
            let ids = frink_testdata::fixture_input_ids(&dir)[..4].to_vec();
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, dir.join("model.gguf"), ids, true));
        }
    }
    let store = frink_store::Store::from_env().unwrap();
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        out.push((
            name.into(),
            store.resolve(name).unwrap(),
            vec![1, 2, 3, 4],
            false,
        ));
    }
    out
}

/// `key` with the file's architecture prefix written `{arch}.`.
fn generic(key: &str, arch: &str) -> String {
    match key.strip_prefix(&format!("{arch}.")) {
        Some(rest) => format!("{{arch}}.{rest}"),
        None => key.to_string(),
    }
}

/// The docs/architectures.md block: the `{arch}.*` keys every architecture reads, each one's others, the
/// shared keys, and those held by a reference file that nothing reads.
fn table(
    read: &BTreeMap<String, BTreeSet<String>>,
    shared: &BTreeSet<String>,
    unread: &BTreeSet<String>,
) -> String {
    let list = |keys: &mut dyn Iterator<Item = &String>| {
        keys.map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let common: BTreeSet<String> = read
        .values()
        .fold(None, |acc: Option<BTreeSet<String>>, keys| {
            Some(match acc {
                None => keys.clone(),
                Some(a) => a.intersection(keys).cloned().collect(),
            })
        })
        .unwrap_or_default();
    let mut s = format!(
        "Read on every architecture: {}; and {}.\n\n",
        list(
            &mut common
                .iter()
                .map(|k| format!("{{arch}}.{k}"))
                .collect::<Vec<_>>()
                .iter()
        ),
        list(&mut shared.iter())
    );
    s += "| architecture | its other `{arch}.*` keys |\n|---|---|\n";
    for (arch, keys) in read {
        s += &format!("| {arch} | {} |\n", list(&mut keys.difference(&common)));
    }
    s += &format!(
        "\nHeld by a reference file and read by no architecture (changing them changes nothing): {}.\n",
        list(&mut unread.iter())
    );
    s
}

/// Where docs/architectures.md's block between the `metadata-keys` markers lies: (its text, start,
/// end).
fn readme_block(readme: &Path) -> (String, usize, usize) {
    let text = std::fs::read_to_string(readme).unwrap();
    let (begin, end) = (
        "<!-- metadata-keys:begin -->\n",
        "<!-- metadata-keys:end -->",
    );
    let a = text
        .find(begin)
        .expect("docs/architectures.md has the metadata-keys block")
        + begin.len();
    let b = text[a..].find(end).expect("the block is closed") + a;
    (text, a, b)
}

/// The values an unread key is rewritten to.
fn rewrites(v: &MetaValue) -> Vec<MetaValue> {
    match v {
        MetaValue::String(s) => vec![MetaValue::String(format!("{s}-changed"))],
        MetaValue::Bool(b) => vec![MetaValue::Bool(!b)],
        MetaValue::U32(_) => [0, 7, (1 << 31) - 1].map(MetaValue::U32).to_vec(),
        MetaValue::I32(_) => [0, 7, -1].map(MetaValue::I32).to_vec(),
        MetaValue::U64(_) => [0, 7, (1 << 31) - 1].map(MetaValue::U64).to_vec(),
        MetaValue::F32(_) => [0.0, 7.0, f32::NAN].map(MetaValue::F32).to_vec(),
        _ => Vec::new(),
    }
}

#[test]
fn readme_lists_the_metadata_keys_read_and_unread_keys_change_nothing() {
    let mut read: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut shared = BTreeSet::new();
    let mut unread = BTreeSet::new();
    let mut rewritten = 0;
    for (name, path, ids, fixture) in references() {
        let file = GgufFile::open(&path).unwrap();
        let arch = file.architecture().unwrap().to_string();
        let present: Vec<(String, MetaValue)> = file.metadata().to_vec();
        let Some((logits, tokens, looked_up)) = run(file, &ids) else {
            continue; // an architecture frink refuses (its own test says so)
        };
        for key in &looked_up {
            match key.strip_prefix(&format!("{arch}.")) {
                Some(rest) => {
                    read.entry(arch.clone())
                        .or_default()
                        .insert(rest.to_string());
                }
                None => {
                    shared.insert(key.clone());
                }
            }
        }
        // The fixtures are small enough to rewrite whole; the catalog models' unread keys
        // are the same kinds of keys.
        for (key, value) in present.iter().filter(|(k, _)| !looked_up.contains(k)) {
            unread.insert(generic(key, &arch));
            if !fixture {
                continue;
            }
            let original = GgufFile::open(&path).unwrap();
            for v in rewrites(value) {
                let mut w = GgufWriter::from_file(&original).unwrap();
                w.add_metadata(key.clone(), v.clone());
                let variant = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
                let (l, t, _) = run(variant, &ids).unwrap();
                assert!(
                    l == logits && t == tokens,
                    "{name}: {key} = {v} is never looked up but changed the output"
                );
                rewritten += 1;
            }
        }
    }
    eprintln!(
        "{} architectures, {} unread keys, {rewritten} rewrites of unread keys: all identical",
        read.len(),
        unread.len()
    );
    let read_anywhere: BTreeSet<String> = read
        .values()
        .flatten()
        .map(|k| format!("{{arch}}.{k}"))
        .chain(shared.iter().cloned())
        .collect();
    let unread: BTreeSet<String> = unread.difference(&read_anywhere).cloned().collect();
    let want = table(&read, &shared, &unread);
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architectures.md");
    let (text, a, b) = readme_block(&readme);
    if std::env::var_os("FRINK_BLESS").is_some() {
        std::fs::write(&readme, format!("{}{want}{}", &text[..a], &text[b..])).unwrap();
    }
    assert!(
        text[a..b] == want || std::env::var_os("FRINK_BLESS").is_some(),
        "docs/architectures.md's metadata-keys block is out of date; it should read:\n{want}"
    );
}
