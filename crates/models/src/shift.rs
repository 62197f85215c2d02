//! Context shift: positions of a sequence's KV cache moved back, their keys rotated by
//! RoPE to the new positions, so that a generation that reaches the context can drop
//! the oldest tokens and go on (llama.cpp's `--context-shift`: `llama_kv_cache` `seq_add`
//! then the K-shift graph `build_graph_shift`, src/llama-kv-cache.cpp).
//!
//! RoPE rotates each pair of a key by an angle linear in the position, so a key computed
//! at position `p` becomes the key at `p - d` by the rotation of `-d` (only the rotation:
//! YaRN's magnitude factor is already in the stored key). A quantized cache holds keys
//! rotated by a Walsh–Hadamard block ([`crate::KvType::key_rotation`]): that rotation is
//! undone before RoPE and applied again after. Values do not depend on positions; they
//! are copied (dequantized and stored again: the same blocks for Q8_0, whose rounding is
//! idempotent).

use crate::arch::{Position, RopeLayout};
use crate::config::ModelConfig;
use crate::kernels::{hadamard_rotate, rope_angles, rope_rotate};
use crate::plan::{Mixer, QkvLayout};
use crate::{KvPool, Model, SeqState};

/// Why a model's cache cannot be shifted at a context of `n_ctx` positions, or `None`
/// when it can: attention with RoPE, ALiBi or no positions, whose every row is still
/// held (a sliding window at least as long as the context).
pub fn shift_refusal(config: &ModelConfig, n_ctx: usize) -> Option<String> {
    let plan = &config.plan;
    let arch = plan.arch;
    if plan.encoder {
        return Some(format!("{arch} is an encoder: it does not generate"));
    }
    if plan.is_recurrent() {
        return Some(format!(
            "{arch}'s recurrent layers keep a state that cannot drop tokens"
        ));
    }
    if config.rope_sections.is_some() {
        return Some(format!(
            "{arch}'s multimodal RoPE positions cannot be shifted"
        ));
    }
    for l in &plan.layers {
        if let Mixer::Attention(a) = &l.mixer {
            if a.qkv == QkvLayout::Latent {
                return Some(format!("{arch}'s latent attention (MLA) cannot be shifted"));
            }
            if a.position == Position::Learned {
                return Some(format!("{arch}'s learned positions cannot be shifted"));
            }
        }
    }
    let window = plan.window();
    if window > 0 && n_ctx > window {
        return Some(format!(
            "{arch}'s sliding window of {window} positions is shorter than the context of \
             {n_ctx}: rows that left the window are gone (a context of at most {window} \
             can be shifted)"
        ));
    }
    None
}

/// The keys and values of positions moved by [`read_shifted`], per layer (`None`: a layer
/// without its own cache), keys already rotated to their new positions.
pub struct ShiftedRows {
    layers: Vec<Option<(Vec<f32>, Vec<f32>)>>,
    n: usize,
}

impl ShiftedRows {
    /// Positions it holds.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// Reads positions `from .. from + n` of `state`'s cache in `pool` with their keys rotated
/// `back` positions back ([`shift_refusal`] must have said `None` for this model).
///
/// Panics if a position is not held.
pub fn read_shifted(
    model: &Model,
    pool: &KvPool,
    state: &SeqState,
    from: usize,
    n: usize,
    back: usize,
) -> ShiftedRows {
    let config = &model.config;
    let kv_type = pool.kv_type;
    let layers = config
        .plan
        .layers
        .iter()
        .enumerate()
        .map(|(il, l)| {
            let layer = pool.layers[il].as_ref()?;
            let table = state.table(pool.in_window_group(il));
            let (mut k, v) = layer.read_rows(table, from, n);
            if let Mixer::Attention(a) = &l.mixer {
                if let Position::Rope(layout) = a.position {
                    let hd = a.geometry.head_dim_k;
                    let n_rot = a.geometry.n_rot;
                    let factors = model
                        .weights
                        .rope_freqs
                        .as_deref()
                        .filter(|_| a.geometry.freq_factors);
                    let mut angles = Vec::new();
                    rope_angles(back, n_rot, &a.rope, factors, &mut angles);
                    // The rotation by -back alone (unit length: the magnitude factor
                    // stays as the key has it).
                    for c in angles.iter_mut() {
                        let r = c.0.hypot(c.1);
                        *c = (c.0 / r, -c.1 / r);
                    }
                    let rotation = kv_type.key_rotation(hd);
                    let neox = layout == RopeLayout::Neox;
                    for row in k.chunks_exact_mut(layer.k_dim) {
                        if let Some(b) = rotation {
                            hadamard_rotate(row, b);
                        }
                        for head in row.chunks_exact_mut(hd) {
                            rope_rotate(head, &angles, neox);
                        }
                        if let Some(b) = rotation {
                            hadamard_rotate(row, b);
                        }
                    }
                }
            }
            Some((k, v))
        })
        .collect();
    ShiftedRows { layers, n }
}

/// Writes `rows` at positions `state.n_past() ..` of `state`'s cache in `pool` (its blocks
/// already allocated for them) and counts them evaluated.
///
/// Panics if a position has no block.
pub fn write_shifted(pool: &mut KvPool, state: &mut SeqState, rows: &ShiftedRows) {
    let at = state.n_past();
    for (il, r) in rows.layers.iter().enumerate() {
        if let Some((k, v)) = r {
            let windowed = pool.in_window_group(il);
            let table = state.table(windowed);
            pool.layer_mut(il).write_rows(table, at, k, v);
        }
    }
    state.advance(rows.n);
}
