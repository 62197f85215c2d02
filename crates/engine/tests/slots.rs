//! Slot operations (`Scheduler::slot`): a slot saved to a state file and restored into
//! another scheduler (a new process's) gives the continuation the first one gives,
//! bitwise, reusing the saved tokens (greedy and seeded; attention, windowed and
//! recurrent fixtures); a state of another model or KV type is refused naming the
//! difference; 50 damaged files give errors and leave the scheduler working; busy and
//! unknown slots are refused; erase forgets.

mod common;

use std::path::Path;
use std::sync::Arc;

use frink_engine::sampling::SamplingParams;
use frink_engine::scheduler::{
    Completion, Scheduler, SchedulerConfig, SlotAction, SlotError, SlotReply,
};
use frink_models::{KvType, Model};
use frink_tokenizer::Tokenizer;

fn start(path: &Path, kv_type: KvType) -> Scheduler {
    start_with(
        path,
        SchedulerConfig {
            parallel: 2,
            n_ctx: 96,
            queue: 16,
            kv_type,
            prefill_chunk: 11,
            prefill_chunk_alone: 11,
            ..SchedulerConfig::default()
        },
    )
}

fn start_with(path: &Path, config: SchedulerConfig) -> Scheduler {
    let model = Model::load(path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    Scheduler::start(model, tok, config)
}

fn run(sched: &Scheduler, prompt: &[u32], seed: Option<u64>, n: usize) -> Completion {
    let sampling = match seed {
        Some(seed) => SamplingParams {
            seed,
            ..SamplingParams::default()
        },
        None => SamplingParams::greedy(),
    };
    let (req, rx) = common::request(prompt, sampling, n);
    sched.submit(req).unwrap();
    common::done(&rx)
}

/// The slot holding tokens (the one a request ran in).
fn used_slot(sched: &Scheduler) -> usize {
    match sched.slot(0, SlotAction::List).unwrap() {
        SlotReply::List(l) => l.iter().find(|s| s.n_tokens > 0).unwrap().id,
        other => panic!("{other:?}"),
    }
}

fn fixture(name: &str) -> Option<std::path::PathBuf> {
    Some(frink_testdata::require(&format!("fixtures/tiny/{name}"), "slots")?.join("model.gguf"))
}

#[test]
fn a_restored_slot_continues_as_the_saved_one() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["llama", "gemma3", "mamba", "falcon_h1"] {
        let Some(path) = fixture(name) else {
            return;
        };
        let model = Model::load(&path).unwrap();
        let prompt = frink_testdata::spread_ids(model.config.n_vocab, 4, 40);
        drop(model);
        for seed in [None, Some(11)] {
            let file = tmp.path().join(format!("{name}-{seed:?}.state"));
            let a = start(&path, KvType::F16);
            let first = run(&a, &prompt, seed, 12);
            let slot = used_slot(&a);
            let saved = match a.slot(slot, SlotAction::Save(file.clone())).unwrap() {
                SlotReply::Saved {
                    n_tokens, n_bytes, ..
                } => {
                    assert_eq!(n_bytes as u64, std::fs::metadata(&file).unwrap().len());
                    n_tokens
                }
                other => panic!("{other:?}"),
            };
            // The prompt and every answer token but the last (sampled, not evaluated).
            assert_eq!(saved, 40 + 11, "{name}");
            // The conversation goes on: its next prompt extends what the slot holds.
            let mut next: Vec<u32> = prompt.clone();
            next.extend(&first.ids);
            next.extend(&prompt[..5]);
            let want = run(&a, &next, seed, 10);
            drop(a);

            let b = start(&path, KvType::F16);
            // Restored into the other slot: the request finds it whatever slot it gets.
            match b.slot(1, SlotAction::Restore(file.clone())).unwrap() {
                SlotReply::Restored { n_tokens, .. } => assert_eq!(n_tokens, saved),
                other => panic!("{other:?}"),
            }
            let got = run(&b, &next, seed, 10);
            assert_eq!(got.ids, want.ids, "{name} {seed:?}: restored continuation");
            assert_eq!(got.cached_tokens, saved, "{name} {seed:?}: reuse");
            // Without the restore nothing is reused, and the tokens are the same.
            let cold = start(&path, KvType::F16);
            let c = run(&cold, &next, seed, 10);
            assert_eq!(c.cached_tokens, 0);
            assert_eq!(c.ids, want.ids);
        }
    }
}

#[test]
fn states_of_other_models_and_kv_types_and_damaged_files_are_refused() {
    let (Some(llama), Some(qwen)) = (fixture("llama"), fixture("qwen2")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("s.state");
    let a = start(&llama, KvType::F16);
    let prompt: Vec<u32> = (1..30).collect();
    run(&a, &prompt, None, 4);
    let slot = used_slot(&a);
    a.slot(slot, SlotAction::Save(file.clone())).unwrap();
    // Busy and unknown slots.
    assert!(matches!(
        a.slot(7, SlotAction::Erase),
        Err(SlotError::NoSuchSlot { id: 7, last: 1 })
    ));
    let refused = |s: &Scheduler, f: &Path| match s.slot(0, SlotAction::Restore(f.to_path_buf())) {
        Err(e) => e.to_string(),
        Ok(r) => panic!("restored: {r:?}"),
    };
    let e = refused(&start(&llama, KvType::F32), &file);
    assert!(e.contains("KV cache type f16, not f32"), "{e}");
    let e = refused(&start(&qwen, KvType::F16), &file);
    assert!(e.contains("another model"), "{e}");
    let missing = refused(&a, &tmp.path().join("none.state"));
    assert!(missing.contains("none.state"), "{missing}");

    // 50 damaged copies: cut short, bytes flipped, garbage.
    let bytes = std::fs::read(&file).unwrap();
    let b = start(&llama, KvType::F16);
    for k in 0..50usize {
        let mut d = bytes.clone();
        match k % 5 {
            0 => d.truncate(k * d.len() / 50),
            1 => d[k * 97 % bytes.len()] ^= 0x40,
            2 => d[8 + k % 8] = 0xff,
            3 => d = (0..k * 31).map(|i| (i * 7 + k) as u8).collect(),
            _ => d.extend_from_slice(&[0; 7]),
        }
        let f = tmp.path().join(format!("bad{k}.state"));
        std::fs::write(&f, &d).unwrap();
        let e = refused(&b, &f);
        assert!(!e.is_empty());
    }
    // The scheduler still answers, and the good file restores.
    b.slot(0, SlotAction::Restore(file.clone())).unwrap();
    let mut next = prompt.clone();
    next.push(3);
    assert_eq!(run(&b, &next, None, 3).cached_tokens, 29);
    // Erase forgets what a slot holds.
    let slot = used_slot(&b);
    match b.slot(slot, SlotAction::Erase).unwrap() {
        SlotReply::Erased { n_tokens } => assert!(n_tokens > 0),
        other => panic!("{other:?}"),
    }
}

/// A state longer than a sliding window's group holds (its early blocks given back)
/// restores into a pool whose window group could not hold all of its positions.
#[test]
fn a_long_windowed_state_restores() {
    let Some(path) = fixture("gemma3") else {
        return;
    };
    let config = SchedulerConfig {
        parallel: 1,
        n_ctx: 1024,
        queue: 4,
        kv_type: KvType::F16,
        ..SchedulerConfig::default()
    };
    let n_vocab = Model::load(&path).unwrap().config.n_vocab;
    let prompt = frink_testdata::spread_ids(n_vocab, 8, 600);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("w.state");
    let a = start_with(&path, config.clone());
    let first = run(&a, &prompt, None, 4);
    a.slot(0, SlotAction::Save(file.clone())).unwrap();
    let mut next = prompt.clone();
    next.extend(&first.ids);
    let want = run(&a, &next, None, 6);
    let b = start_with(&path, config);
    b.slot(0, SlotAction::Restore(file)).unwrap();
    let got = run(&b, &next, None, 6);
    assert_eq!(got.ids, want.ids);
    assert_eq!(got.cached_tokens, 603);
}

/// Files with a valid checksum but values that are not finite, links and FIFOs are
/// refused before anything is read into the pool.
#[test]
fn non_finite_states_links_and_fifos_are_refused() {
    let Some(path) = fixture("llama") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("s.state");
    let a = start(&path, KvType::F16);
    run(&a, &(1..30).collect::<Vec<u32>>(), None, 4);
    let slot = used_slot(&a);
    a.slot(slot, SlotAction::Save(file.clone())).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let (header, tokens, payload) = frink_engine::state_file::decode(&bytes).unwrap();
    // Every f16 value +infinity, the checksum made anew.
    let inf: Vec<u8> = payload
        .chunks(2)
        .flat_map(|_| 0x7c00u16.to_le_bytes())
        .collect();
    let poisoned = tmp.path().join("inf.state");
    std::fs::write(
        &poisoned,
        frink_engine::state_file::encode(&header, &tokens, &inf),
    )
    .unwrap();
    let e = a
        .slot(0, SlotAction::Restore(poisoned))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not finite"), "{e}");
    let zero = tmp.path().join("zero.state");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let e = a
        .slot(0, SlotAction::Restore(zero))
        .unwrap_err()
        .to_string();
    assert!(e.contains("symbolic link"), "{e}");
    let fifo = tmp.path().join("fifo.state");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()));
    let e = a
        .slot(0, SlotAction::Restore(fifo))
        .unwrap_err()
        .to_string();
    assert!(e.contains("regular file"), "{e}");
    // Saving over a link replaces the link, never writes its target.
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, b"keep").unwrap();
    let link = tmp.path().join("link.state");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    a.slot(slot, SlotAction::Save(link)).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
}
