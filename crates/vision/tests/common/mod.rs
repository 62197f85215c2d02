//! What the vision fixture tests share.

use frink_engine::image::{embd_rows, model_ids, PromptImage};
use frink_models::{KvType, Logits, Model, SeqState, Sequence};

/// Every position's logits of `prompt` (image keys read as id 0, their rows from
/// `images`), in one call with an f32 KV cache of 512 positions; `bidi` overrides whether
/// the images' rows see each other both ways.
pub fn logits(
    model: &Model,
    prompt: &[u32],
    images: &[PromptImage],
    bidi: Option<bool>,
) -> Vec<f32> {
    let ids = model_ids(prompt, 0);
    let mut rows = embd_rows(images, 0, prompt.len(), model.config.n_embd);
    if let Some(b) = bidi {
        rows.iter_mut().for_each(|r| r.bidirectional = b);
    }
    let mut state = SeqState::new(&model.config, 512, KvType::F32);
    let mut seqs = [Sequence {
        state: &mut state,
        tokens: &ids,
        logits: Logits::All,
        lora: None,
        embd: &rows,
        rope_shift: 0,
    }];
    model.forward_batch(&mut seqs).unwrap().pop().unwrap()
}
