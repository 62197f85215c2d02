//! What the vision fixture tests share.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;

use frink_engine::image::{
    embd_rows, image_prompt, model_ids, rope_shift, EncodedImage, PromptImage, IMAGE_MARKER,
};
use frink_models::vision::VisionModel;
use frink_models::{KvType, Logits, Model, SeqState, Sequence};
use frink_tokenizer::Tokenizer;
use frink_vision::input::{encode_image, DEFAULT_MAX_PIXELS};
use serde_json::Value;

/// The images of a fixture's reference prompt `p` encoded from their files in `dir`, and
/// the prompt built from the processor's rendered text with its image text `marker`
/// replaced by frink's marker (where frink's chat puts it), special tokens parsed.
pub fn prompt_for(
    tok: &Tokenizer,
    vm: &VisionModel,
    dir: &Path,
    p: &Value,
    marker: &str,
) -> (Vec<u32>, Vec<PromptImage>) {
    let images: Vec<EncodedImage> = p["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(f.as_str().unwrap())).unwrap();
            encode_image(vm, &bytes, DEFAULT_MAX_PIXELS).unwrap()
        })
        .collect();
    let text = p["rendered"]
        .as_str()
        .unwrap()
        .replace(marker, IMAGE_MARKER);
    image_prompt(
        tok,
        &text,
        std::slice::from_ref(&(0..text.len())),
        vm.config.projector.image_token(),
        &images,
        vm.bidirectional(),
    )
    .unwrap()
}

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
        token_types: &[],
    }];
    model.forward_batch(&mut seqs).unwrap().pop().unwrap()
}

/// `n` tokens of greedy decoding after `prompt` (with `images`' rows, an f32 KV cache of
/// 512 positions), one step each, the prompt in pieces of `chunk` (split anywhere, inside
/// images too), each call carrying the multimodal RoPE shift of the images before it.
pub fn greedy(
    model: &Model,
    prompt: &[u32],
    images: &[PromptImage],
    n: usize,
    chunk: usize,
) -> Vec<u32> {
    let mut state = SeqState::new(&model.config, 512, KvType::F32);
    let d = model.config.n_embd;
    let mut last = Vec::new();
    for p0 in (0..prompt.len()).step_by(chunk) {
        let len = chunk.min(prompt.len() - p0);
        let ids = model_ids(&prompt[p0..p0 + len], 0);
        let rows = embd_rows(images, p0, len, d);
        let mut seqs = [Sequence {
            state: &mut state,
            tokens: &ids,
            logits: Logits::Last,
            lora: None,
            embd: &rows,
            rope_shift: rope_shift(images, p0),
            token_types: &[],
        }];
        last = model.forward_batch(&mut seqs).unwrap().pop().unwrap();
    }
    let mut out = Vec::new();
    while out.len() < n {
        let best = (0..last.len()).fold(0, |b, j| if last[j] > last[b] { j } else { b }) as u32;
        out.push(best);
        if out.len() == n {
            break;
        }
        let mut seqs = [Sequence {
            state: &mut state,
            tokens: &[best],
            logits: Logits::Last,
            lora: None,
            embd: &[],
            rope_shift: rope_shift(images, prompt.len()),
            token_types: &[],
        }];
        last = model.forward_batch(&mut seqs).unwrap().pop().unwrap();
    }
    out
}
