//! The prefix cache's disk tier (`SchedulerConfig::cache_disk`) on the tiny llama
//! fixture: blocks evicted from a small pool are read back from disk by a later prompt
//! that starts with them (counted as cached), with the tokens of a cold evaluation; they
//! survive a new scheduler on the same folder; damaged block files, and files copied into
//! the folder of another KV type whose blocks have the same size, are misses, never wrong
//! tokens; without the tier nothing is reused.

mod common;

use std::path::Path;
use std::sync::Arc;

use frink_engine::sampling::SamplingParams;
use frink_engine::scheduler::{Completion, Scheduler, SchedulerConfig};
use frink_models::{KvType, Model};
use frink_tokenizer::Tokenizer;

fn start(path: &Path, disk: Option<&Path>) -> Scheduler {
    start_with(path, disk, KvType::F16)
}

fn start_with(path: &Path, disk: Option<&Path>, kv_type: KvType) -> Scheduler {
    let model = Model::load(path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    Scheduler::start(
        model,
        tok,
        SchedulerConfig {
            parallel: 1,
            n_ctx: 96,
            kv_size: 96,
            queue: 4,
            kv_type,
            prompt_lookup: false,
            cache_disk: disk.map(|d| (d.to_path_buf(), 1 << 30)),
            ..SchedulerConfig::default()
        },
    )
}

fn run(sched: &Scheduler, prompt: &[u32]) -> Completion {
    let (req, rx) = common::request(prompt, SamplingParams::greedy(), 6);
    sched.submit(req).unwrap();
    common::done(&rx)
}

#[test]
fn evicted_blocks_come_back_from_disk() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/llama", "cache disk") else {
        return;
    };
    let path = dir.join("model.gguf");
    let n_vocab = Model::load(&path).unwrap().config.n_vocab;
    let a = frink_testdata::spread_ids(n_vocab, 1, 70);
    let b = frink_testdata::spread_ids(n_vocab, 2, 70);
    let cold = run(&start(&path, None), &a).ids;
    let tmp = tempfile::tempdir().unwrap();

    // Without the tier: b's prompt takes a's blocks, and a is evaluated again.
    let plain = start(&path, None);
    run(&plain, &a);
    run(&plain, &b);
    assert_eq!(run(&plain, &a).cached_tokens, 0);

    let s = start(&path, Some(tmp.path()));
    assert_eq!(run(&s, &a).ids, cold);
    run(&s, &b);
    let again = run(&s, &a);
    assert_eq!(again.ids, cold, "tokens from disk blocks");
    assert_eq!(again.cached_tokens, 64, "a's four full blocks from disk");
    let m = s.metrics();
    assert_eq!(m.cache_disk_hits, 4);
    assert!(m.cache_disk_bytes > 0);
    drop(s);

    // A new scheduler on the same folder reads them too.
    let s = start(&path, Some(tmp.path()));
    run(&s, &b);
    let c = run(&s, &a);
    assert_eq!((c.ids, c.cached_tokens), (cold.clone(), 64));
    drop(s);

    // The f16 blocks copied into the bf16 cache's folder (the same bytes per block) are
    // misses there, and deleted.
    let f16_dir = walk(tmp.path())[0].parent().unwrap().to_path_buf();
    let name = f16_dir.file_name().unwrap().to_str().unwrap();
    let bf16_dir = f16_dir.with_file_name(name.replace("-f16", "-bf16"));
    std::fs::create_dir_all(&bf16_dir).unwrap();
    for f in walk(&f16_dir) {
        std::fs::copy(&f, bf16_dir.join(f.file_name().unwrap())).unwrap();
    }
    let bf16 = KvType::both(frink_models::CacheType::BF16);
    let cold_bf16 = run(&start_with(&path, None, bf16), &a).ids;
    let s = start_with(&path, Some(tmp.path()), bf16);
    let c = run(&s, &a);
    assert_eq!((c.ids, c.cached_tokens), (cold_bf16, 0));
    assert!(
        walk(&bf16_dir).len() < walk(&f16_dir).len(),
        "the copies were dropped"
    );
    drop(s);

    // Damaged files are misses: the same tokens, evaluated again.
    let mut damaged = 0;
    for e in walk(tmp.path()) {
        let mut bytes = std::fs::read(&e).unwrap();
        let k = bytes.len() / 2;
        bytes[k] ^= 1;
        std::fs::write(&e, bytes).unwrap();
        damaged += 1;
    }
    assert!(damaged >= 4, "{damaged} block files");
    let s = start(&path, Some(tmp.path()));
    let d = run(&s, &a);
    assert_eq!((d.ids, d.cached_tokens), (cold, 0));
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "blk") {
            out.push(p);
        }
    }
    out
}
