//! The continuous-batching scheduler on the tiny llama fixture: a request's tokens are the
//! same alone, beside others, with any prefill chunk and with a reused prompt prefix, and
//! equal to the single-sequence generation loop; a request whose receiver is gone is dropped.

mod common;

use std::sync::mpsc;
use std::sync::Arc;

use frink_engine::sampling::{Sampler, SamplingParams};
use frink_engine::scheduler::{
    Completion, Event, FailureKind, PromptError, Request, RequestError, Scheduler, SchedulerConfig,
};
use frink_engine::{generate, Flow, GenerateParams, Session};
use frink_models::{KvType, Model};
use frink_tokenizer::Tokenizer;

fn fixture() -> Option<(std::path::PathBuf, Vec<u32>)> {
    let dir = frink_testdata::require("fixtures/tiny/llama", "scheduler tests")?;
    let ids = frink_testdata::fixture_input_ids(&dir);
    Some((dir.join("model.gguf"), ids))
}

fn start(path: &std::path::Path, parallel: usize, chunk: usize) -> Scheduler {
    start_ctx(path, parallel, chunk, 64)
}

fn start_ctx(path: &std::path::Path, parallel: usize, chunk: usize, n_ctx: usize) -> Scheduler {
    start_with(
        path,
        SchedulerConfig {
            parallel,
            n_ctx,
            queue: 16,
            kv_type: KvType::F16,
            prefill_chunk: chunk,
            prefill_chunk_alone: chunk,
            ..SchedulerConfig::default()
        },
    )
}

fn start_with(path: &std::path::Path, config: SchedulerConfig) -> Scheduler {
    let model = Model::load(path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    Scheduler::start(model, tok, config)
}

/// `parallel` slots of at most `n_ctx` positions on a pool of 640 (40 blocks), prompts
/// fed 7 tokens a step: a pool the preemption tests exhaust.
fn start_small_pool(path: &std::path::Path, parallel: usize, n_ctx: usize) -> Scheduler {
    start_with(
        path,
        SchedulerConfig {
            parallel,
            n_ctx,
            kv_size: 640,
            queue: 16,
            kv_type: KvType::F16,
            prefill_chunk: 7,
            prefill_chunk_alone: 7,
            ..SchedulerConfig::default()
        },
    )
}

/// Submits a request per prompt (seeds `seed0`, `seed0 + 1`, …; up to 1000 tokens) and
/// returns their receivers in order.
fn submit_all(sched: &Scheduler, prompts: &[Vec<u32>], seed0: u64) -> Vec<mpsc::Receiver<Event>> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (req, rx) = request(p, seed0 + i as u64, 1000);
            sched.submit(req).unwrap();
            rx
        })
        .collect()
}

fn params(seed: u64) -> SamplingParams {
    SamplingParams {
        seed,
        ..SamplingParams::default()
    }
}

/// The model's end-of-generation ids (what `ignore_eos` bans).
fn eog(model: &Model) -> std::collections::HashSet<u32> {
    Tokenizer::from_gguf(&model.file)
        .unwrap()
        .eog_ids()
        .iter()
        .copied()
        .collect()
}

fn request(prompt: &[u32], seed: u64, n: usize) -> (Request, mpsc::Receiver<Event>) {
    let (mut req, rx) = common::request(prompt, params(seed), n);
    req.top_logprobs = Some(2);
    (req, rx)
}

fn done(rx: &mpsc::Receiver<Event>) -> Completion {
    common::done(rx)
}

#[test]
fn tokens_do_not_depend_on_batching_chunking_or_prefix_reuse() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    // The reference: the single-sequence generation loop of `frink run`.
    let model = Model::load(&path).unwrap();
    let mut session = Session::new(&model, 64, KvType::F16);
    let mut sampler = Sampler::new(params(5));
    let want = generate(
        &mut session,
        &ids[..20],
        &mut sampler,
        &GenerateParams {
            ignore_eos: true,
            max_tokens: 12,
            eog: eog(&model),
            speculation: None,
            ..Default::default()
        },
        |_| Flow::Continue,
    )
    .unwrap()
    .ids;

    for (parallel, chunk) in [(1, 512), (4, 3), (4, 512)] {
        let sched = start(&path, parallel, chunk);
        let (req, rx) = request(&ids[..20], 5, 12);
        sched.submit(req).unwrap();
        assert_eq!(done(&rx).ids, want, "alone, chunk {chunk}");
        // Beside three others with other prompts and seeds, submitted first.
        let others: Vec<_> = (0..3)
            .map(|i| {
                let (req, rx) = request(&ids[i..i + 10 + 3 * i], i as u64, 8 + i);
                sched.submit(req).unwrap();
                rx
            })
            .collect();
        let (req, rx) = request(&ids[..20], 5, 12);
        sched.submit(req).unwrap();
        let c = done(&rx);
        assert_eq!(
            c.ids, want,
            "beside others, parallel {parallel}, chunk {chunk}"
        );
        for (i, o) in others.iter().enumerate() {
            assert_eq!(done(o).ids.len(), 8 + i);
        }
        // A prompt that extends one a free slot holds reuses it, with the same tokens.
        let (req, rx) = request(&ids[..20], 5, 12);
        sched.submit(req).unwrap();
        let c = done(&rx);
        assert_eq!(c.ids, want);
        assert_eq!(c.cached_tokens, 19, "all but the last prompt token reused");
        let m = sched.metrics();
        assert_eq!(m.requests_finished, 6);
        assert_eq!(m.slots_busy, 0);
    }
}

#[test]
fn a_request_whose_receiver_is_gone_is_dropped() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    let sched = start(&path, 1, 512);
    let (req, rx) = request(&ids[..8], 1, 40);
    sched.submit(req).unwrap();
    // Wait for the first token, then leave.
    assert!(matches!(rx.recv().unwrap(), Event::Delta { .. }));
    drop(rx);
    // The slot is free again: the next request runs to its end.
    let (req, rx) = request(&ids[..8], 1, 4);
    sched.submit(req).unwrap();
    assert_eq!(done(&rx).ids.len(), 4);
    // The tiny model may finish the first request's 40 tokens before the scheduler notices
    // the receiver is gone (measured: usually cancelled, once in a CI run finished), so
    // either way it must be accounted for and its slot free; the server tests check the
    // cancellation itself on a real model.
    let m = sched.metrics();
    assert_eq!(m.requests_cancelled + m.requests_finished, 2, "{m:?}");
    assert!(m.requests_finished >= 1, "{m:?}");
    assert_eq!(m.slots_busy, 0, "{m:?}");
}

/// A request sharing a prefix with a busy slot takes that slot's full blocks from the
/// prefix cache and a copy of the part of its next block it shares (copy-on-write: the
/// busy slot keeps writing its own), and gets the same tokens as on a fresh scheduler.
#[test]
fn a_prefix_held_by_a_busy_slot_is_shared_not_recomputed() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    // 40 tokens: the fixture's 24 ids, then its first 16 again.
    let prompt_a: Vec<u32> = ids.iter().chain(&ids[..16]).copied().collect();
    let mut prompt_b = prompt_a[..35].to_vec();
    prompt_b.extend(ids[16..].iter().rev().take(4));
    // 36 tokens in common (the fixture's ids 11 and 23 are both 112): two full blocks
    // and 4 tokens of the third.
    let shared = prompt_a
        .iter()
        .zip(&prompt_b)
        .take_while(|(x, y)| x == y)
        .count();
    assert_eq!(shared, 36);
    let want = {
        let sched = start(&path, 2, 512);
        let (req, rx) = request(&prompt_b, 9, 10);
        sched.submit(req).unwrap();
        let c = done(&rx);
        assert_eq!(c.cached_tokens, 0);
        c.ids
    };
    // A runs up to 4000 tokens (it is still running when B is placed) and is cancelled
    // once B is done. B arrives once A's prompt is in its cache.
    let sched = start_ctx(&path, 2, 512, 4096);
    let (req, rx_a) = request(&prompt_a, 1, 4000);
    sched.submit(req).unwrap();
    assert!(matches!(rx_a.recv().unwrap(), Event::Delta { .. }));
    let (req, rx_b) = request(&prompt_b, 9, 10);
    sched.submit(req).unwrap();
    let b = done(&rx_b);
    assert_eq!(b.ids, want, "tokens after a shared prefix");
    assert_eq!(b.cached_tokens, shared, "the shared blocks are reused");
    drop(rx_a);
    assert_eq!(sched.metrics().prompt_tokens_cached, shared as u64);
}

/// A pool too small for every request at once: requests wait for blocks or are
/// preempted mid-generation (their blocks given to older ones) and evaluated again later,
/// and each gets exactly the tokens it gets alone; none is refused or cut short.
/// Admission keeps room for 256 answer tokens per sequence, so preemption comes from
/// answers longer than that: here each runs to the end of its 400-position context.
#[test]
fn a_small_pool_preempts_and_every_request_keeps_its_tokens() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    const CTX: usize = 400;
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            ids.iter()
                .cycle()
                .skip(i)
                .take(14 + i)
                .map(|&t| t ^ (i as u32 & 1))
                .collect()
        })
        .collect();
    let alone: Vec<Vec<u32>> = {
        let sched = start_ctx(&path, 1, 512, CTX);
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (req, rx) = request(p, 40 + i as u64, 1000);
                sched.submit(req).unwrap();
                let c = done(&rx);
                // The last token is sampled from the logits of position CTX - 1.
                assert_eq!(c.ids.len(), CTX + 1 - p.len(), "request {i} alone");
                c.ids
            })
            .collect()
    };
    // 4 sequences of 400 positions need 100 blocks; the pool has 40 (640 positions):
    // two are placed (17 blocks each, and 16 more for the first's growth), grow past
    // their 256 reserved tokens and the younger is preempted.
    let sched = start_small_pool(&path, 4, CTX);
    let rxs = submit_all(&sched, &prompts, 40);
    for (i, rx) in rxs.iter().enumerate() {
        let c = done(rx);
        assert_eq!(c.ids, alone[i], "request {i}");
    }
    let m = sched.metrics();
    assert!(m.preemptions > 0, "the pool ran out: {m:?}");
    assert_eq!(m.requests_finished, 4);
    assert_eq!((m.kv_blocks_total, m.kv_positions_total), (40, 640));
    assert!(m.kv_blocks_used <= 40);
}

/// The prefix cache: a 48-token prefix shared by four requests is evaluated once (the
/// others reuse its three blocks), a released prefix stays cached until the pool needs
/// its blocks, and other adapters' prefixes are not shared.
#[test]
fn a_shared_prefix_is_evaluated_once() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    let prefix: Vec<u32> = ids.iter().chain(&ids).copied().collect(); // 48
    let prompt = |i: u32| {
        let mut p = prefix.clone();
        p.extend([5 + i, 9 + i]);
        p
    };
    let want: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let sched = start(&path, 1, 512);
            let (req, rx) = request(&prompt(i), 7, 6);
            sched.submit(req).unwrap();
            done(&rx).ids
        })
        .collect();
    let sched = start(&path, 4, 512);
    let mut cached = Vec::new();
    for i in 0..4 {
        let (req, rx) = request(&prompt(i), 7, 6);
        sched.submit(req).unwrap();
        let c = done(&rx);
        assert_eq!(c.ids, want[i as usize], "request {i}");
        cached.push(c.cached_tokens);
    }
    assert_eq!(cached, [0, 48, 48, 48]);
    let m = sched.metrics();
    assert_eq!(m.prompt_tokens_cached, 3 * 48);
    assert!(m.kv_blocks_cached + m.kv_blocks_used >= 3, "{m:?}");
}

/// A prompt the pool cannot hold even empty is refused before anything runs; one that
/// fits runs.
#[test]
fn a_prompt_longer_than_the_pool_is_refused() {
    let Some((path, ids)) = fixture() else {
        return;
    };
    let sched = start_with(
        &path,
        SchedulerConfig {
            parallel: 2,
            n_ctx: 64,
            kv_size: 16,
            ..SchedulerConfig::default()
        },
    );
    let (req, rx) = request(&ids[..20], 1, 4);
    sched.submit(req).unwrap();
    match rx.recv().unwrap() {
        Event::Failed(e) => {
            assert_eq!(
                e,
                RequestError::Prompt(PromptError::Pool {
                    n: 20,
                    positions: 16
                })
            );
            assert_eq!(e.kind(), FailureKind::Request);
        }
        e => panic!("{e:?}"),
    }
    let (req, rx) = request(&ids[..10], 1, 4);
    sched.submit(req).unwrap();
    assert_eq!(done(&rx).ids.len(), 4);
}

/// A constrained request gives the same tokens alone and beside seven others, constrained
/// and free (issue 13's batch invariance): the mask is per sequence and applied before that
/// sequence's own sampler. Every token of a constrained answer is one the grammar allows
/// (the decoded answer matches it), and without the grammar the answer differs (the random
/// fixture's free answer is not lowercase words).
#[test]
fn constrained_requests_are_batch_invariant() {
    use frink_engine::constraint::{Grammar, GrammarCompiler};
    let Some((path, ids)) = fixture() else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    let compiler = GrammarCompiler::new(Arc::clone(&tok)).unwrap();
    let grammar = Grammar::Lark("start: /[a-z]{1,6}( [a-z]{1,6}){0,20}/".into());
    let constrained = |prompt: &[u32], seed: u64, n: usize| {
        let (mut req, rx) = request(prompt, seed, n);
        req.ignore_eos = false;
        req.constraint = Some(compiler.compile(&grammar).unwrap());
        (req, rx)
    };
    let sched = start(&path, 8, 512);
    let (req, rx) = constrained(&ids[..20], 5, 12);
    sched.submit(req).unwrap();
    let alone = done(&rx).ids;
    let text = tok.decode(&alone, false).unwrap();
    let words_only = text.chars().all(|c| c.is_ascii_lowercase() || c == ' ');
    assert!(words_only && !text.is_empty(), "{text:?}");
    let (req, rx) = request(&ids[..20], 5, 12);
    sched.submit(req).unwrap();
    assert_ne!(done(&rx).ids, alone, "the grammar changes the answer");

    let others: Vec<_> = (0..7)
        .map(|i| {
            let prompt = &ids[i..i + 8 + i];
            let (req, rx) = if i % 2 == 0 {
                constrained(prompt, 100 + i as u64, 10)
            } else {
                request(prompt, 100 + i as u64, 10)
            };
            sched.submit(req).unwrap();
            rx
        })
        .collect();
    let (req, rx) = constrained(&ids[..20], 5, 12);
    sched.submit(req).unwrap();
    assert_eq!(done(&rx).ids, alone, "beside seven others");
    for o in &others {
        done(o);
    }
}

/// Checkpoints of a recurrent model's slots: at most `ctx_checkpoints` per slot, within
/// the byte budget (the oldest go first), each at a multiple of the interval or around a
/// prompt's last token; the answers equal a scheduler's without them.
#[test]
fn checkpoints_keep_to_their_count_and_budget() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/lfm2", "checkpoint limits") else {
        return;
    };
    let path = dir.join("model.gguf");
    let run = |ctx_checkpoints: usize, budget: usize| {
        let model = Model::load(&path).unwrap();
        let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
        let sched = Scheduler::start(
            model,
            tok,
            SchedulerConfig {
                parallel: 1,
                n_ctx: 64,
                queue: 4,
                ctx_checkpoints,
                checkpoint_interval: 4,
                checkpoint_budget: budget,
                ..SchedulerConfig::default()
            },
        );
        let prompt: Vec<u32> = (0..30).map(|i| 3 + i * 7).collect();
        let (req, rx) = request(&prompt, 9, 6);
        sched.submit(req).unwrap();
        let ids = done(&rx).ids;
        (ids, sched.metrics())
    };
    let (base, m0) = run(0, 1 << 30);
    assert_eq!((m0.checkpoints, m0.checkpoint_bytes), (0, 0));
    // 30 positions at interval 4: 4, 8, …, 28, then 29 and 30: 9 checkpoints, 3 kept.
    let (ids, m) = run(3, 1 << 30);
    assert_eq!(ids, base);
    assert_eq!(m.checkpoints, 3);
    let one = m.checkpoint_bytes / 3;
    assert!(one > 0);
    // A budget of two checkpoints' bytes keeps two.
    let (ids, m) = run(8, 2 * one);
    assert_eq!(ids, base);
    assert_eq!((m.checkpoints, m.checkpoint_bytes), (2, 2 * one));
}

/// A model with sliding-window layers (the tiny gemma3: window 16, five windowed layers of
/// six) keeps their rows in the pool's window group and gives back the blocks behind each
/// sequence's window: tokens equal the single-sequence loop's (whose state keeps those
/// layers in a ring), alone, beside another request and after a preemption; a shared
/// prefix is reused while the window group still holds its window's blocks, and not after
/// a long answer has reused them (the reused blocks lost their keys).
#[test]
fn a_windowed_model_keeps_its_tokens_while_giving_window_blocks_back() {
    let Some(dir) = frink_testdata::require("fixtures/tiny/gemma3", "sliding-window scheduler")
    else {
        return;
    };
    let path = dir.join("model.gguf");
    let ids = frink_testdata::fixture_input_ids(&dir);
    const CTX: usize = 400;
    let model = Model::load(&path).unwrap();
    assert_eq!(model.config.plan.window(), 16);
    let reference = |prompt: &[u32], seed: u64, n: usize| {
        let mut session = Session::new(&model, CTX, KvType::F16);
        let mut sampler = Sampler::new(params(seed));
        generate(
            &mut session,
            prompt,
            &mut sampler,
            &GenerateParams {
                // As the scheduler's requests (`request`): end-of-generation tokens banned.
                ignore_eos: true,
                max_tokens: n,
                eog: eog(&model),
                speculation: None,
                ..Default::default()
            },
            |_| Flow::Continue,
        )
        .unwrap()
        .ids
    };
    let prefix: Vec<u32> = ids.iter().chain(&ids).copied().take(48).collect();
    let prompt = |i: u32| {
        let mut p = prefix.clone();
        p.extend([5 + i, 9 + i]);
        p
    };
    // One slot: 25 main blocks, a window group of 19 (18 + 1).
    let sched = start_ctx(&path, 1, 512, CTX);
    let run = |i: u32, n: usize| {
        let (req, rx) = request(&prompt(i), 7, n);
        sched.submit(req).unwrap();
        let c = done(&rx);
        assert_eq!(
            c.ids,
            reference(&prompt(i), 7, n),
            "request {i}, {n} tokens"
        );
        c.cached_tokens
    };
    assert_eq!(run(0, 6), 0);
    // The window blocks of positions 32..48 are still the slot's: a hit.
    assert_eq!(run(1, 6), 48);
    // A long answer cycles through more window blocks than the group has: the prefix's
    // window blocks are reused for later positions, so the next request recomputes it.
    assert_eq!(run(2, CTX - 50), 48);
    assert_eq!(run(3, 6), 0, "the prefix's window blocks were reused");
    let m = sched.metrics();
    assert_eq!((m.kv_blocks_total, m.kv_window_blocks_total), (25, 19));
    assert!(m.kv_window_blocks_held <= 18, "{m:?}");
    drop(sched);

    // Two slots on 40 main blocks (640 positions): three 400-position requests preempt;
    // the window group (2 × 18 + 1 = 37 blocks) is never short.
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(10 + i)).collect();
    let sched = start_small_pool(&path, 2, CTX);
    let rxs = submit_all(&sched, &prompts, 50);
    for (i, rx) in rxs.iter().enumerate() {
        let c = done(rx);
        let want = reference(&prompts[i], 50 + i as u64, CTX - prompts[i].len() + 1);
        assert_eq!(c.ids, want, "request {i}");
    }
    let m = sched.metrics();
    assert!(m.preemptions > 0, "the pool ran out: {m:?}");
    assert_eq!(m.requests_finished, 3);
    assert_eq!((m.kv_blocks_total, m.kv_window_blocks_total), (40, 37));
}

/// The one prompt-length rule: a prompt must leave a position in the context and in the
/// pool; which limit it passes is named.
#[test]
fn the_prompt_limit_names_the_limit_a_prompt_passes() {
    use frink_engine::scheduler::{PromptError, PromptLimit};
    let l = PromptLimit {
        n_ctx: 100,
        kv_positions: 64,
    };
    assert_eq!(l.check(0), Err(PromptError::Empty));
    assert_eq!(l.check(63), Ok(()));
    assert_eq!(
        l.check(64),
        Err(PromptError::Pool {
            n: 64,
            positions: 64
        })
    );
    assert_eq!(
        l.check(100),
        Err(PromptError::Context { n: 100, n_ctx: 100 })
    );
    let cfg = SchedulerConfig {
        parallel: 2,
        n_ctx: 40,
        ..SchedulerConfig::default()
    };
    // The pool of 2 x 40 positions, in whole blocks.
    assert_eq!(
        cfg.prompt_limit(),
        PromptLimit {
            n_ctx: 40,
            kv_positions: 80usize.div_ceil(frink_models::KV_BLOCK) * frink_models::KV_BLOCK
        }
    );
}
