//! Context shift in the scheduler (`SchedulerConfig::context_shift`) on the tiny llama
//! fixture: a generation longer than the context gives the tokens of a single-sequence
//! loop that shifts its cache with `frink_models::shift` at the same points (greedy and
//! seeded), alone and beside other requests; every shift is counted; without the shift
//! the answer ends at the context; and a shifted slot's rows are never reused by a later
//! request (its answer equals a fresh scheduler's).

mod common;

use std::sync::mpsc;
use std::sync::Arc;

use common::done;
use frink_engine::sampling::{Sampler, SamplingParams};
use frink_engine::scheduler::{Event, Request, Scheduler, SchedulerConfig, SlotAction, SlotReply};
use frink_engine::{FinishReason, FinishRule};
use frink_models::shift::{read_shifted, write_shifted};
use frink_models::{KvPool, KvType, Logits, Model, SeqState, KV_BLOCK};
use frink_tokenizer::Tokenizer;

const N_CTX: usize = 64;

fn fixture() -> Option<(std::path::PathBuf, Vec<u32>)> {
    let dir = frink_testdata::require("fixtures/tiny/llama", "context shift")?;
    let ids = frink_testdata::fixture_input_ids(&dir);
    Some((dir.join("model.gguf"), ids))
}

fn start(path: &std::path::Path, parallel: usize, shift: bool) -> Scheduler {
    let model = Model::load(path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    Scheduler::start(
        model,
        tok,
        SchedulerConfig {
            parallel,
            n_ctx: N_CTX,
            queue: 16,
            kv_type: KvType::F16,
            prefill_chunk: 7,
            prefill_chunk_alone: 7,
            context_shift: shift,
            ..SchedulerConfig::default()
        },
    )
}

fn params(seed: Option<u64>) -> SamplingParams {
    match seed {
        Some(seed) => SamplingParams {
            seed,
            ..SamplingParams::default()
        },
        None => SamplingParams::greedy(),
    }
}

fn request(
    prompt: &[u32],
    seed: Option<u64>,
    n: usize,
    keep: usize,
) -> (Request, mpsc::Receiver<Event>) {
    let (mut req, rx) = common::request(prompt, params(seed), n);
    req.n_keep = keep;
    (req, rx)
}

fn eval(model: &Model, pool: &mut KvPool, st: &mut SeqState, tokens: &[u32]) -> Vec<f32> {
    model
        .forward_pooled(pool, st, tokens, Logits::Last)
        .unwrap()
}

/// The reference: one sequence decoding `n` tokens; when its cache is full it keeps
/// `keep` positions and moves the newest back by `(N_CTX - keep) / 2`, in a new block
/// table (the kept positions evaluated again: they depend only on their own tokens).
fn reference(model: &Model, prompt: &[u32], seed: Option<u64>, n: usize, keep: usize) -> Vec<u32> {
    let c = &model.config;
    let blocks = N_CTX / KV_BLOCK;
    // A table per epoch between shifts (at most 7 here).
    let mut pool = KvPool::new(c, 8 * blocks, KvType::F16);
    let table = |epoch: usize| {
        (epoch * blocks..(epoch + 1) * blocks)
            .map(|b| b as u32)
            .collect()
    };
    let mut st = SeqState::pooled(c, N_CTX, &pool);
    *st.table_mut() = table(0);
    let mut epoch = 0;
    let mut sampler = Sampler::new(params(seed));
    // As the request's `ignore_eos` does.
    FinishRule {
        max_tokens: Some(n),
        ignore_eos: true,
    }
    .prepare(
        &mut sampler,
        Tokenizer::from_gguf(&model.file)
            .unwrap()
            .eog_ids()
            .iter()
            .copied(),
    );
    for &t in prompt {
        sampler.accept(t);
    }
    let mut cache: Vec<u32> = prompt.to_vec();
    let mut logits = eval(model, &mut pool, &mut st, prompt);
    let mut out = Vec::new();
    while out.len() < n {
        let id = sampler.sample(&logits);
        sampler.accept(id);
        out.push(id);
        if out.len() == n {
            break;
        }
        if st.n_past() == N_CTX {
            let discard = (N_CTX - keep) / 2;
            let from = keep + discard;
            let rows = read_shifted(model, &pool, &st, from, N_CTX - from, discard);
            epoch += 1;
            let mut next = SeqState::pooled(c, N_CTX, &pool);
            *next.table_mut() = table(epoch);
            if keep > 0 {
                eval(model, &mut pool, &mut next, &cache[..keep]);
            }
            write_shifted(&mut pool, &mut next, &rows);
            cache.drain(keep..from);
            st = next;
        }
        cache.push(id);
        logits = eval(model, &mut pool, &mut st, &[id]);
    }
    out
}

#[test]
fn shifted_generations_match_the_reference_alone_and_beside_others() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let prompt = &ids[..20];
    let sched = start(&path, 3, true);
    let mut shifts = 0;
    for (seed, keep) in [(None, 0), (None, 5), (Some(7), 1), (Some(9), 20)] {
        let n = 150;
        let want = reference(&model, prompt, seed, n, keep);
        // Each shift drops (64 - keep) / 2 positions.
        let per = (N_CTX - keep) / 2;
        let expected_shifts = (prompt.len() + n - 1 - N_CTX).div_ceil(per);
        let (req, rx) = request(prompt, seed, n, keep);
        sched.submit(req).unwrap();
        let c = done(&rx);
        assert_eq!(c.ids, want, "alone, seed {seed:?} keep {keep}");
        assert_eq!(c.finish_reason, FinishReason::Length);
        shifts += expected_shifts;
        assert_eq!(sched.metrics().context_shifts as usize, shifts);
        // Beside two others (one shifting too, one short).
        let other = frink_testdata::spread_ids(model.config.n_vocab, 2, 30);
        let (a, ra) = request(&other[3..30], Some(3), 120, 2);
        let (b, rb) = request(&other[5..12], Some(4), 10, 0);
        sched.submit(a).unwrap();
        let (req, rx) = request(prompt, seed, n, keep);
        sched.submit(req).unwrap();
        sched.submit(b).unwrap();
        assert_eq!(
            done(&rx).ids,
            want,
            "beside others, seed {seed:?} keep {keep}"
        );
        assert_eq!(done(&ra).ids.len(), 120);
        assert_eq!(done(&rb).ids.len(), 10);
        shifts = sched.metrics().context_shifts as usize;
    }
}

#[test]
fn without_the_shift_the_answer_ends_at_the_context() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    let sched = start(&path, 1, false);
    let (req, rx) = request(&ids[..20], None, 150, 0);
    sched.submit(req).unwrap();
    let c = done(&rx);
    assert_eq!(c.finish_reason, FinishReason::Length);
    assert_eq!(
        c.ids.len(),
        N_CTX - 20 + 1,
        "the context's last token is sampled, not fed"
    );
    assert_eq!(sched.metrics().context_shifts, 0);
}

#[test]
fn a_shifted_slot_is_never_reused() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    // A shifted answer, then a request whose prompt is the shifted cache's first tokens
    // and more: its answer must be what a fresh scheduler gives (nothing reused past the
    // kept positions).
    let sched = start(&path, 1, true);
    let (req, rx) = request(&ids[..20], None, 100, 4);
    sched.submit(req).unwrap();
    let first = done(&rx);
    // Saving it keeps only the positions before the shifts (the kept 4).
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("shifted.state");
    match sched.slot(0, SlotAction::Save(file)).unwrap() {
        SlotReply::Saved { n_tokens, .. } => assert_eq!(n_tokens, 4),
        other => panic!("{other:?}"),
    }
    // What its cache holds at the end: the prompt and every answer token but the last,
    // with the shifts' drops.
    let mut follow: Vec<u32> = ids[..20].to_vec();
    for &id in &first.ids[..first.ids.len() - 1] {
        if follow.len() == N_CTX {
            follow.drain(4..4 + (N_CTX - 4) / 2);
        }
        follow.push(id);
    }
    follow.push(ids[0]);
    let (req, rx) = request(&follow, None, 8, 0);
    sched.submit(req).unwrap();
    let again = done(&rx);
    assert!(
        again.cached_tokens <= 4,
        "reused {} positions",
        again.cached_tokens
    );
    let fresh = start(&path, 1, true);
    let (req, rx) = request(&follow, None, 8, 0);
    fresh.submit(req).unwrap();
    assert_eq!(again.ids, done(&rx).ids);
}
