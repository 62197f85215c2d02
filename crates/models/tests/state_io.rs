//! A pooled sequence's state saved to bytes and loaded into another sequence's blocks
//! (`frink_models::state_io`) continues with the logits' bits of the original, for every
//! tiny fixture (recurrent and hybrid ones included) and KV type; a payload of the wrong
//! length is refused before anything is written; loading is what makes them equal.

use frink_models::state_io::{load, payload_len, save};
use frink_models::{KvPool, KvType, Logits, Model, SeqState};

const CTX: usize = 64;

fn eval(model: &Model, pool: &mut KvPool, st: &mut SeqState, tokens: &[u32]) -> Vec<f32> {
    model
        .forward_pooled(pool, st, tokens, Logits::Last)
        .unwrap()
}

#[test]
fn a_loaded_state_continues_as_the_saved_one() {
    let Some(t) = frink_testdata::require("fixtures/tiny", "state save and load") else {
        return;
    };
    let names = frink_testdata::fixture_names(&t);
    let mut checked = 0;
    for name in names {
        let Ok(model) = Model::load(t.join(&name).join("model.gguf")) else {
            continue;
        };
        let c = &model.config;
        for kv in frink_testdata::KV_TYPES.map(|t| t.parse::<KvType>().unwrap()) {
            if kv.check_heads(c).is_err() {
                continue;
            }
            let tokens = frink_testdata::spread_ids(c.n_vocab, 5, 41);
            let mut pool = KvPool::new(c, 10, kv);
            let mut a = SeqState::pooled(c, CTX, &pool);
            *a.table_mut() = vec![0, 1, 2];
            eval(&model, &mut pool, &mut a, &tokens[..40]);
            let mut bytes = Vec::new();
            let extent = save(&pool, &a, a.n_past(), &mut bytes);
            assert_eq!(extent.n, 40);
            assert_eq!(bytes.len(), payload_len(&pool, &a, extent), "{name} {kv:?}");
            let want = eval(&model, &mut pool, &mut a, &tokens[40..]);

            let mut b = SeqState::pooled(c, CTX, &pool);
            *b.table_mut() = vec![7, 4, 5];
            // A payload one byte short is refused, and nothing changes.
            let err = load(&mut pool, &mut b, extent, &bytes[1..]).unwrap_err();
            assert!(err.contains("bytes"), "{err}");
            assert_eq!(b.n_past(), 0);
            // Without the load, the same token gives other logits.
            let mut fresh = SeqState::pooled(c, CTX, &pool);
            *fresh.table_mut() = vec![8, 9, 6];
            let cold = eval(&model, &mut pool, &mut fresh, &tokens[40..]);
            assert!(cold != want, "{name} {kv:?}: the state changed nothing");
            load(&mut pool, &mut b, extent, &bytes).unwrap();
            assert_eq!(b.n_past(), 40);
            let got = eval(&model, &mut pool, &mut b, &tokens[40..]);
            let same = got.len() == want.len()
                && got
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{name} {kv:?}: the loaded state continues otherwise");
            checked += 1;
        }
    }
    assert!(checked >= 50, "{checked}");
}

/// Windowed layers in a pool's window group save only the positions still held: a block
/// given back before the save stays given back, and the continuation keeps its bits.
#[test]
fn a_window_group_saves_what_it_holds() {
    let Some(t) = frink_testdata::require("fixtures/tiny", "state save and load") else {
        return;
    };
    let mut checked = 0;
    for name in ["gemma2", "gemma3", "gpt_oss", "mistral"] {
        let model = Model::load(t.join(name).join("model.gguf")).unwrap();
        let c = &model.config;
        let w = c.plan.window();
        assert!(w > 0 && w <= 24, "{name}: window {w}");
        let tokens = frink_testdata::spread_ids(c.n_vocab, 6, 41);
        let mut pool = KvPool::with_window_group(c, 10, 10, KvType::F16);
        let mut a = SeqState::pooled(c, CTX, &pool);
        *a.table_mut() = vec![0, 1, 2];
        *a.window_table_mut().unwrap() = vec![0, 1, 2];
        eval(&model, &mut pool, &mut a, &tokens[..40]);
        // Block 0 (positions 0..16) is behind every later query's window.
        a.window_table_mut().unwrap()[0] = frink_models::EVICTED;
        let mut bytes = Vec::new();
        let extent = save(&pool, &a, a.n_past(), &mut bytes);
        assert_eq!(extent.held_from, 16, "{name}");
        let want = eval(&model, &mut pool, &mut a, &tokens[40..]);
        let mut b = SeqState::pooled(c, CTX, &pool);
        *b.table_mut() = vec![5, 6, 7];
        *b.window_table_mut().unwrap() = vec![frink_models::EVICTED, 5, 6];
        load(&mut pool, &mut b, extent, &bytes).unwrap();
        let got = eval(&model, &mut pool, &mut b, &tokens[40..]);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}: the loaded window group continues otherwise"
        );
        checked += 1;
    }
    assert_eq!(checked, 4);
}
