//! Typed access to a file's `{arch}.*` keys (errors name the key; every count read is
//! remembered), the projection widths derived from those counts with the keys they come
//! from, and small rules of the layer layout.

use frink_gguf::{GgufFile, MetaValue};

use super::{MlaConfig, MoeConfig, SizeSources, LAYOUT_KEYS};
use crate::error::{ModelError, Result};

/// Typed access to `{arch}.*` keys with the error naming the key.
pub(super) struct Keys<'a> {
    pub(super) f: &'a GgufFile,
    pub(super) arch: &'a str,
    /// Every count read so far (full key, value): what tensor shapes are checked against.
    pub(super) counts: std::cell::RefCell<Vec<(String, usize)>>,
}

impl Keys<'_> {
    pub(super) fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    pub(super) fn get(&self, suffix: &str) -> Option<&MetaValue> {
        self.f.get(&self.key(suffix))
    }

    pub(super) fn err(&self, suffix: &str, detail: impl Into<String>) -> ModelError {
        ModelError::Metadata {
            key: self.key(suffix),
            detail: detail.into(),
        }
    }

    /// A positive count. Per-layer arrays (llama.cpp `get_key_or_arr`) are accepted when
    /// every layer has the same value; differing values are refused, not averaged.
    pub(super) fn usize_opt(&self, suffix: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(suffix) else {
            return Ok(None);
        };
        if let Some(a) = v.as_array() {
            let vals = a
                .to_i64_vec()
                .ok_or_else(|| self.err(suffix, "array is not of integers"))?;
            return match vals.first() {
                Some(&first) if vals.iter().all(|&x| x == first) && first >= 0 => {
                    self.counts
                        .borrow_mut()
                        .push((self.key(suffix), first as usize));
                    Ok(Some(first as usize))
                }
                _ => Err(ModelError::Unsupported(format!(
                    "{} differs per layer ({vals:?})",
                    self.key(suffix)
                ))),
            };
        }
        let n = v
            .as_u64()
            .ok_or_else(|| self.err(suffix, format!("expected an unsigned integer, found {v}")))?
            as usize;
        self.counts.borrow_mut().push((self.key(suffix), n));
        Ok(Some(n))
    }

    /// An array of one bool per layer, if the file has the key.
    pub(super) fn bools_per_layer(
        &self,
        suffix: &str,
        n_layer: usize,
    ) -> Result<Option<Vec<bool>>> {
        let Some(v) = self.get(suffix) else {
            return Ok(None);
        };
        let a = v
            .as_array()
            .ok_or_else(|| self.err(suffix, "expected an array of bools"))?;
        let flags: Option<Vec<bool>> = (0..a.len()).map(|i| a.get(i)?.as_bool()).collect();
        let flags = flags.ok_or_else(|| self.err(suffix, "expected bools"))?;
        self.per_layer_len(suffix, flags.len(), n_layer)?;
        Ok(Some(flags))
    }

    /// A count per layer: one value for all (a scalar, or an array of equal values) or
    /// an array of one value per layer, each recorded as a size tensors may have.
    pub(super) fn usize_per_layer(&self, suffix: &str, n_layer: usize) -> Result<Vec<usize>> {
        let v = self
            .get(suffix)
            .ok_or_else(|| self.err(suffix, "missing"))?;
        let Some(a) = v.as_array() else {
            return Ok(vec![self.usize(suffix)?; n_layer]);
        };
        let vals = a
            .to_i64_vec()
            .filter(|v| v.iter().all(|&x| x >= 0))
            .ok_or_else(|| self.err(suffix, "expected counts"))?;
        self.per_layer_len(suffix, vals.len(), n_layer)?;
        let mut counts = self.counts.borrow_mut();
        for &x in &vals {
            if !counts
                .iter()
                .any(|(k, c)| *k == self.key(suffix) && *c == x as usize)
            {
                counts.push((self.key(suffix), x as usize));
            }
        }
        Ok(vals.into_iter().map(|x| x as usize).collect())
    }

    pub(super) fn usize(&self, suffix: &str) -> Result<usize> {
        self.usize_opt(suffix)?
            .ok_or_else(|| self.err(suffix, "missing"))
    }

    /// A per-layer array `suffix` of `len` values must have one per layer.
    pub(super) fn per_layer_len(&self, suffix: &str, len: usize, n_layer: usize) -> Result<()> {
        if len == n_layer {
            return Ok(());
        }
        Err(self.err(
            suffix,
            format!(
                "{len} values for {n_layer} layers ({})",
                self.key("block_count")
            ),
        ))
    }

    /// A finite number (no hyperparameter is NaN or infinite).
    pub(super) fn f32_opt(&self, suffix: &str) -> Result<Option<f32>> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => match v.as_f32() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                Some(x) => Err(self.err(suffix, format!("{x} is not a finite number"))),
                None => Err(self.err(suffix, format!("expected a number, found {v}"))),
            },
        }
    }

    /// A number within `lo ..= hi` (RoPE's base and factors: outside a sane range their
    /// angles or magnitudes overflow to NaN logits).
    pub(super) fn f32_in(&self, suffix: &str, lo: f32, hi: f32) -> Result<Option<f32>> {
        match self.f32_opt(suffix)? {
            Some(x) if !(lo..=hi).contains(&x) => {
                let show = crate::overrides::show;
                Err(self.err(
                    suffix,
                    format!("{} is outside {} ..= {}", show(x), show(lo), show(hi)),
                ))
            }
            x => Ok(x),
        }
    }

    /// A finite number greater than zero (an epsilon, a RoPE base, a scale).
    pub(super) fn f32_pos_opt(&self, suffix: &str) -> Result<Option<f32>> {
        match self.f32_opt(suffix)? {
            Some(x) if x <= 0.0 => Err(self.err(suffix, format!("{x} must be positive"))),
            x => Ok(x),
        }
    }
}

/// The derived sizes [`size_sources`] spells out.
pub(super) struct SizeInputs<'a> {
    pub(super) attention: bool,
    pub(super) n_head: usize,
    pub(super) n_head_kv: usize,
    pub(super) head_dim_k: usize,
    pub(super) head_dim_v: usize,
    /// The windowed layers' head sizes ([`crate::arch::ArchSpec::swa_geometry`]).
    pub(super) head_dim_k_swa: usize,
    pub(super) head_dim_v_swa: usize,
    pub(super) moe: Option<&'a MoeConfig>,
    pub(super) mla: Option<&'a MlaConfig>,
}

/// The counts `k` read and the projection widths derived from them, each with its keys.
pub(super) fn size_sources(k: &Keys, d: &SizeInputs) -> SizeSources {
    let counts = k.counts.borrow();
    let value = |suffix: &str| {
        counts
            .iter()
            .find(|(key, _)| *key == k.key(suffix))
            .map(|&(_, v)| v)
    };
    let read = |suffix: &str| value(suffix).is_some();
    let mut sizes: Vec<(usize, String)> = Vec::new();
    // Each (value, key) once: a per-layer array gives one entry per distinct value.
    for (key, v) in counts.iter() {
        if !sizes.iter().any(|(sv, from)| from == key && sv == v) {
            sizes.push((*v, key.clone()));
        }
    }
    // Gemma 4's per-layer embeddings: a width per layer, all layers in one row.
    if let (Some(l), Some(p)) = (
        value("block_count"),
        value("embedding_length_per_layer_input"),
    ) {
        sizes.push((
            l * p,
            format!(
                "{} × {}",
                k.key("block_count"),
                k.key("embedding_length_per_layer_input")
            ),
        ));
    }
    // Fused pairs: gate and up in one matrix (phi3), Mamba's x and z.
    for suffix in ["feed_forward_length", "ssm.inner_size"] {
        if let Some(v) = value(suffix) {
            sizes.push((2 * v, format!("2 × {}", k.key(suffix))));
        }
    }
    let layout = sizes
        .iter()
        .filter(|(_, key)| LAYOUT_KEYS.iter().any(|s| *key == k.key(s)))
        .map(|(v, key)| format!("{key} = {v}"))
        .collect();
    if d.attention {
        let hdk = match read("attention.key_length") {
            true => k.key("attention.key_length"),
            false => format!(
                "{} / {}",
                k.key("embedding_length"),
                k.key("attention.head_count")
            ),
        };
        let hdv = match read("attention.value_length") {
            true => k.key("attention.value_length"),
            false => hdk.clone(),
        };
        let (h, kv) = (
            k.key("attention.head_count"),
            k.key("attention.head_count_kv"),
        );
        sizes.extend([
            (d.head_dim_k, hdk.clone()),
            (d.head_dim_v, hdv.clone()),
            (d.n_head * d.head_dim_k, format!("{h} × {hdk}")),
            (d.n_head_kv * d.head_dim_k, format!("{kv} × {hdk}")),
            (d.n_head_kv * d.head_dim_v, format!("{kv} × {hdv}")),
            (d.n_head * d.head_dim_v, format!("{h} × {hdv}")),
        ]);
        // Gemma 4's windowed layers' own head sizes.
        if read("attention.key_length_swa") || read("attention.value_length_swa") {
            let hdk = k.key("attention.key_length_swa");
            let hdv = match read("attention.value_length_swa") {
                true => k.key("attention.value_length_swa"),
                false => hdk.clone(),
            };
            let (hk, hv) = (d.head_dim_k_swa, d.head_dim_v_swa);
            sizes.extend([
                (d.n_head * hk, format!("{h} × {hdk}")),
                (d.n_head_kv * hk, format!("{kv} × {hdk}")),
                (d.n_head_kv * hv, format!("{kv} × {hdv}")),
                (d.n_head * hv, format!("{h} × {hdv}")),
            ]);
        }
    }
    if let Some(m) = d.moe {
        if let Some(c) = m.n_shared {
            sizes.push((
                c * m.n_ff_exp,
                format!(
                    "{} × {}",
                    k.key("expert_shared_count"),
                    k.key("expert_feed_forward_length")
                ),
            ));
        }
        if value("expert_feed_forward_length").unwrap_or(0) == 0 {
            sizes.push((
                m.n_ff_exp,
                format!(
                    "{} (absent or 0: {})",
                    k.key("expert_feed_forward_length"),
                    k.key("feed_forward_length")
                ),
            ));
        }
    }
    if let Some(m) = d.mla {
        let h = k.key("attention.head_count");
        sizes.extend([
            (
                d.n_head * m.qk_head_dim,
                format!("{h} × {}", k.key("attention.key_length_mla")),
            ),
            (
                d.n_head * m.v_head_dim,
                format!("{h} × {}", k.key("attention.value_length_mla")),
            ),
        ]);
    }
    SizeSources { sizes, layout }
}

/// Whether layer `il` is windowed (or chunked) in a pattern of `period` layers whose last
/// is global (llama.cpp `hparams.set_swa_pattern(period)`).
pub(super) fn windowed_in_period(il: usize, period: usize) -> bool {
    il % period < period - 1
}

/// The number of layers the tensors of `f` hold: one more than the largest `N` of a
/// `blk.N.` tensor name (0 without any).
pub(super) fn layers_in_tensors(f: &GgufFile) -> usize {
    f.tensor_infos()
        .iter()
        .filter_map(|t| {
            t.name
                .strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}
