//! The blocks a layer is made of, one file each, each owning the loading of its weights
//! (through [`crate::load::Loader`]) and its computation: token mixers ([`attention`] with
//! [`mla`], [`mamba`], [`mamba2`], [`short_conv`]), channel mixers ([`ffn`], [`moe`]) and
//! Gemma 4's per-layer embeddings ([`ple`]).
//! Which block a layer runs is the plan's decision ([`crate::plan::LayerPlan`]); the
//! forward pass ([`crate::Model::forward_batch`]) is a loop over it.

pub mod attention;
pub mod delta_net;
pub mod encoder;
pub mod ffn;
pub mod mamba;
pub mod mamba2;
pub mod mla;
pub mod moe;
pub mod ple;
pub mod short_conv;

use crate::config::ModelConfig;
use crate::kernels::Matrix;
use crate::plan::Mixer;
use crate::pool;

/// A layer's token-mixer weights, of the kind its plan names.
#[derive(Clone, Debug)]
pub enum MixerWeights {
    Attention(Box<attention::AttentionWeights>),
    Mamba(Box<mamba::MambaWeights>),
    Mamba2(Box<mamba2::Mamba2Weights>),
    ShortConv(Box<short_conv::ShortConvWeights>),
    GatedDeltaNet(Box<delta_net::DeltaNetWeights>),
    /// Two mixers on the same input (falcon-h1: attention, then Mamba-2).
    Parallel(Box<MixerWeights>, Box<MixerWeights>),
}

impl MixerWeights {
    /// The matrices it multiplies.
    pub(crate) fn matrices(&self) -> Vec<&Matrix> {
        match self {
            MixerWeights::Attention(a) => a.matrices(),
            MixerWeights::Mamba(m) => vec![&m.ssm_in, &m.ssm_x, &m.ssm_dt, &m.ssm_out],
            MixerWeights::Mamba2(m) => vec![&m.ssm_in, &m.ssm_out],
            MixerWeights::ShortConv(s) => vec![&s.in_proj, &s.out_proj],
            MixerWeights::GatedDeltaNet(d) => vec![&d.qkv, &d.gate, &d.ba, &d.ssm_out],
            MixerWeights::Parallel(a, b) => {
                let mut m = a.matrices();
                m.extend(b.matrices());
                m
            }
        }
    }
}

/// A layer's feed-forward block.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer; the dense case is the common one
pub enum FfnWeights {
    Dense(ffn::DenseFfn),
    Moe(Box<moe::MoeFfn>),
    /// No channel mixer (Mamba).
    None,
}

/// The rows of one forward call: sequence `si` owns rows `starts[si]..starts[si + 1]`,
/// row `r` sits at position `pos[r]` of its sequence (its KV cache row), and with
/// multimodal RoPE rotates by the time, height and width positions `rope_pos[r]` (empty
/// otherwise: RoPE at `pos[r]`).
pub(crate) struct Rows<'a> {
    pub starts: &'a [usize],
    pub pos: &'a [usize],
    pub rope_pos: &'a [[usize; 3]],
}

impl Rows<'_> {
    /// Rows in all.
    pub fn n(&self) -> usize {
        self.pos.len()
    }

    /// Sequence `si`'s rows.
    pub fn of(&self, si: usize) -> std::ops::Range<usize> {
        self.starts[si]..self.starts[si + 1]
    }
}

/// Values of a recurrent mixer's state (convolution window, scan state) in f32, for the
/// model of `c`: Mamba-1 `(d_conv - 1) · d_inner` and `d_inner · d_state`; Mamba-2 the
/// window over `x | B | C` and `d_inner · d_state`; DeltaNet the window over `q | k | v`
/// and a `d_state × d_state` matrix per value head; LFM2's short convolution
/// `(taps - 1) · n_embd` and none.
pub(crate) fn recurrent_sizes(c: &ModelConfig, m: &Mixer) -> (usize, usize) {
    use crate::arch::Recurrent;
    let ssm = |kind: Recurrent| {
        let s = c.ssm.as_ref().expect("a scan has an SSM config");
        (
            (s.d_conv - 1) * s.conv_channels(kind),
            s.d_inner * s.d_state,
        )
    };
    match m {
        Mixer::Mamba => ssm(Recurrent::Mamba),
        Mixer::Mamba2 { .. } => ssm(Recurrent::Mamba2),
        // Per value head a d_state × d_state matrix (d_inner = value heads · d_state).
        Mixer::GatedDeltaNet => ssm(Recurrent::GatedDeltaNet),
        Mixer::ShortConv => ((c.short_conv_taps - 1) * c.n_embd, 0),
        Mixer::Parallel(a, b) => {
            let (a, b) = (recurrent_sizes(c, a), recurrent_sizes(c, b));
            (a.0 + b.0, a.1 + b.1)
        }
        Mixer::Attention(_) => (0, 0),
    }
}

/// Causal depthwise convolution of one sequence's new rows `x` (`n × channels`) into
/// `out` (same shape), continuing from `window` (the previous `taps - 1` inputs, oldest
/// first, zeros at the start of a sequence), which it then advances to end at the last new
/// row: `out[t][c] = Σ_k w[c][k] · in[t - (taps - 1) + k][c] (+ bias[c])`, `w` being
/// `channels × taps` (GGUF `ssm_conv1d.weight` / `shortconv.conv.weight`, shape
/// `[taps, channels]`; ggml `ggml_ssm_conv`; torch `Conv1d(groups = channels, padding =
/// taps - 1)` cut to the first `n` outputs). The one convolution of Mamba, Mamba-2 and
/// LFM2.
pub(crate) fn causal_conv(
    window: &mut [f32],
    w: &[f32],
    bias: Option<&[f32]>,
    x: &[f32],
    out: &mut [f32],
    channels: usize,
) {
    let taps = w.len() / channels;
    let hist = taps - 1;
    let n = x.len() / channels;
    // The input at relative time j (negative: from the window).
    let at = |j: isize, ch: usize| -> f32 {
        if j < 0 {
            window[(hist as isize + j) as usize * channels + ch]
        } else {
            x[j as usize * channels + ch]
        }
    };
    for t in 0..n {
        let row = &mut out[t * channels..(t + 1) * channels];
        for (ch, o) in row.iter_mut().enumerate() {
            let taps_w = &w[ch * taps..(ch + 1) * taps];
            let mut s = 0f32;
            for (k, &wk) in taps_w.iter().enumerate() {
                s += wk * at(t as isize - hist as isize + k as isize, ch);
            }
            *o = match bias {
                Some(b) => s + b[ch],
                None => s,
            };
        }
    }
    // The new window: the last `hist` inputs of window ++ x.
    let mut next = vec![0f32; hist * channels];
    for (i, row) in next.chunks_exact_mut(channels).enumerate() {
        let j = n as isize - hist as isize + i as isize;
        for (ch, v) in row.iter_mut().enumerate() {
            *v = at(j, ch);
        }
    }
    window.copy_from_slice(&next);
}

/// A block's scan: `(first unit, its state, its output columns)`.
pub(crate) type ScanFn<'a> = dyn Fn(usize, &mut [f32], &mut [f32]) + Sync + 'a;

/// A sequence's scan over its rows: `(its rows of the batch, first unit, the units'
/// state, their output columns)`.
pub(crate) type SeqScanFn<'a> =
    dyn Fn(std::ops::Range<usize>, usize, &mut [f32], &mut [f32]) + Sync + 'a;

/// Each sequence's rows of `x` (`n × channels`) through [`causal_conv`] with its layer
/// `il` window (weights `w`, `bias`), then SiLU where `silu`: the convolution step of
/// every recurrent block. Returns the `n × channels` result.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_sequences(
    seqs: &mut [crate::Sequence<'_>],
    rows: &Rows<'_>,
    il: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    x: &[f32],
    channels: usize,
    silu: bool,
) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (si, sq) in seqs.iter_mut().enumerate() {
        let r = rows.of(si);
        let (a, b) = (r.start * channels, r.end * channels);
        causal_conv(
            &mut sq.state.recurrent_mut(il).conv,
            w,
            bias,
            &x[a..b],
            &mut out[a..b],
            channels,
        );
    }
    if silu {
        crate::kernels::silu_in_place(&mut out, None);
    }
    out
}

/// Each sequence's scan of layer `il` over its rows ([`scan_units`] on its state: units
/// of `per_state` values writing `width` columns of `y`, `n ×` all units' columns).
pub(crate) fn scan_sequences(
    seqs: &mut [crate::Sequence<'_>],
    rows: &Rows<'_>,
    il: usize,
    per_state: usize,
    width: usize,
    y: &mut [f32],
    f: &SeqScanFn<'_>,
) {
    let cols = y.len() / rows.n().max(1);
    for (si, sq) in seqs.iter_mut().enumerate() {
        let r = rows.of(si);
        let ys = &mut y[r.start * cols..r.end * cols];
        scan_units(
            &mut sq.state.recurrent_mut(il).ssm,
            per_state,
            width,
            ys,
            &|u0, st, out| f(r.clone(), u0, st, out),
        );
    }
}

/// One sequence's scan over `n` rows, split over the compute pool by blocks of its
/// independent units (Mamba-1's channels, Mamba-2's heads): unit `u` owns state values
/// `u · per_state ..` of `state` and output columns `u · width ..` of each row of `y`
/// (`n × units · width`). `f(first, state, out)` scans the units `first..` whose state is
/// `state` and writes their columns of every row into `out` (`n ×` the block's columns).
/// A unit's values never depend on the block it falls in, so the split changes no bit.
pub(crate) fn scan_units(
    state: &mut [f32],
    per_state: usize,
    width: usize,
    y: &mut [f32],
    f: &ScanFn<'_>,
) {
    let units = state.len() / per_state;
    let cols = units * width;
    let n = y.len() / cols.max(1);
    let per_block = units.div_ceil(2 * pool::threads()).max(1);
    let mut blocks: Vec<(&mut [f32], Vec<f32>)> = state
        .chunks_mut(per_block * per_state)
        .map(|st| {
            let w = st.len() / per_state * width;
            (st, vec![0f32; n * w])
        })
        .collect();
    pool::for_each_chunk(&mut blocks, 1, &|bi, b| {
        let (st, out) = &mut b[0];
        f(bi * per_block, st, out);
    });
    for (bi, (_, out)) in blocks.iter().enumerate() {
        let c0 = bi * per_block * width;
        let w = out.len() / n.max(1);
        for (t, row) in out.chunks_exact(w).enumerate() {
            y[t * cols + c0..t * cols + c0 + w].copy_from_slice(row);
        }
    }
}

/// `softplus(x) = ln(1 + eˣ)`, `x` itself above 20 (torch's threshold; ggml's
/// `ssm_scan` uses the same).
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        crate::kernels::fast_exp(x).ln_1p()
    }
}

/// Copies columns `off..off + width` of each `stride`-wide row of `src` into `dst`
/// (`rows × width`, resized).
pub(crate) fn columns(src: &[f32], stride: usize, off: usize, width: usize, dst: &mut Vec<f32>) {
    let rows = src.len() / stride;
    dst.clear();
    dst.reserve(rows * width);
    for r in src.chunks_exact(stride) {
        dst.extend_from_slice(&r[off..off + width]);
    }
}

/// Rows per task of the row-wise steps of the forward pass (RoPE, the gated activation),
/// at most.
pub(crate) const ROWS_PER_TASK: usize = 16;

/// Rows per task of a row-wise step over `n` rows: [`ROWS_PER_TASK`], or fewer so that a
/// decode step's few rows still reach every thread.
pub(crate) fn rows_per_task(n: usize) -> usize {
    n.div_ceil(pool::threads()).clamp(1, ROWS_PER_TASK)
}

/// Elements per task of an element-wise step over `total` elements in rows of `width`:
/// [`ROWS_PER_TASK`] rows, or an even share per thread (at least 256 elements) when that
/// is less, so that even one row is split.
pub(crate) fn elems_per_task(total: usize, width: usize) -> usize {
    total
        .div_ceil(pool::threads())
        .max(256)
        .min(ROWS_PER_TASK * width)
        .max(1)
}
