//! Named intermediates: the forward pass's values at the points llama.cpp's graph names
//! them (`src/models/*.cpp`: `inp_embd`, `attn_norm`, `attn_out`, `ffn_inp`, `ffn_norm`,
//! `ffn_out`, `l_out`, `result_norm`), recorded for chosen layers and positions, to find
//! the first layer where frink departs from a reference (transformers' hidden states are
//! each layer's `l_out`).
//!
//! A model without taps ([`Model::set_taps`] never called) pays one branch per name per
//! layer; the recorded values are copies, the forward pass's arithmetic is unchanged.

use std::ops::RangeInclusive;
use std::sync::Mutex;

/// The names the forward pass records, in the order it computes them within a layer.
/// `inp_embd` (the embeddings after scaling and `token_embd_norm`) and `result_norm` (after
/// the output norm) are outside the layers.
pub const TAP_NAMES: [&str; 8] = [
    "inp_embd",
    "attn_norm",
    "attn_out",
    "ffn_inp",
    "ffn_norm",
    "ffn_out",
    "l_out",
    "result_norm",
];

/// One recorded intermediate: `rows` holds `positions.len()` rows of `width` values.
#[derive(Clone, Debug, PartialEq)]
pub struct Tapped {
    /// One of [`TAP_NAMES`].
    pub name: &'static str,
    /// The layer (`None` for `inp_embd` and `result_norm`).
    pub layer: Option<usize>,
    /// Each row's position in its sequence.
    pub positions: Vec<usize>,
    /// Values per row (`n_embd` for every name recorded today).
    pub width: usize,
    /// Row-major `[positions.len()][width]`.
    pub rows: Vec<f32>,
}

/// Which intermediates to record, and the records.
#[derive(Debug, Default)]
pub struct Taps {
    layers: Option<Vec<RangeInclusive<usize>>>,
    names: Option<Vec<String>>,
    positions: Option<Vec<RangeInclusive<usize>>>,
    records: Mutex<Vec<Tapped>>,
}

/// A list of indices and ranges, `0,2-5`; empty or `all`: every index.
///
/// # Errors
/// A part that is not an index or an `a-b` range with `a ≤ b`, named.
pub fn parse_ranges(s: &str) -> Result<Option<Vec<RangeInclusive<usize>>>, String> {
    let s = s.trim();
    if s.is_empty() || s == "all" {
        return Ok(None);
    }
    s.split(',')
        .map(|part| {
            let part = part.trim();
            let num = |t: &str| {
                t.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("`{part}` is not an index or a range a-b"))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(format!("`{part}`: the range is empty"));
                    }
                    Ok(a..=b)
                }
                None => num(part).map(|i| i..=i),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl Taps {
    /// Records the `names` (`None`: all of [`TAP_NAMES`]) of the chosen `layers` and
    /// `positions` (`None`: all; see [`parse_ranges`]).
    ///
    /// # Errors
    /// A name that is not in [`TAP_NAMES`], named with the list.
    pub fn new(
        names: Option<Vec<String>>,
        layers: Option<Vec<RangeInclusive<usize>>>,
        positions: Option<Vec<RangeInclusive<usize>>>,
    ) -> Result<Taps, String> {
        if let Some(bad) = names
            .iter()
            .flatten()
            .find(|n| !TAP_NAMES.contains(&n.as_str()))
        {
            return Err(format!(
                "no intermediate is named `{bad}` (the names: {})",
                TAP_NAMES.join(", ")
            ));
        }
        Ok(Taps {
            layers,
            names,
            positions,
            records: Mutex::new(Vec::new()),
        })
    }

    /// Every intermediate of every layer and position.
    pub fn all() -> Taps {
        Taps::default()
    }

    /// Whether `name` of `layer` is recorded.
    pub(crate) fn wants(&self, name: &str, layer: Option<usize>) -> bool {
        let named = self
            .names
            .as_ref()
            .is_none_or(|ns| ns.iter().any(|n| n == name));
        let layered = match (layer, &self.layers) {
            (Some(l), Some(ls)) => ls.iter().any(|r| r.contains(&l)),
            _ => true,
        };
        named && layered
    }

    /// Records `values` (`pos.len()` rows of `width`) as `name` of `layer`, keeping the
    /// chosen positions.
    pub(crate) fn record(
        &self,
        name: &'static str,
        layer: Option<usize>,
        pos: &[usize],
        values: &[f32],
    ) {
        if !self.wants(name, layer) || pos.is_empty() {
            return;
        }
        let width = values.len() / pos.len();
        let mut kept = Tapped {
            name,
            layer,
            positions: Vec::new(),
            width,
            rows: Vec::new(),
        };
        for (row, &p) in values.chunks_exact(width).zip(pos) {
            if self
                .positions
                .as_ref()
                .is_none_or(|ps| ps.iter().any(|r| r.contains(&p)))
            {
                kept.positions.push(p);
                kept.rows.extend_from_slice(row);
            }
        }
        if !kept.positions.is_empty() {
            self.records
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(kept);
        }
    }

    /// The records so far, in the order they were computed; the list is emptied.
    pub fn take(&self) -> Vec<Tapped> {
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The first layer whose `l_out` departs from the reference's: `reference[i]` is layer
/// `i`'s output (`n_tokens × n_embd`, transformers' `hidden_states[i + 1]`), and a layer
/// departs when `max|Δ| / max|ref|` over its rows passes `tolerance`. Returns each
/// compared layer's error and the first departing layer.
pub fn first_departure(
    tapped: &[Tapped],
    reference: &[Vec<f32>],
    tolerance: f32,
) -> (Vec<(usize, f32)>, Option<usize>) {
    let mut errors = Vec::new();
    for t in tapped.iter().filter(|t| t.name == "l_out") {
        let Some(layer) = t.layer else { continue };
        let Some(want) = reference.get(layer) else {
            continue;
        };
        let (mut diff, mut scale) = (0f32, 0f32);
        for (ri, &p) in t.positions.iter().enumerate() {
            let got = &t.rows[ri * t.width..(ri + 1) * t.width];
            let Some(r) = want.get(p * t.width..(p + 1) * t.width) else {
                continue;
            };
            for (a, b) in got.iter().zip(r) {
                // (`f32::max` drops a NaN: a NaN row is an infinite error.)
                let dv = (a - b).abs();
                diff = if dv.is_nan() {
                    f32::INFINITY
                } else {
                    diff.max(dv)
                };
                scale = scale.max(b.abs());
            }
        }
        errors.push((layer, if scale > 0.0 { diff / scale } else { diff }));
    }
    errors.sort_by_key(|e| e.0);
    let first = errors
        .iter()
        .find(|(_, e)| e.is_nan() || *e > tolerance)
        .map(|(l, _)| *l);
    (errors, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_names_are_parsed_or_refused_by_name() {
        assert_eq!(parse_ranges("").unwrap(), None);
        assert_eq!(parse_ranges("all").unwrap(), None);
        assert_eq!(parse_ranges("0,2-3").unwrap(), Some(vec![0..=0, 2..=3]));
        assert!(parse_ranges("3-1").unwrap_err().contains("3-1"));
        assert!(parse_ranges("x").unwrap_err().contains("`x`"));
        let e = Taps::new(Some(vec!["q".into()]), None, None).unwrap_err();
        assert!(e.contains("`q`") && e.contains("l_out"), "{e}");
    }

    #[test]
    fn only_the_chosen_layers_names_and_positions_are_kept() {
        let taps = Taps::new(
            Some(vec!["l_out".into()]),
            parse_ranges("1").unwrap(),
            parse_ranges("1-2").unwrap(),
        )
        .unwrap();
        let values: Vec<f32> = (0..8).map(|v| v as f32).collect(); // 4 rows of 2
        taps.record("l_out", Some(0), &[0, 1, 2, 3], &values);
        taps.record("attn_norm", Some(1), &[0, 1, 2, 3], &values);
        taps.record("l_out", Some(1), &[0, 1, 2, 3], &values);
        let got = taps.take();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].positions, vec![1, 2]);
        assert_eq!(got[0].rows, vec![2.0, 3.0, 4.0, 5.0]);
        assert!(taps.take().is_empty());
    }

    #[test]
    fn the_first_departing_layer_is_found() {
        let row = |v: f32| vec![v, 1.0];
        let tapped: Vec<Tapped> = (0..3)
            .map(|l| Tapped {
                name: "l_out",
                layer: Some(l),
                positions: vec![0],
                width: 2,
                rows: row(if l == 2 { 5.0 } else { 1.0 }),
            })
            .collect();
        let reference = vec![row(1.0), row(1.0), row(1.0)];
        let (errors, first) = first_departure(&tapped, &reference, 1e-4);
        assert_eq!(first, Some(2));
        assert_eq!(errors[0], (0, 0.0));
        // A NaN departs too.
        let mut nan = tapped.clone();
        nan[1].rows[0] = f32::NAN;
        assert_eq!(first_departure(&nan, &reference, 1e-4).1, Some(1));
    }
}
