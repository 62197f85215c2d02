//! `--expert-budget`: routed experts served from a bounded cache give bit-identical logits,
//! miss when the budget is a fraction of the expert bytes, and never hold more than the
//! budget.

use frink_models::{KvType, Logits, Model, SeqState};

fn logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut cache = SeqState::new(&model.config, 64, KvType::F16);
    // Token by token after a prefill chunk: both paths through the experts.
    let mut out = model.forward(&mut cache, &ids[..16], Logits::All).unwrap();
    for &t in &ids[16..] {
        out.extend(model.forward(&mut cache, &[t], Logits::All).unwrap());
    }
    out
}

#[test]
fn a_budget_changes_no_bits_and_is_never_exceeded() {
    let Some(q) = frink_testdata::require("fixtures/quant", "expert budget") else {
        return;
    };
    for ty in ["Q4_K_M", "Q8_0", "F16"] {
        let mut model = Model::load(q.join(ty).join("qwen2_moe.gguf")).unwrap();
        let ids: Vec<u32> = (0..24u32).map(|i| (i * 7919 + 11) % 320).collect();
        let free = logits(&model, &ids);
        let one = model.expert_bytes(0);
        let total = model.total_expert_bytes();
        // 2 layers × 4 experts: a budget of 1.5 experts must keep evicting.
        let budget = one * 3 / 2;
        assert!(budget < total / 4);
        model.set_expert_budget(Some(budget)).unwrap();
        let bounded = logits(&model, &ids);
        assert!(bounded == free, "{ty}: logits changed under a budget");
        let s = model.expert_cache.as_ref().unwrap().stats();
        eprintln!(
            "{ty}: budget {budget} of {total} expert bytes: {} hits, {} misses, peak {} bytes",
            s.hits, s.misses, s.peak_bytes
        );
        assert!(s.misses > 8, "{ty}: {s:?}");
        assert!(
            s.peak_bytes <= budget && s.resident_bytes <= budget,
            "{ty}: {s:?}"
        );
        // Room for every expert: each matrix is read once, then hit.
        model.set_expert_budget(Some(total)).unwrap();
        assert!(logits(&model, &ids) == free);
        let s = model.expert_cache.as_ref().unwrap().stats();
        assert!(s.misses <= 2 * 4 * 3 && s.hits > 0, "{ty}: {s:?}");
        // A budget below one expert is refused; a dense model refuses any.
        assert!(model.set_expert_budget(Some(one - 1)).is_err());
    }
    let dense = Model::load(q.join("Q8_0").join("llama.gguf")).unwrap();
    let mut dense = dense;
    assert!(dense.set_expert_budget(Some(1 << 20)).is_err());
}
