//! A pooled sequence's state as bytes, to save to disk and restore later (llama.cpp's
//! `llama_state_seq_get_data` / `set_data`): for each attention layer the stored bytes of
//! its keys and values at every position held (in the cache's own element type, so a
//! restore gives the same bits), for each recurrent layer its convolution window and scan
//! state (f32). What the bytes belong to (the model, the tokens, the KV type) is the
//! caller's header; this module only checks that the length is the one the model and
//! the positions give.

use crate::kv::KvPool;
use crate::state::SeqState;

/// Where a saved state's windowed layers start: positions before `held_from` had left a
/// layer's window (their blocks given back) and are not saved for the layers in the
/// pool's window group; every other layer saves positions `0..n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Positions saved.
    pub n: usize,
    /// The first position the window group's layers save (a multiple of the block size).
    pub held_from: usize,
}

/// Bytes of the payload of `extent` for sequences of `state`'s layers in `pool`.
pub fn payload_len(pool: &KvPool, state: &SeqState, extent: Extent) -> usize {
    let kv: usize = pool
        .layers
        .iter()
        .enumerate()
        .filter_map(|(il, l)| {
            let l = l.as_ref()?;
            let rows = extent.n - from(pool, il, extent);
            pool.kv_type.row_bytes(l.k_dim, l.v_dim)?.checked_mul(rows)
        })
        .sum();
    let recurrent = recurrent_bytes(state);
    kv + recurrent
}

/// Bytes of `state`'s recurrent layers' states (f32).
fn recurrent_bytes(state: &SeqState) -> usize {
    state
        .layers
        .iter()
        .filter_map(|l| l.recurrent.as_ref())
        .map(|r| (r.conv.len() + r.ssm.len()) * 4)
        .sum()
}

/// The first position layer `il` saves.
fn from(pool: &KvPool, il: usize, extent: Extent) -> usize {
    if pool.in_window_group(il) {
        extent.held_from.min(extent.n)
    } else {
        0
    }
}

/// Appends `state`'s positions `0..n` (those its window group still holds; `n` at most
/// `n_past`, and `n_past` for a state with recurrent layers, which cannot be cut) to
/// `out` and returns what they are.
pub fn save(pool: &KvPool, state: &SeqState, n: usize, out: &mut Vec<u8>) -> Extent {
    let n = if state.is_recurrent() {
        state.n_past()
    } else {
        n.min(state.n_past())
    };
    let extent = Extent {
        n,
        held_from: match state.window_table() {
            Some(_) if state.is_pooled() => state.window_held_from(),
            _ => 0,
        },
    };
    for (il, l) in pool.layers.iter().enumerate() {
        if let Some(l) = l {
            let p0 = from(pool, il, extent);
            l.save_rows(
                state.table(pool.in_window_group(il)),
                p0,
                extent.n - p0,
                out,
            );
        }
    }
    for r in state.layers.iter().filter_map(|l| l.recurrent.as_ref()) {
        for x in r.conv.iter().chain(&r.ssm) {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    extent
}

/// Whether `src` is a payload of `extent` for `state`'s layers in `pool` whose every
/// value is finite (f16 and f32 elements, Q8_0 scales, recurrent states): a state file
/// with a valid checksum may still carry NaN or infinity, which would poison every
/// sequence that reuses its blocks.
///
/// Errors: the length differs from [`payload_len`], or a value is not finite.
pub fn check(pool: &KvPool, state: &SeqState, extent: Extent, src: &[u8]) -> Result<(), String> {
    let want = payload_len(pool, state, extent);
    if src.len() != want {
        return Err(format!(
            "{} bytes of state where {} positions take {want}",
            src.len(),
            extent.n
        ));
    }
    let recurrent = recurrent_bytes(state);
    let (kv, rec) = src.split_at(src.len() - recurrent);
    if !finite(pool, |il| extent.n - from(pool, il, extent), kv)
        || !rec.chunks_exact(4).all(f32_finite)
    {
        return Err("the state holds values that are not finite".into());
    }
    Ok(())
}

fn f32_finite(b: &[u8]) -> bool {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()
}

/// Whether every value of `bytes` is finite ([`crate::CacheType::finite`]): the rows of
/// `pool`'s attention layers as [`crate::kv::KvLayer::save_rows`] writes them, `rows(il)`
/// positions of layer `il` (keys, then values). Bytes past those rows are not looked at.
pub fn finite(pool: &KvPool, rows: impl Fn(usize) -> usize, bytes: &[u8]) -> bool {
    let mut at = 0usize;
    for (il, l) in pool.layers.iter().enumerate() {
        let Some(l) = l else { continue };
        let n = rows(il);
        for (t, dim) in [(pool.kv_type.k, l.k_dim), (pool.kv_type.v, l.v_dim)] {
            let len = t.bytes(n * dim).unwrap_or(usize::MAX);
            match bytes.get(at..at.saturating_add(len)) {
                Some(b) if t.finite(b) => at += len,
                _ => return false,
            }
        }
    }
    true
}

/// Makes `state` (pooled in `pool`, empty, with blocks for `extent.n` positions in each
/// group) hold the positions `src` was saved from ([`save`]), `n_past = extent.n`.
///
/// Errors: those of [`check`], or `state` is not empty or lacks blocks (nothing is
/// written then).
pub fn load(
    pool: &mut KvPool,
    state: &mut SeqState,
    extent: Extent,
    src: &[u8],
) -> Result<(), String> {
    check(pool, state, extent, src)?;
    let blocks = extent.n.div_ceil(crate::KV_BLOCK);
    let short = |t: Option<&[u32]>| t.is_some_and(|t| t.len() < blocks);
    if state.n_past() != 0 || short(state.table(false)) || short(state.table(true)) {
        return Err("the sequence is not empty or has no blocks for the state".into());
    }
    let mut at = 0;
    for il in 0..pool.layers.len() {
        if pool.layers[il].is_none() {
            continue;
        }
        let p0 = from(pool, il, extent);
        let table = state.table(pool.in_window_group(il));
        at += pool
            .layer_mut(il)
            .load_rows(table, p0, extent.n - p0, &src[at..]);
    }
    for r in state.layers.iter_mut().filter_map(|l| l.recurrent.as_mut()) {
        for x in r.conv.iter_mut().chain(r.ssm.iter_mut()) {
            *x = f32::from_le_bytes(src[at..at + 4].try_into().expect("4 bytes"));
            at += 4;
        }
    }
    debug_assert_eq!(at, src.len());
    state.advance(extent.n);
    Ok(())
}
