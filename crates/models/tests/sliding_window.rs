//! Layers with a sliding window keep only their window's rows, and every logit keeps the
//! bits of the full layout: for each tiny fixture with windowed layers (gemma2, gemma3,
//! gpt-oss, mistral; window 16 or 8; llama4, chunks of 8; gemma4, window 8 with layers
//! that read an earlier layer's cache) and f32/f16/Q8_0 caches, 520
//! positions evaluated in steps of 1 to 300 rows (a step longer than the ring takes is split by
//! `Model::forward`) give the same logits
//! - in a state of its own, whose windowed layers are a ring of
//!   `window_blocks(window, WINDOW_STEP)` blocks (18 for a window of 16: 288 rows of 544),
//! - in a pool without a window group (every layer's rows kept; the pooled layout is
//!   bit-identical to the contiguous one, tests/kv_pool.rs), and
//! - in a pool with a window group of 21 blocks (the longest step and its window), where the blocks behind the window are
//!   given back after each step and handed out again (out of order) for later positions.
//!
//! A state cut back behind what its window still holds is not reusable there (one cut
//! within it, or a copy of its prefix, continues with the same logits), and a window
//! table missing a needed block is refused, not read.

use frink_models::{
    window_blocks, KvPool, KvType, Logits, Model, ModelError, SeqState, Sequence, EVICTED,
    KV_BLOCK, WINDOW_STEP,
};

const CTX: usize = 544;
/// Step sizes, cycled: single rows, blocks crossed mid-step, a step longer than the ring.
const STEPS: [usize; 8] = [37, 1, 1, 300, 16, 3, 1, 100];
const LEN: usize = 520;

fn windowed_models() -> Vec<(String, Model)> {
    let mut out = Vec::new();
    if let Some(t) = frink_testdata::require("fixtures/tiny", "sliding-window KV") {
        for name in ["gemma2", "gemma3", "gpt_oss", "mistral", "llama4", "gemma4"] {
            let m = Model::load(t.join(name).join("model.gguf")).unwrap();
            assert!(m.config.plan.window() > 0, "{name} has windowed layers");
            out.push((name.to_string(), m));
        }
    }
    out
}

/// The step sizes that evaluate `len` positions.
fn steps(len: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut done = 0;
    for &s in STEPS.iter().cycle() {
        if done == len {
            break;
        }
        let s = s.min(len - done);
        out.push(s);
        done += s;
    }
    out
}

/// Logits of every position, evaluated in `steps(LEN)` in a state of its own.
fn own(model: &Model, kv: KvType, tokens: &[u32]) -> (Vec<f32>, SeqState) {
    let mut st = SeqState::new(&model.config, CTX, kv);
    let mut out = Vec::new();
    let mut p = 0;
    for s in steps(tokens.len()) {
        out.extend(
            model
                .forward(&mut st, &tokens[p..p + s], Logits::All)
                .unwrap(),
        );
        p += s;
    }
    (out, st)
}

/// The same in a pool: without a window group (`window_group` 0) every block kept; with
/// one, the window blocks behind each step's window given back and reused.
fn pooled(model: &Model, kv: KvType, tokens: &[u32], window_group: usize) -> Vec<f32> {
    let c = &model.config;
    let window = c.plan.window();
    let n_blocks = CTX / KV_BLOCK;
    let mut pool = KvPool::with_window_group(c, n_blocks, window_group, kv);
    let mut st = SeqState::pooled(c, CTX, &pool);
    *st.table_mut() = (0..n_blocks as u32).collect();
    // Window blocks handed out from the end of the free list; given back to its end.
    let mut free: Vec<u32> = (0..window_group as u32).collect();
    let mut out = Vec::new();
    let mut p = 0usize;
    for s in steps(tokens.len()) {
        // Rows a query at p or later can see start at p + 1 - window: blocks wholly
        // before that go back.
        let first_needed = (p + 1).saturating_sub(window) / KV_BLOCK;
        if let Some(t) = st.window_table_mut() {
            for e in t.iter_mut().take(first_needed) {
                if *e != EVICTED {
                    free.push(*e);
                    *e = EVICTED;
                }
            }
            while t.len() < (p + s).div_ceil(KV_BLOCK) {
                t.push(free.pop().expect("the window group holds the window"));
            }
        }
        let mut seqs = [Sequence {
            state: &mut st,
            tokens: &tokens[p..p + s],
            logits: Logits::All,
            lora: None,
            embd: &[],
            rope_shift: 0,
            token_types: &[],
        }];
        for piece in model.forward_batch_in(Some(&mut pool), &mut seqs).unwrap() {
            out.extend(piece);
        }
        p += s;
    }
    out
}

#[test]
fn windowed_layers_keep_only_their_window_with_the_same_logits() {
    let mut checked = 0;
    for (name, model) in windowed_models() {
        let c = &model.config;
        let window = c.plan.window();
        let ring = window_blocks(window, WINDOW_STEP);
        for kv in frink_testdata::KV_TYPES.map(|t| t.parse::<KvType>().unwrap()) {
            if kv.check_heads(c).is_err() {
                continue;
            }
            let tokens = frink_testdata::spread_ids(c.n_vocab, 3, LEN);
            let want = pooled(&model, kv, &tokens, 0);
            let (got, st) = own(&model, kv, &tokens);
            assert!(got == want, "{name} {kv:?}: the ring changed the logits");
            // The ring holds `ring` blocks per windowed layer instead of CTX positions (each
            // layer with a cache of its own, rows of its own widths).
            let expected: usize = c
                .plan
                .layers
                .iter()
                .filter_map(|l| {
                    let (kd, vd) = l.mixer.kv_dims(c.n_head_kv)?;
                    let rows = match l.mixer.window() > 0 {
                        true => ring * KV_BLOCK,
                        false => CTX,
                    };
                    Some(kv.row_bytes(kd, vd).unwrap() * rows)
                })
                .sum();
            assert_eq!(st.bytes(), expected, "{name}: ring bytes");
            assert_eq!(
                SeqState::kv_bytes(c, CTX, kv),
                Some(st.bytes()),
                "{name}: kv_bytes counts the ring"
            );
            // What the longest step and its window span (21 blocks for a window of 16).
            let group = window_blocks(window, *STEPS.iter().max().unwrap());
            let got = pooled(&model, kv, &tokens, group);
            assert!(
                got == want,
                "{name} {kv:?}: the window group changed the logits"
            );
            checked += 1;
        }
    }
    if checked > 0 {
        assert!(checked >= 8, "{checked} model × KV type pairs");
    }
}

#[test]
fn a_cut_behind_the_window_is_refused_not_read() {
    for (name, model) in windowed_models() {
        let c = &model.config;
        let window = c.plan.window();
        let tokens = frink_testdata::spread_ids(c.n_vocab, 5, LEN);
        let (_, mut st) = own(&model, KvType::F32, &tokens);
        // The ring overwrote the first positions: a cut to 40 cannot be reused (its window
        // rows are gone), a cut a few rows back can.
        assert_eq!(st.reusable(40), 0, "{name}");
        assert_eq!(st.reusable(LEN - 5), LEN - 5, "{name}");
        // Reusing from there gives the logits of the full evaluation, in the state itself
        // and in a copy of its prefix (the ring copied whole).
        let (want, _) = own(&model, KvType::F32, &tokens);
        let mut copy = SeqState::new(c, CTX, KvType::F32);
        copy.copy_prefix(&st, LEN - 5);
        let resumed = model
            .forward(&mut copy, &tokens[LEN - 5..], Logits::All)
            .unwrap();
        assert!(resumed == want[(LEN - 5) * c.n_vocab..], "{name}: copied");
        assert_eq!(st.truncate(LEN - 5), LEN - 5);
        let again = model
            .forward(&mut st, &tokens[LEN - 5..], Logits::All)
            .unwrap();
        assert!(again == want[(LEN - 5) * c.n_vocab..], "{name}: resumed");
        // A step longer than the ring takes is refused by the batched pass (the
        // one-sequence pass splits it).
        let mut fresh = SeqState::new(c, CTX, KvType::F32);
        let long = frink_testdata::spread_ids(c.n_vocab, 6, fresh.max_step() + 1);
        let mut seqs = [Sequence {
            state: &mut fresh,
            tokens: &long,
            logits: Logits::Last,
            lora: None,
            embd: &[],
            rope_shift: 0,
            token_types: &[],
        }];
        assert!(matches!(
            model.forward_batch(&mut seqs),
            Err(ModelError::WindowStep { .. })
        ));
        // A pooled window table whose needed block was given back: refused before writing.
        let pool = KvPool::with_window_group(c, CTX / KV_BLOCK, 8, KvType::F32);
        let mut st = SeqState::pooled(c, CTX, &pool);
        st.adopt((0..(CTX / KV_BLOCK) as u32).collect(), 3 * KV_BLOCK + 1);
        let t = st.window_table_mut().unwrap();
        *t = vec![EVICTED, EVICTED, EVICTED, 0, 1, 2];
        let mut pool = pool;
        let mut seqs = [Sequence {
            state: &mut st,
            tokens: &tokens[..1],
            logits: Logits::Last,
            lora: None,
            embd: &[],
            rope_shift: 0,
            token_types: &[],
        }];
        let r = model.forward_batch_in(Some(&mut pool), &mut seqs);
        assert!(
            matches!(r, Err(ModelError::WindowRows { .. })),
            "{name} (window {window}): {r:?}"
        );
        assert_eq!(st.n_past(), 3 * KV_BLOCK + 1, "nothing written");
    }
}
