//! Tests of the sampling chain (`frink_engine::sampling`): greedy, seeding, each filter
//! on small hand-made distributions, the penalties, the order of the chain, disabled
//! filters and a 262,144-token vocabulary.

use frink_engine::sampling::{
    argmax, Candidate, Sampler, SamplingParams, SpecSampling, DEFAULT_SEED,
};

/// Every filter off, temperature `temp`, no penalties.
fn neutral(temp: f32) -> SamplingParams {
    SamplingParams {
        temperature: temp,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplingParams::default()
    }
}

/// The ids of the candidates, sorted.
fn ids(c: &[Candidate]) -> Vec<u32> {
    let mut v: Vec<u32> = c.iter().map(|c| c.id).collect();
    v.sort_unstable();
    v
}

/// Reference softmax in f64.
fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Deterministic pseudo-random logits in [-scale, scale) (xorshift64*).
fn pseudo_logits(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let x = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
            (x as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Counts of each token over `n` draws.
fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
    let mut h = vec![0usize; logits.len()];
    for _ in 0..n {
        h[s.sample(logits) as usize] += 1;
    }
    h
}

#[test]
fn defaults_are_llama_cpp_defaults() {
    let d = SamplingParams::default();
    assert_eq!(d.temperature, 0.8);
    assert_eq!(d.top_k, 40);
    assert_eq!(d.top_p, 0.95);
    assert_eq!(d.min_p, 0.05);
    assert_eq!(d.repeat_penalty, 1.0);
    assert_eq!(d.repeat_last_n, 64);
    assert_eq!(d.frequency_penalty, 0.0);
    assert_eq!(d.presence_penalty, 0.0);
    assert_eq!(d.seed, DEFAULT_SEED);
    assert_eq!(DEFAULT_SEED, 0xFFFF_FFFF);
    assert!(!d.is_greedy());
    let g = SamplingParams::greedy();
    assert!(g.is_greedy());
    assert_eq!(g.temperature, 0.0);
    assert!(SamplingParams {
        temperature: -1.0,
        ..d.clone()
    }
    .is_greedy());
    assert!(SamplingParams {
        temperature: f32::NAN,
        ..d
    }
    .is_greedy());
}

#[test]
fn argmax_ties_to_lowest_and_nan_never_wins() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[-5.0]), 0);
    assert_eq!(argmax(&[f32::NAN, 0.0, f32::NAN]), 1);
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    assert_eq!(argmax(&[0.0, f32::NAN, 1.0, f32::NAN, 1.0]), 2);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[1.0, f32::INFINITY, f32::INFINITY]), 1);
}

/// A positive temperature so small that the best logit divided by it leaves f32's range
/// samples the best token every time (the limit as the temperature goes to 0). Measured
/// before the fix: the logits that left the range became +inf and shared the mass, so
/// seeds 1..19 drew 17 different tokens at 1e-38, 19 at 1e-45 and 3 (7, 8, 9) at
/// f32::MIN_POSITIVE; after it, token 7 every time.
#[test]
fn a_vanishing_temperature_is_the_greedy_limit() {
    let mut logits = pseudo_logits(1000, 3, 4.0);
    logits[7] = 20.0;
    logits[8] = 19.9;
    logits[9] = 10.0;
    for t in [1e-38f32, 1e-45, f32::MIN_POSITIVE] {
        for seed in 1..20 {
            let mut s = Sampler::new(SamplingParams {
                temperature: t,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..SamplingParams::default()
            });
            assert_eq!(s.sample(&logits), 7, "temperature {t}, seed {seed}");
        }
    }
    // A small temperature that stays in range is plain sampling, still near greedy.
    let mut s = Sampler::new(SamplingParams {
        temperature: 0.01,
        seed: 1,
        ..SamplingParams::default()
    });
    assert_eq!(s.sample(&logits), 7);
}

#[test]
fn greedy_is_argmax_with_ties_to_lowest() {
    let mut logits = pseudo_logits(1000, 7, 4.0);
    logits[700] = 9.0;
    logits[300] = 9.0;
    logits[500] = f32::NAN;
    for params in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: -0.5,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.0,
            top_k: 1000,
            top_p: 0.1,
            min_p: 0.9,
            ..SamplingParams::default()
        },
    ] {
        let mut s = Sampler::new(params);
        for _ in 0..5 {
            assert_eq!(s.sample(&logits), 300);
        }
        let c = s.candidates(&logits);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].id, 300);
        assert_eq!(c[0].p, 1.0);
    }
    assert_eq!(argmax(&logits), 300);
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    // 100 equally likely tokens: every draw has 100 outcomes.
    let logits = vec![0.0f32; 100];
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplingParams {
            seed,
            ..neutral(1.0)
        });
        (0..200).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
    };
    let a = run(42);
    assert_eq!(a, run(42));
    assert_ne!(a, run(43));
    // Not stuck on one token.
    let distinct: std::collections::BTreeSet<u32> = a.iter().cloned().collect();
    assert!(distinct.len() > 50, "{} distinct tokens", distinct.len());

    // The default chain with accepted tokens (penalties on) is as reproducible, and
    // reset() starts the same sequence again.
    let logits = pseudo_logits(5000, 3, 3.0);
    let params = SamplingParams {
        seed: 9,
        repeat_penalty: 1.3,
        frequency_penalty: 0.1,
        presence_penalty: 0.1,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(params.clone());
    let gen = |s: &mut Sampler| {
        (0..100)
            .map(|_| {
                let t = s.sample(&logits);
                s.accept(t);
                t
            })
            .collect::<Vec<u32>>()
    };
    let first = gen(&mut s);
    s.reset();
    assert_eq!(first, gen(&mut s));
    assert_eq!(first, gen(&mut Sampler::new(params.clone())));
    assert_ne!(
        first,
        gen(&mut Sampler::new(SamplingParams { seed: 10, ..params }))
    );
}

#[test]
fn top_k_keeps_k_highest() {
    let logits = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
    let mut s = Sampler::new(SamplingParams {
        top_k: 3,
        ..neutral(1.0)
    });
    let c = s.candidates(&logits);
    assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![7, 6, 5]);
    let p = softmax(&[7.0, 6.0, 5.0]);
    for (c, p) in c.iter().zip(&p) {
        assert!((c.p as f64 - p).abs() < 1e-6, "{c:?} vs {p}");
    }
    let h = histogram(&mut s, &logits, 3000);
    assert_eq!(h[..5].iter().sum::<usize>(), 0, "{h:?}");
    assert!(h[5..].iter().all(|&n| n > 0), "{h:?}");

    // k = 1 is greedy; ties at the cut go to the lowest id.
    let mut s = Sampler::new(SamplingParams {
        top_k: 2,
        ..neutral(1.0)
    });
    assert_eq!(ids(s.candidates(&[1.0, 3.0, 3.0, 3.0, 0.0])), vec![1, 2]);
    let mut s = Sampler::new(SamplingParams {
        top_k: 1,
        ..neutral(1.0)
    });
    for _ in 0..20 {
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, 3.0, 0.0]), 1);
    }
}

#[test]
fn top_p_boundary_and_softmax_over_top_k_survivors() {
    // Four equally likely tokens: probabilities are exactly 0.25 in f32, so the
    // cumulative sums 0.25, 0.5, 0.75, 1.0 are exact.
    let flat = [0.0f32; 4];
    let kept = |top_p: f32, top_k: i32, logits: &[f32]| {
        Sampler::new(SamplingParams {
            top_p,
            top_k,
            ..neutral(1.0)
        })
        .candidates(logits)
        .len()
    };
    assert_eq!(
        kept(0.5, 0, &flat),
        2,
        "cumulative exactly at p stops there"
    );
    assert_eq!(kept(0.25, 0, &flat), 1);
    assert_eq!(kept(0.49, 0, &flat), 2);
    let just_above = f32::from_bits(0.5f32.to_bits() + 1);
    assert_eq!(kept(just_above, 0, &flat), 3, "just above p takes one more");
    assert_eq!(kept(0.0, 0, &flat), 1, "min_keep = 1");
    // Ties keep the lowest ids.
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.5,
        ..neutral(1.0)
    });
    assert_eq!(ids(s.candidates(&flat)), vec![0, 1]);

    // Four tokens at logit 1, four at 0: over the whole vocabulary each of the top four
    // has e/(4e+4) = 0.183, so p = 0.5 needs three of them; after top-k = 4 the softmax
    // is over the four survivors (0.25 each) and p = 0.5 needs two.
    let logits = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
    assert_eq!(kept(0.5, 0, &logits), 3);
    assert_eq!(kept(0.5, 4, &logits), 2);

    // Probabilities of what is kept are renormalized.
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.5,
        ..neutral(1.0)
    });
    let c = s.candidates(&logits);
    assert_eq!(ids(c), vec![0, 2, 4]);
    for c in c {
        assert!((c.p - 1.0 / 3.0).abs() < 1e-6, "{c:?}");
    }
}

#[test]
fn min_p_is_relative_to_the_max_probability() {
    // p_i / p_max = e^0, e^-1 (0.368), e^-2 (0.135), e^-3 (0.050).
    let logits = [0.0, -1.0, -2.0, -3.0];
    let kept = |min_p: f32, top_k: i32| {
        ids(Sampler::new(SamplingParams {
            min_p,
            top_k,
            ..neutral(1.0)
        })
        .candidates(&logits))
    };
    // top_k = 0 exercises the unsorted path, top_k = 4 the sorted one.
    for top_k in [0, 4] {
        assert_eq!(kept(0.5, top_k), vec![0]);
        assert_eq!(kept(0.3, top_k), vec![0, 1]);
        assert_eq!(kept(0.1, top_k), vec![0, 1, 2]);
        assert_eq!(kept(0.04, top_k), vec![0, 1, 2, 3]);
        assert_eq!(kept(2.0, top_k), vec![0], "min_keep = 1");
    }

    // Relative, not absolute: token 0 has p = 0.029 and token 1 ratio 0.368, the 100
    // tail tokens ratio 0.333. min_p = 0.35 keeps exactly tokens 0 and 1 (an absolute
    // threshold of 0.35 would keep only the forced one).
    let mut logits = vec![-1.1f32; 102];
    logits[0] = 0.0;
    logits[1] = -1.0;
    for top_k in [0, 102] {
        let mut s = Sampler::new(SamplingParams {
            min_p: 0.35,
            top_k,
            ..neutral(1.0)
        });
        assert_eq!(ids(s.candidates(&logits)), vec![0, 1]);
    }
    // Shifting all logits changes nothing.
    let shifted: Vec<f32> = [0.0, -1.0, -2.0, -3.0].iter().map(|l| l + 50.0).collect();
    let mut s = Sampler::new(SamplingParams {
        min_p: 0.3,
        ..neutral(1.0)
    });
    assert_eq!(ids(s.candidates(&shifted)), vec![0, 1]);
}

/// Temperature sharpens (T < 1) or flattens (T > 1): the empirical frequencies of
/// N = 100,000 draws match softmax(logits / T).
///
/// Tolerance: each frequency is a binomial proportion with standard deviation
/// sqrt(p (1 - p) / N), at most 0.0016 here; the bound is 5 standard deviations
/// (≤ 0.0079). Ignoring the temperature would move token 0's frequency from 0.657 to
/// 0.474 (T = 0.5) or from 0.333 to 0.474 (T = 2): 25 and 19 times the bound.
#[test]
fn temperature_frequencies_match_softmax() {
    let logits = [1.0f32, 0.5, 0.0, -1.0];
    const N: usize = 100_000;
    for (t, seed) in [(0.5f32, 1u64), (2.0, 2), (1.0, 3)] {
        let mut s = Sampler::new(SamplingParams { seed, ..neutral(t) });
        let expect = softmax(&logits.map(|l| l as f64 / t as f64));
        // The reported probabilities are the tempered softmax.
        let c = s.candidates(&logits).to_vec();
        for c in &c {
            assert!(
                (c.p as f64 - expect[c.id as usize]).abs() < 1e-6,
                "T={t}: {c:?} vs {}",
                expect[c.id as usize]
            );
            assert!((c.logit - logits[c.id as usize] / t).abs() < 1e-6);
        }
        let h = histogram(&mut s, &logits, N);
        for (i, &n) in h.iter().enumerate() {
            let f = n as f64 / N as f64;
            let p = expect[i];
            let tol = 5.0 * (p * (1.0 - p) / N as f64).sqrt();
            assert!(
                (f - p).abs() <= tol,
                "T={t}, token {i}: frequency {f:.4}, expected {p:.4} ± {tol:.4}"
            );
        }
    }
    // Sharpening: lower temperature, more mass on the top token.
    let p = |t: f32| {
        Sampler::new(neutral(t))
            .candidates(&logits)
            .iter()
            .find(|c| c.id == 0)
            .unwrap()
            .p
    };
    assert!(p(0.25) > p(0.5) && p(0.5) > p(1.0) && p(1.0) > p(2.0));
}

/// Logit of token `id` after the chain, with every filter off and T = 1 (so the
/// penalties alone act).
fn penalized(s: &mut Sampler, logits: &[f32], id: u32) -> f32 {
    s.candidates(logits)
        .iter()
        .find(|c| c.id == id)
        .unwrap()
        .logit
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative_logits() {
    let logits = [2.0f32, -2.0, 0.0, 1.0, 3.0];
    let mut s = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        ..neutral(1.0)
    });
    for t in [0, 1, 2, 0] {
        s.accept(t);
    }
    assert_eq!(
        penalized(&mut s, &logits, 0),
        1.0,
        "positive: divided (once, whatever the count)"
    );
    assert_eq!(penalized(&mut s, &logits, 1), -4.0, "negative: multiplied");
    assert_eq!(penalized(&mut s, &logits, 2), 0.0, "zero stays zero");
    assert_eq!(penalized(&mut s, &logits, 3), 1.0, "unseen: untouched");
    assert_eq!(penalized(&mut s, &logits, 4), 3.0, "unseen: untouched");
    // Greedy decoding sees the penalized logits.
    let mut g = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        ..SamplingParams::greedy()
    });
    g.accept(4);
    assert_eq!(g.sample(&logits), 0, "4: 3.0 / 2 = 1.5 < 2.0");
    g.accept(0);
    assert_eq!(g.sample(&logits), 4, "4: 1.5 > 0: 1.0 > 3: 1.0");
}

#[test]
fn frequency_and_presence_penalties_count_occurrences() {
    let logits = [2.0f32, -2.0, 0.0, 1.0];
    let mut s = Sampler::new(SamplingParams {
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..neutral(1.0)
    });
    for t in [3, 3, 3, 1] {
        s.accept(t);
    }
    assert_eq!(penalized(&mut s, &logits, 3), 1.0 - (3.0 * 0.5 + 0.25));
    assert_eq!(penalized(&mut s, &logits, 1), -2.0 - (0.5 + 0.25));
    assert_eq!(penalized(&mut s, &logits, 0), 2.0);

    // Repeat penalty first, then the subtraction: (1 / 2) - 2 * 1 = -1.5 (the other
    // order would give (1 - 2) * 2 = -2).
    let mut s = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        frequency_penalty: 1.0,
        ..neutral(1.0)
    });
    s.accept(3);
    s.accept(3);
    assert_eq!(penalized(&mut s, &logits, 3), -1.5);
}

#[test]
fn penalty_window_is_the_last_n_accepted_tokens() {
    let logits = [1.0f32; 6];
    let mut s = Sampler::new(SamplingParams {
        repeat_last_n: 3,
        frequency_penalty: 1.0,
        ..neutral(1.0)
    });
    for t in [0, 0, 1, 2, 2] {
        s.accept(t);
    }
    // Window = [1, 2, 2].
    assert_eq!(penalized(&mut s, &logits, 0), 1.0);
    assert_eq!(penalized(&mut s, &logits, 1), 0.0);
    assert_eq!(penalized(&mut s, &logits, 2), -1.0);
    // A token outside the vocabulary is remembered but touches nothing.
    s.accept(1_000_000);
    assert_eq!(penalized(&mut s, &logits, 1), 1.0, "1 left the window");
    assert_eq!(penalized(&mut s, &logits, 2), -1.0);
    s.reset();
    assert_eq!(
        penalized(&mut s, &logits, 2),
        1.0,
        "reset forgets the history"
    );

    // repeat_last_n = 0 disables the penalties.
    let mut s = Sampler::new(SamplingParams {
        repeat_last_n: 0,
        repeat_penalty: 2.0,
        frequency_penalty: 1.0,
        presence_penalty: 1.0,
        ..neutral(1.0)
    });
    s.accept(0);
    assert_eq!(penalized(&mut s, &logits, 0), 1.0);
}

#[test]
fn penalties_apply_before_top_k() {
    // Penalizing token 0 (5 → 2.5) before top-k = 2 keeps {1, 2}; top-k first would
    // have kept {0, 1}.
    let logits = [5.0f32, 4.0, 3.0, 0.0];
    let mut s = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        top_k: 2,
        ..neutral(1.0)
    });
    s.accept(0);
    assert_eq!(ids(s.candidates(&logits)), vec![1, 2]);
    let h = histogram(&mut s, &logits, 2000);
    assert_eq!(h[0] + h[3], 0, "{h:?}");
    assert!(h[2] > 0, "{h:?}");
}

#[test]
fn disabled_filters_are_no_ops() {
    let logits = pseudo_logits(300, 11, 5.0);
    let reference = softmax(&logits.iter().map(|&l| l as f64).collect::<Vec<_>>());
    let check = |params: SamplingParams| {
        let label = format!("{params:?}");
        let mut s = Sampler::new(params);
        s.accept(3);
        s.accept(4);
        let c = s.candidates(&logits);
        assert_eq!(c.len(), logits.len(), "{label}");
        for c in c {
            assert_eq!(c.logit, logits[c.id as usize], "{label}");
            assert!(
                (c.p as f64 - reference[c.id as usize]).abs() < 1e-6,
                "{label}"
            );
        }
    };
    check(neutral(1.0));
    check(SamplingParams {
        top_k: -3,
        top_p: 1.5,
        min_p: -0.5,
        ..neutral(1.0)
    });
    check(SamplingParams {
        top_k: 300,
        ..neutral(1.0)
    });
    check(SamplingParams {
        top_k: 100_000,
        ..neutral(1.0)
    });
    check(SamplingParams {
        top_p: f32::NAN,
        min_p: f32::NAN,
        ..neutral(1.0)
    });
    check(SamplingParams {
        repeat_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        repeat_last_n: 64,
        ..neutral(1.0)
    });
    // The same draws whether a disabled filter is 0 or negative, 1.0 or above.
    let draws = |params: SamplingParams| {
        let mut s = Sampler::new(params);
        (0..200).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(
        draws(neutral(0.7)),
        draws(SamplingParams {
            top_k: -1,
            top_p: 2.0,
            min_p: -1.0,
            ..neutral(0.7)
        })
    );
}

#[test]
fn nan_and_infinite_logits() {
    let logits = [f32::NAN, 1.0, f32::NEG_INFINITY, 0.5, f32::NAN];
    let mut s = Sampler::new(neutral(1.0));
    for _ in 0..500 {
        let t = s.sample(&logits);
        assert!(t == 1 || t == 3, "drew {t}");
    }
    let mut s = Sampler::new(SamplingParams::default());
    assert_eq!(s.sample(&[0.0, f32::INFINITY, 3.0]), 1);
    let mut s = Sampler::new(neutral(1.0));
    let t = s.sample(&[f32::NEG_INFINITY; 3]);
    assert!(t < 3);
    // Greedy agrees with `argmax` on rows with nothing above -inf.
    let mut g = Sampler::new(SamplingParams::greedy());
    for row in [
        [f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY],
        [f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY],
        [f32::NAN; 3],
    ] {
        assert_eq!(g.sample(&row), argmax(&row), "{row:?}");
    }
    assert_eq!(
        g.sample(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]),
        1
    );
    // ... and a penalized token that is the only finite one still wins.
    let mut g = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        ..SamplingParams::greedy()
    });
    g.accept(2);
    assert_eq!(g.sample(&[f32::NAN, f32::NEG_INFINITY, -3.0]), 2);
    // A penalized token still at -inf (here NaN) does not displace argmax's choice.
    g.accept(0);
    assert_eq!(
        g.sample(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]),
        1
    );
}

#[test]
fn large_vocabulary() {
    const N: usize = 262_144;
    let logits = pseudo_logits(N, 5, 8.0);
    let mut order: Vec<u32> = (0..N as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    let top40: std::collections::HashSet<u32> = order[..40].iter().cloned().collect();

    // Default chain: every draw among the top 40.
    let mut s = Sampler::new(SamplingParams::default());
    let start = std::time::Instant::now();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        let t = s.sample(&logits);
        assert!(top40.contains(&t), "{t} not in the top 40");
        seen.insert(t);
    }
    eprintln!(
        "default chain, n_vocab {N}: {:.3} ms per token",
        start.elapsed().as_secs_f64() * 10.0
    );
    assert!(seen.len() > 1);

    // Greedy.
    let mut g = Sampler::new(SamplingParams::greedy());
    let start = std::time::Instant::now();
    for _ in 0..100 {
        assert_eq!(g.sample(&logits), order[0]);
    }
    eprintln!(
        "greedy, n_vocab {N}: {:.3} ms per token",
        start.elapsed().as_secs_f64() * 10.0
    );
    assert_eq!(argmax(&logits), order[0]);

    // Top-p without top-k over a flat distribution: the partial sort of the best 256 is
    // not enough and the rest must be sorted. Each probability is exactly 2^-18, so the
    // kept count is ceil(0.95 * 2^18) with 0.95 as f32.
    let flat = vec![0.0f32; N];
    let mut s = Sampler::new(SamplingParams {
        top_k: 0,
        min_p: 0.0,
        ..SamplingParams::default()
    });
    let expect = (0.95f32 as f64 * N as f64).ceil() as usize;
    let c = s.candidates(&flat);
    assert_eq!(c.len(), expect);
    assert_eq!(
        ids(c),
        (0..expect as u32).collect::<Vec<_>>(),
        "ties to the lowest ids"
    );
    // And over the pseudo-random logits the kept prefix is the true descending prefix.
    let c = s.candidates(&logits).to_vec();
    assert!(c.len() > 256, "{} kept", c.len());
    assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), order[..c.len()]);
    let t = s.sample(&logits);
    assert!(order[..c.len()].contains(&t));
}

/// Top-k and greedy scan the row without copying it (penalized tokens handled apart);
/// they must pick exactly what the full-row path (every filter off, then sorting)
/// picks, ties included, with penalties that lower and that raise logits.
#[test]
fn top_k_and_greedy_scans_agree_with_the_full_row() {
    let fine = pseudo_logits(20_000, 21, 6.0);
    // Coarse logits: many exact ties.
    let coarse: Vec<f32> = fine.iter().map(|l| l.round()).collect();
    // Penalties that lower (1.5, 0.5) and that raise (0.2, -4.0) logits.
    let penalties = [(1.5f32, 0.5f32, 0.0f32), (0.2, 0.0, -4.0), (1.0, 0.0, 0.0)];
    let history: Vec<u32> = pseudo_logits(60, 5, 1.0)
        .iter()
        .map(|x| ((x + 1.0) * 10_000.0) as u32 % 20_000)
        .chain([0, 1, 2, 3, 19_999, 25_000])
        .collect();
    for logits in [&fine, &coarse] {
        for &(repeat_penalty, frequency_penalty, presence_penalty) in &penalties {
            let base = SamplingParams {
                repeat_penalty,
                frequency_penalty,
                presence_penalty,
                ..neutral(1.0)
            };
            let with = |params: SamplingParams| {
                let mut s = Sampler::new(params);
                for &t in &history {
                    s.accept(t);
                }
                s
            };
            // Reference: the whole penalized row, sorted by (logit desc, id asc).
            let mut full = with(base.clone()).candidates(logits).to_vec();
            // (`partial_cmp`: -0.0 and 0.0, which rounding produces, are equal logits.)
            full.sort_by(|a, b| b.logit.partial_cmp(&a.logit).unwrap().then(a.id.cmp(&b.id)));
            for k in [1, 5, 40, 200, 19_999] {
                let mut s = with(SamplingParams {
                    top_k: k,
                    ..base.clone()
                });
                let got: Vec<(u32, f32)> = s
                    .candidates(logits)
                    .iter()
                    .map(|c| (c.id, c.logit))
                    .collect();
                let want: Vec<(u32, f32)> =
                    full[..k as usize].iter().map(|c| (c.id, c.logit)).collect();
                let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
                assert!(
                    got.len() == want.len() && first_diff.is_none(),
                    "k = {k}, penalties {repeat_penalty} {frequency_penalty} {presence_penalty}: \
                     {} vs {} kept, first difference at {first_diff:?}",
                    got.len(),
                    want.len()
                );
            }
            let mut g = with(SamplingParams {
                temperature: 0.0,
                ..base.clone()
            });
            assert_eq!(g.sample(logits), full[0].id);
        }
    }
}

/// The logit bias heads the chain: a ban removes the greedy choice and every sampled draw
/// of it (with top-k on and off), a positive bias adds exactly its value to the logit the
/// candidates report, and the penalties see the biased logit (llama.cpp's order).
#[test]
fn logit_bias_is_added_before_the_chain_and_minus_100_bans() {
    use frink_engine::sampling::ban_bias;
    let logits = [1.0f32, 4.0, 3.0, 2.0];
    // Without a bias greedy picks 1; banning it gives the next best, 2.
    let mut plain = Sampler::new(SamplingParams::greedy());
    assert_eq!(plain.sample(&logits), 1);
    let ban = vec![(1, ban_bias(-100.0))];
    let mut banned = Sampler::new(SamplingParams {
        logit_bias: ban.clone(),
        ..SamplingParams::greedy()
    });
    assert_eq!(banned.sample(&logits), 2);
    for top_k in [0, 2] {
        let mut s = Sampler::new(SamplingParams {
            logit_bias: ban.clone(),
            top_k,
            seed: 7,
            ..neutral(1.5)
        });
        for _ in 0..500 {
            assert_ne!(s.sample(&logits), 1, "top_k {top_k}");
        }
    }
    // +2.5 on token 0: 3.5, now second; the reported logit is the biased one.
    let mut s = Sampler::new(SamplingParams {
        logit_bias: vec![(0, 2.5), (99, 50.0)],
        ..neutral(1.0)
    });
    let c = s.candidates(&logits).to_vec();
    let l0 = c.iter().find(|c| c.id == 0).unwrap().logit;
    assert_eq!(l0, 3.5);
    // Penalties after the bias: token 2 seen once, repeat penalty 2 divides 3 + 2 = 5 to 2.5;
    // a penalty applied before the bias would give 3 / 2 + 2 = 3.5 and pick 2 over 1's 4.
    let mut p = Sampler::new(SamplingParams {
        logit_bias: vec![(2, 2.0)],
        repeat_penalty: 2.0,
        ..SamplingParams::greedy()
    });
    p.accept(2);
    assert_eq!(p.sample(&logits), 1);
    let mut q = Sampler::new(SamplingParams {
        logit_bias: vec![(2, 2.0)],
        ..SamplingParams::greedy()
    });
    assert_eq!(q.sample(&logits), 2);
    assert_eq!(ban_bias(-100.0), f32::NEG_INFINITY);
    assert_eq!(ban_bias(-99.5), -99.5);
    assert_eq!(ban_bias(100.0), 100.0);
}

/// Frequencies of the tokens `try_sample_proposed` emits under `mode` over `n` rows,
/// each with a proposal drawn from `q` by a drafting sampler (`None`: the fixed proposal
/// `fixed`, a point mass), and the share of proposals taken.
fn proposed_frequencies(
    logits: &[f32],
    q_logits: Option<&[f32]>,
    fixed: u32,
    mode: SpecSampling,
    n: usize,
) -> (Vec<f64>, f64) {
    let mut target = Sampler::new(SamplingParams {
        seed: 11,
        ..neutral(1.0)
    });
    let mut draft = Sampler::new(SamplingParams {
        seed: 12,
        ..neutral(1.0)
    });
    let (mut h, mut taken) = (vec![0usize; logits.len()], 0);
    for _ in 0..n {
        let (d, q) = match q_logits {
            Some(ql) => {
                let (d, q) = draft.sample_distribution(ql);
                (d, Some(q.to_vec()))
            }
            None => (fixed, None),
        };
        let t = target
            .try_sample_proposed(logits, d, q.as_deref(), mode)
            .unwrap();
        h[t as usize] += 1;
        taken += usize::from(t == d);
    }
    let f = h.iter().map(|&c| c as f64 / n as f64).collect();
    (f, taken as f64 / n as f64)
}

/// Rejection sampling (`--spec-sampling rejection`, Leviathan et al. 2023) emits tokens
/// with the model's own distribution whatever the proposals are drawn from, and takes
/// more of a sampling draft's proposals than exact match does.
///
/// Measured (100,000 rows): every frequency within 0.0035 of p (bound: 5 standard
/// errors, 0.0079 at p = 0.47); taking every proposal instead is 0.47 off p with the
/// reversed draft (0.98 with the point mass on token 4), accepting with probability
/// p(d) without dividing by q(d) 0.13 off (0.07 with q = p). With q = p rejection takes
/// every proposal (1.0) where exact match takes Σp² = 0.354 (measured 0.355).
#[test]
fn rejection_sampling_keeps_the_distribution_and_takes_more_proposals() {
    let logits = [2.0f32, 1.5, 0.5, 0.0, -1.0];
    let p = softmax(&logits.map(|l| l as f64));
    const N: usize = 100_000;
    let check = |f: &[f64], what: &str| {
        for (i, (&f, &p)) in f.iter().zip(&p).enumerate() {
            let tol = 5.0 * (p * (1.0 - p) / N as f64).sqrt();
            assert!(
                (f - p).abs() <= tol,
                "{what}, token {i}: frequency {f:.4}, p {p:.4} ± {tol:.4}"
            );
        }
    };
    // A draft far from the model (its order reversed), a point mass on an unlikely token
    // and on the likeliest, and the model's own distribution.
    let reversed = [-1.0f32, 0.0, 0.5, 1.5, 2.0];
    for mode in [SpecSampling::Exact, SpecSampling::Rejection] {
        let (f, _) = proposed_frequencies(&logits, Some(&reversed), 0, mode, N);
        check(&f, &format!("{mode:?}, reversed draft"));
        for fixed in [4, 0] {
            let (f, taken) = proposed_frequencies(&logits, None, fixed, mode, N);
            check(&f, &format!("{mode:?}, always {fixed}"));
            // A point mass is taken with probability p(d) either way.
            let pd = p[fixed as usize];
            assert!((taken - pd).abs() < 5.0 * (pd * (1.0 - pd) / N as f64).sqrt());
        }
    }
    let (f, taken) = proposed_frequencies(&logits, Some(&logits), 0, SpecSampling::Rejection, N);
    check(&f, "rejection, q = p");
    assert_eq!(taken, 1.0, "q = p: every proposal is taken");
    let (_, exact) = proposed_frequencies(&logits, Some(&logits), 0, SpecSampling::Exact, N);
    let sum_p2: f64 = p.iter().map(|p| p * p).sum();
    assert!(
        (exact - sum_p2).abs() < 0.01,
        "exact match takes Σp² = {sum_p2:.3}: {exact:.3}"
    );

    // Greedy settings take the argmax whatever is proposed, in both modes.
    let mut g = Sampler::new(SamplingParams::greedy());
    let q = [Candidate {
        id: 3,
        logit: 0.0,
        p: 1.0,
    }];
    for mode in [SpecSampling::Exact, SpecSampling::Rejection] {
        assert_eq!(
            g.try_sample_proposed(&logits, 3, Some(&q), mode).unwrap(),
            0
        );
    }
}
