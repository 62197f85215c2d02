//! Speculative decoding never changes the answer: with prompt lookup, a proposer that is
//! always right, one that is always wrong and one that proposes noise, greedy and seeded
//! sampled generations (penalties on) give exactly the tokens, finish reason and session
//! state of plain decoding, on the catalog models and on tiny fixtures, over prompts where
//! proposals are accepted and rejected.

use std::collections::HashSet;

use frink_engine::sampling::{Sampler, SamplingParams};
use frink_engine::{
    generate_with, Flow, GenerateParams, Generation, NgramLookup, Propose, Session,
};
use frink_models::{KvType, Logits, Model};

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
    let mut s = Session::new(model, prompt.len() + n + 2, KvType::F16);
    let mut sampler = Sampler::new(sampling.clone());
    let params = GenerateParams {
        max_tokens: n,
        eog: HashSet::new(),
        speculation: None,
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

#[test]
fn speculation_gives_the_tokens_of_plain_decoding() {
    let mut greedy = SamplingParams::greedy();
    greedy.repeat_penalty = 1.0;
    let mut configs = vec![("greedy".to_string(), greedy)];
    for seed in 1..=5u64 {
        configs.push((
            format!("seed {seed}"),
            SamplingParams {
                temperature: 0.9,
                repeat_penalty: 1.1,
                presence_penalty: 0.2,
                seed,
                ..SamplingParams::default()
            },
        ));
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
