//! Speculative decoding never changes the answer: with prompt lookup, a proposer that is
//! always right, one that is always wrong and one that proposes noise, greedy and seeded
//! sampled generations (penalties on) give exactly the tokens, finish reason and session
//! state of plain decoding, on the catalog models and on tiny fixtures, over prompts where
//! proposals are accepted and rejected.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use frink_engine::sampling::{Sampler, SamplingParams};
use frink_engine::scheduler::{Completion, Event, Scheduler, SchedulerConfig, TokenLogprob};
use frink_engine::{
    generate_with, DraftModel, Flow, GenerateParams, Generation, NgramLookup, Propose, Session,
    SpecSampling,
};
use frink_models::{KvType, Logits, Model};
use frink_tokenizer::Tokenizer;

/// Proposes the plain answer's next tokens (right) or, with `wrong`, each of them plus
/// one (never the model's choice when that choice is the plain answer's).
struct Oracle {
    prompt_len: usize,
    plain: Vec<u32>,
    wrong: bool,
    n_vocab: u32,
}

impl Propose for Oracle {
    fn propose(&mut self, h: &[u32], max: usize) -> Vec<u32> {
        let done = h.len() - self.prompt_len;
        self.plain
            .iter()
            .skip(done)
            .take(max)
            .map(|&t| {
                if self.wrong {
                    (t + 1) % self.n_vocab
                } else {
                    t
                }
            })
            .collect()
    }
}

/// Deterministic noise: `max` pseudo-random ids, a different run each call.
struct Noise(u64, u32);

impl Propose for Noise {
    fn propose(&mut self, _: &[u32], max: usize) -> Vec<u32> {
        (0..max)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                (self.0 % self.1 as u64) as u32
            })
            .collect()
    }
}

/// One generation of `n` tokens after `prompt`, and the logits of one more token
/// evaluated on the session afterwards (the state it was left in).
fn run(
    model: &Model,
    prompt: &[u32],
    n: usize,
    sampling: &SamplingParams,
    proposer: Option<(&mut dyn Propose, usize)>,
) -> (Generation, Vec<f32>) {
    run_mode(model, prompt, n, sampling, proposer, SpecSampling::Exact)
}

/// [`run`] with proposals accepted by `mode`.
fn run_mode(
    model: &Model,
    prompt: &[u32],
    n: usize,
    sampling: &SamplingParams,
    proposer: Option<(&mut dyn Propose, usize)>,
    mode: SpecSampling,
) -> (Generation, Vec<f32>) {
    let mut s = Session::new(model, prompt.len() + n + 2, KvType::F16);
    let mut sampler = Sampler::new(sampling.clone());
    let params = GenerateParams {
        ignore_eos: false,
        max_tokens: n,
        eog: HashSet::new(),
        speculation: None,
        spec_sampling: mode,
    };
    let g = generate_with(&mut s, prompt, &mut sampler, &params, proposer, |_| {
        Flow::Continue
    })
    .unwrap();
    let after = s.eval(&[1], Logits::Last).unwrap();
    (g, after)
}

/// A prompt that repeats itself (so that lookup proposes, and is sometimes right).
fn repetitive(model: &Model, len: usize) -> Vec<u32> {
    let v = model.config.n_vocab as u32;
    let phrase: Vec<u32> = (0..23u32).map(|i| (i * 7919 + 101) % v).collect();
    (0..len)
        .map(|i| phrase[(i * 5 / 4) % phrase.len()] ^ u32::from(i % 37 == 0))
        .collect()
}

/// The models, each with how many of the seeded configurations it runs (the catalog
/// models two, to keep the test short; the fixtures all five).
fn models() -> Vec<(String, Model, usize)> {
    let mut out = Vec::new();
    let store = frink_store::Store::from_env().unwrap();
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let m = Model::load(store.resolve(name).unwrap()).unwrap();
        out.push((name.to_string(), m, 2));
    }
    if let Some(t) = frink_testdata::require("fixtures/tiny", "speculation exactness") {
        for f in ["llama", "gemma3", "qwen2_moe"] {
            let m = Model::load(t.join(f).join("model.gguf")).unwrap();
            out.push((f.to_string(), m, 5));
        }
    }
    out
}

/// Greedy without penalties.
fn greedy() -> SamplingParams {
    let mut greedy = SamplingParams::greedy();
    greedy.repeat_penalty = 1.0;
    greedy
}

/// Sampled at temperature 0.9 with repeat and presence penalties, from `seed`.
fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        repeat_penalty: 1.1,
        presence_penalty: 0.2,
        seed,
        ..SamplingParams::default()
    }
}

#[test]
fn speculation_gives_the_tokens_of_plain_decoding() {
    let mut configs = vec![("greedy".to_string(), greedy())];
    for seed in 1..=5u64 {
        configs.push((format!("seed {seed}"), seeded(seed)));
    }
    let n = 32;
    let mut accepted_runs = 0;
    for (name, model, seeds) in models() {
        let nv = model.config.n_vocab as u32;
        let prompt = repetitive(&model, 120);
        for (cname, sampling) in configs.iter().take(1 + seeds) {
            let (plain, plain_after) = run(&model, &prompt, n, sampling, None);
            let mut lookup = NgramLookup::default();
            let mut right = Oracle {
                prompt_len: prompt.len(),
                plain: plain.ids.clone(),
                wrong: false,
                n_vocab: nv,
            };
            let mut wrong = Oracle {
                wrong: true,
                plain: plain.ids.clone(),
                ..right
            };
            let mut noise = Noise(0x9E37_79B9_7F4A_7C15, nv);
            let proposers: [(&str, &mut dyn Propose, usize); 5] = [
                ("lookup", &mut lookup, 7),
                ("lookup k=3", &mut NgramLookup::default(), 3),
                ("right", &mut right, 7),
                ("wrong", &mut wrong, 7),
                ("noise", &mut noise, 5),
            ];
            for (pname, p, k) in proposers {
                let (g, after) = run(&model, &prompt, n, sampling, Some((p, k)));
                assert_eq!(g.ids, plain.ids, "{name} {cname} {pname}: tokens");
                assert_eq!(
                    g.finish_reason, plain.finish_reason,
                    "{name} {cname} {pname}"
                );
                assert!(
                    after == plain_after,
                    "{name} {cname} {pname}: session state"
                );
            }
            // The lookup proposed something right at least once on these prompts.
            let right_from_lookup = {
                let mut count = 0;
                let mut hist = prompt.clone();
                for &t in &plain.ids {
                    if NgramLookup::default().propose(&hist, 1).first() == Some(&t) {
                        count += 1;
                    }
                    hist.push(t);
                }
                count
            };
            if right_from_lookup > 0 {
                accepted_runs += 1;
            }
        }
    }
    eprintln!("{accepted_runs} runs where prompt lookup proposed a token the model then chose");
    assert!(accepted_runs > 0);
}

/// What a scheduler request ended with: its completion, the text it streamed and its
/// log-probability entries.
fn collect(rx: &std::sync::mpsc::Receiver<Event>) -> (Completion, String, Vec<TokenLogprob>) {
    let (mut text, mut lps) = (String::new(), Vec::new());
    loop {
        match rx.recv().expect("an event") {
            Event::Delta { text: t, tokens } => {
                text += &t;
                lps.extend(tokens);
            }
            Event::Done(c) => return (c, text, lps),
            Event::Failed(e) => panic!("{e}"),
            Event::Embedding(_) => {}
        }
    }
}

/// One request of [`the_scheduler_speculates_beside_seven_other_streams`].
struct Case {
    name: &'static str,
    sampling: SamplingParams,
    max_tokens: usize,
    prediction: Option<Vec<u32>>,
    stop: Vec<String>,
}

/// Runs `cases` together (all submitted at once, one slot each) on a scheduler with
/// `draft_max` proposals a step and room for them beside every other stream, and the
/// draft model at `draft` (instead of prompt lookup) if given, proposals accepted by
/// `spec_sampling`.
fn run_together(
    path: &std::path::Path,
    prompt: &[u32],
    cases: &[Case],
    draft_max: usize,
    draft: Option<&std::path::Path>,
    spec_sampling: SpecSampling,
) -> (
    Vec<(Completion, String, Vec<TokenLogprob>)>,
    frink_engine::scheduler::MetricsSnapshot,
) {
    let model = Model::load(path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    let draft =
        draft.map(|p| frink_engine::load_draft_model(p, &tok, frink_models::KvType::F16).unwrap());
    let sched = Scheduler::start_with_draft(
        model,
        draft,
        tok,
        SchedulerConfig {
            parallel: cases.len(),
            n_ctx: 256,
            queue: 16,
            kv_type: KvType::F16,
            prompt_lookup: true,
            draft_max,
            spec_rows: 64,
            // Proposals verified whatever this machine's step times.
            spec_adaptive: false,
            draft_p_min: 0.0,
            spec_sampling,
            ..SchedulerConfig::default()
        },
    );
    let rxs: Vec<_> = cases
        .iter()
        .map(|c| {
            let (mut req, rx) = common::request(prompt, c.sampling.clone(), c.max_tokens);
            req.stop = c.stop.clone();
            req.top_logprobs = Some(2);
            req.prediction = c.prediction.clone();
            sched.submit(req).unwrap();
            rx
        })
        .collect();
    let out = rxs.iter().map(collect).collect();
    (out, sched.metrics())
}

/// Through the continuous-batching scheduler, eight streams at once: prompt lookup, a
/// prediction that is the answer, one wrong after its first token, one right for its first half,
/// seeded sampling with penalties, `max_tokens` shorter than an accepted run and a stop
/// string inside one give exactly the tokens, text, finish reasons and log-probabilities
/// (one entry per token) of the same requests without speculation, and those equal the
/// single-sequence loop's. Proposals are verified (and accepted, and rejected) beside the
/// seven others.
#[test]
fn the_scheduler_speculates_beside_seven_other_streams() {
    let mut paths = Vec::new();
    let store = frink_store::Store::from_env().unwrap();
    // (gemma3-270m's window of 512 is longer than these answers: the tiny gemma3's is
    // not.)
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        paths.push((name.to_string(), store.resolve(name).unwrap()));
    }
    if let Some(t) = frink_testdata::require("fixtures/tiny", "scheduler speculation") {
        for f in ["llama", "gemma3"] {
            paths.push((f.to_string(), t.join(f).join("model.gguf")));
        }
    }
    let n = 24;
    for (name, path) in paths {
        let model = Model::load(&path).unwrap();
        let tok = Tokenizer::from_gguf(&model.file).unwrap();
        let nv = model.config.n_vocab as u32;
        let prompt = repetitive(&model, 120);
        let greedy = greedy();
        // As the scheduler's requests here (`ignore_eos`): end-of-generation tokens banned.
        let banned = |s: &SamplingParams| {
            let mut s = s.clone();
            s.logit_bias
                .extend(tok.eog_ids().iter().map(|&t| (t, f32::NEG_INFINITY)));
            s
        };
        let plain = |s: &SamplingParams, n| run(&model, &prompt, n, &banned(s), None).0.ids;
        let g = plain(&greedy, n);
        let s1 = plain(&seeded(1), n);
        let wrong = |ids: &[u32]| ids.iter().map(|&t| (t + 1) % nv).collect::<Vec<u32>>();
        // Right at its first token only (a prediction is followed from where the answer
        // meets it: an answer that never does gets no proposals).
        let mut wrong_after_first = vec![g[0]];
        wrong_after_first.extend(wrong(&g[1..]));
        let mut half = g[..n / 2].to_vec();
        half.extend(wrong(&g[n / 2..]));
        // A stop string in the middle of the answer (the text of tokens 12 and 13).
        let stop = tok.decode(&g[12..14], false).unwrap();
        let case = |name, sampling: &SamplingParams, max_tokens, prediction| Case {
            name,
            sampling: sampling.clone(),
            max_tokens,
            prediction,
            stop: Vec::new(),
        };
        let mut cases = vec![
            case("lookup", &greedy, n, None),
            case("right", &greedy, n, Some(g.clone())),
            case("wrong", &greedy, n, Some(wrong_after_first)),
            case("half right", &greedy, n, Some(half)),
            case("seeded right", &seeded(1), n, Some(s1.clone())),
            case("seeded lookup", &seeded(2), n, None),
            case("short budget", &greedy, 5, Some(g.clone())),
            case("stop", &greedy, n, Some(g.clone())),
        ];
        if !stop.trim().is_empty() {
            cases[7].stop = vec![stop.clone()];
        }
        let (off, _) = run_together(&path, &prompt, &cases, 0, None, SpecSampling::Exact);
        let (on, m) = run_together(&path, &prompt, &cases, 7, None, SpecSampling::Exact);
        // The model as its own draft model (mostly right; the predictions still win).
        let (drafted, dm) =
            run_together(&path, &prompt, &cases, 7, Some(&path), SpecSampling::Exact);
        for (c, (a, b)) in cases.iter().zip(off.iter().zip(&drafted)) {
            let what = format!("{name} {} with a draft model", c.name);
            assert_eq!(b.0.ids, a.0.ids, "{what}: tokens");
            assert_eq!(b.0.finish_reason, a.0.finish_reason, "{what}");
            assert_eq!(b.1, a.1, "{what}: text");
            assert_eq!(b.2, a.2, "{what}: log-probabilities");
        }
        eprintln!(
            "{name} drafting for itself: {} of {} accepted (greedy: {:?})",
            dm.spec_accepted,
            dm.spec_proposed,
            (drafted[0].0.proposed, drafted[0].0.accepted)
        );
        assert!(
            drafted[0].0.accepted > 0,
            "{name}: the greedy self-draft is taken"
        );
        assert_eq!(
            drafted[0].0.accepted, drafted[0].0.proposed,
            "{name}: greedy self-draft"
        );
        for (c, (a, b)) in cases.iter().zip(off.iter().zip(&on)) {
            let what = format!("{name} {}", c.name);
            assert_eq!(b.0.ids, a.0.ids, "{what}: tokens");
            assert_eq!(b.0.finish_reason, a.0.finish_reason, "{what}");
            assert_eq!(b.1, a.1, "{what}: text");
            assert_eq!(b.2, a.2, "{what}: log-probabilities");
            assert_eq!(b.2.len(), b.0.ids.len(), "{what}: one entry per token");
            assert_eq!((a.0.proposed, a.0.accepted), (0, 0), "{what}: off");
        }
        // Without speculation the scheduler gives the single-sequence loop's tokens.
        assert_eq!(off[0].0.ids, g, "{name}: greedy");
        assert_eq!(off[4].0.ids, s1, "{name}: seeded");
        assert_eq!(off[6].0.ids, g[..5], "{name}: short budget");
        // Proposals were verified, taken and refused beside the others.
        let c = |i: usize| (on[i].0.proposed, on[i].0.accepted);
        eprintln!(
            "{name}: proposed/accepted lookup {:?} right {:?} wrong {:?} half {:?} seeded {:?} short {:?} stop {:?}",
            c(0), c(1), c(2), c(3), c(4), c(6), c(7)
        );
        assert!(
            c(1).1 >= n / 2,
            "{name}: a right prediction is mostly taken"
        );
        assert!(
            c(2).0 > c(2).1,
            "{name}: a wrong prediction is verified, not taken"
        );
        assert!(c(3).1 > 0 && c(3).0 > c(3).1, "{name}: half right");
        assert!(c(4).1 > 0, "{name}: a seeded answer's prediction is taken");
        assert!(m.spec_accepted > 0 && m.spec_proposed > m.spec_accepted);
        if !cases[7].stop.is_empty() {
            assert_eq!(on[7].0.finish_reason, frink_engine::FinishReason::Stop);
            assert!(
                !on[7].1.contains(&stop),
                "{name}: the stop string is not sent"
            );
        }
    }
}

/// A draft model's proposals (`--draft-model`) never change the answer: for target/draft
/// pairs of one vocabulary (a model drafting for itself, mostly right; another
/// architecture, mostly wrong), greedy and seeded generations with penalties give exactly
/// the plain tokens, finish reason and session state; the self-draft's proposals are
/// accepted, and a draft of another vocabulary is refused naming the difference.
#[test]
fn a_draft_model_gives_the_tokens_of_plain_decoding() {
    let store = frink_store::Store::from_env().unwrap();
    let mut pairs: Vec<(String, std::path::PathBuf, std::path::PathBuf)> = Vec::new();
    let smol = store.resolve("smollm2-135m").unwrap();
    pairs.push(("smollm2 by itself".into(), smol.clone(), smol.clone()));
    let tiny = frink_testdata::require("fixtures/tiny", "draft-model speculation");
    if let Some(t) = &tiny {
        let f = |n: &str| t.join(n).join("model.gguf");
        pairs.push(("llama by mistral".into(), f("llama"), f("mistral")));
        pairs.push(("qwen2 by qwen3".into(), f("qwen2"), f("qwen3")));
        pairs.push(("qwen2 by itself".into(), f("qwen2"), f("qwen2")));
    }
    let mut configs = vec![greedy()];
    configs.extend((1..=5u64).map(seeded));
    let n = 32;
    for (name, target, draft) in pairs {
        let model = Model::load(&target).unwrap();
        let draft_model = Model::load(&draft).unwrap();
        let tok = Tokenizer::from_gguf(&model.file).unwrap();
        let dtok = Tokenizer::from_gguf(&draft_model.file).unwrap();
        frink_engine::check_same_vocabulary(&tok, &dtok).unwrap_or_else(|e| panic!("{name}: {e}"));
        let prompt = repetitive(&model, 120);
        let (mut proposed, mut accepted) = (0, 0);
        for (c, sampling) in configs.iter().enumerate() {
            let (plain, plain_after) = run(&model, &prompt, n, sampling, None);
            for p_min in [0.0, 0.75] {
                let mut d = DraftModel::new(&draft_model, prompt.len() + n + 2, KvType::F16);
                d.p_min = p_min;
                let (g, after) = run(&model, &prompt, n, sampling, Some((&mut d, 7)));
                assert_eq!(g.ids, plain.ids, "{name} config {c} p_min {p_min}: tokens");
                assert_eq!(g.finish_reason, plain.finish_reason, "{name} config {c}");
                assert!(after == plain_after, "{name} config {c}: session state");
                proposed += g.proposed;
                accepted += g.accepted;
                if c == 0 && name.ends_with("itself") {
                    // Greedy: the draft's choice is the model's own.
                    assert_eq!(
                        g.accepted, g.proposed,
                        "{name} p_min {p_min}: greedy self-draft"
                    );
                }
            }
        }
        eprintln!("{name}: {accepted} of {proposed} proposals accepted");
        assert!(proposed > 0, "{name}: the draft proposed");
        if name.ends_with("itself") {
            assert!(accepted > 0, "{name}: proposals were accepted");
        }
    }
    if let Some(t) = &tiny {
        let tok = |n: &str| {
            let m = Model::load(t.join(n).join("model.gguf")).unwrap();
            Tokenizer::from_gguf(&m.file).unwrap()
        };
        let e = frink_engine::check_same_vocabulary(&tok("llama"), &tok("qwen2")).unwrap_err();
        assert!(e.contains("BOS"), "{e}");
        let e = frink_engine::check_same_vocabulary(&tok("llama"), &tok("llama_q256")).unwrap_err();
        assert!(e.contains("384") && e.contains("512"), "{e}");
    }
}

/// `--spec-sampling rejection` (Leviathan et al.'s rule, `Sampler::try_sample_proposed`)
/// with a draft that samples from the model's own chain (`DraftModel::sample_with`): the
/// draft's distribution is the model's to the bit (batch invariance), so every proposal
/// is taken (`p(d) / q(d) = 1`), where exact match takes only those its own draw repeats
/// (one run, seeds 1-3, temperature 0.9: exact match took 42 of 153 proposals on
/// smollm2, 8 of 248 on the tiny qwen2; rejection all). Exact match with that draft gives
/// plain decoding's tokens, and greedy settings give them under rejection too.
#[test]
fn rejection_sampling_takes_every_proposal_of_a_model_sampling_for_itself() {
    let store = frink_store::Store::from_env().unwrap();
    let mut paths = vec![(
        "smollm2-135m".to_string(),
        store.resolve("smollm2-135m").unwrap(),
    )];
    if let Some(t) = frink_testdata::require("fixtures/tiny", "rejection sampling") {
        paths.push(("qwen2".into(), t.join("qwen2").join("model.gguf")));
    }
    let n = 32;
    for (name, path) in paths {
        let model = Model::load(&path).unwrap();
        let prompt = repetitive(&model, 60);
        let draft = |sampling: &SamplingParams| {
            let mut d = DraftModel::new(&model, prompt.len() + n + 2, KvType::F16);
            d.p_min = 0.0;
            d.sample_with(sampling);
            d
        };
        let (mut exact_proposed, mut exact_taken) = (0, 0);
        for seed in 1..=3u64 {
            let sampling = SamplingParams {
                temperature: 0.9,
                seed,
                ..SamplingParams::default()
            };
            let mut d = draft(&sampling);
            let (g, _) = run_mode(
                &model,
                &prompt,
                n,
                &sampling,
                Some((&mut d, 7)),
                SpecSampling::Rejection,
            );
            assert!(g.proposed > 0, "{name} seed {seed}: proposed");
            assert_eq!(g.accepted, g.proposed, "{name} seed {seed}: q = p");
            assert_eq!(g.ids.len(), n);
            let (plain, plain_after) = run(&model, &prompt, n, &sampling, None);
            let mut d = draft(&sampling);
            let (g, after) = run(&model, &prompt, n, &sampling, Some((&mut d, 7)));
            assert_eq!(g.ids, plain.ids, "{name} seed {seed}: exact match's tokens");
            assert!(after == plain_after, "{name} seed {seed}: session state");
            exact_proposed += g.proposed;
            exact_taken += g.accepted;
        }
        eprintln!("{name}: exact match took {exact_taken} of {exact_proposed}");
        assert!(
            exact_taken < exact_proposed,
            "{name}: exact match rejects some"
        );
        let (plain, _) = run(&model, &prompt, n, &greedy(), None);
        let mut noise = Noise(7, model.config.n_vocab as u32);
        let (g, _) = run_mode(
            &model,
            &prompt,
            n,
            &greedy(),
            Some((&mut noise, 7)),
            SpecSampling::Rejection,
        );
        assert_eq!(g.ids, plain.ids, "{name}: greedy under rejection");
    }
}

/// A draft ends with an end-of-generation token: nothing after one is proposed (it would
/// never be verified: generation ends there).
#[test]
fn a_draft_stops_at_an_end_of_generation_token() {
    let store = frink_store::Store::from_env().unwrap();
    let model = Model::load(store.resolve("smollm2-135m").unwrap()).unwrap();
    let prompt = repetitive(&model, 40);
    let draft = || {
        let mut d = DraftModel::new(&model, 64, KvType::F16);
        d.p_min = 0.0;
        d
    };
    let all = draft().propose(&prompt, 7);
    assert_eq!(all.len(), 7);
    let mut d = draft();
    d.eog = HashSet::from([all[2]]);
    assert_eq!(d.propose(&prompt, 7), all[..3], "ends with the EOG token");
}

/// The server's scheduler under `spec_sampling: Rejection` with a model drafting for
/// itself: beside a second stream, a sampled request (no penalties) has every proposal
/// taken (the draft samples the request's own chain), and a greedy one gives plain
/// greedy decoding's tokens.
#[test]
fn the_scheduler_samples_proposals_by_rejection() {
    let store = frink_store::Store::from_env().unwrap();
    let path = store.resolve("smollm2-135m").unwrap();
    let model = Model::load(&path).unwrap();
    let prompt = repetitive(&model, 60);
    let n = 24;
    let (plain, _) = run(&model, &prompt, n, &greedy(), None);
    let sampled = SamplingParams {
        temperature: 0.9,
        seed: 5,
        ..SamplingParams::default()
    };
    let case = |name, sampling| Case {
        name,
        sampling,
        max_tokens: n,
        prediction: None,
        stop: Vec::new(),
    };
    let cases = [case("sampled", sampled), case("greedy", greedy())];
    let (out, _) = run_together(
        &path,
        &prompt,
        &cases,
        7,
        Some(&path),
        SpecSampling::Rejection,
    );
    let (s, g) = (&out[0].0, &out[1].0);
    assert!(s.proposed > 0, "the sampled request speculated");
    assert_eq!(s.accepted, s.proposed, "q = p: every proposal taken");
    assert_eq!(s.ids.len(), n);
    assert_eq!(g.ids, plain.ids, "greedy under rejection");
    assert!(
        g.proposed > 0 && g.accepted == g.proposed,
        "a greedy self-draft"
    );
}
